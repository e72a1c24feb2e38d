"""Where a topic lives in a cluster of topic groups, and which nodes hold each group.

Pure functions of their arguments, shared by the server, the clients and the tests, so that
every node and every client computes the same answer from the same etcd state without a
leader deciding anything:

- a native topic (id below 2^63) belongs to group ``hash(id) mod G``; a named stream to
  ``hash(name) mod G``; the topic id of a named stream carries its group in bits 48–62
  (group g allocates ids from ``2^63 + g·2^48``), so its id alone names its group too;
- group g is held by R live nodes chosen by rendezvous hashing with bounded loads
  (:func:`assignment`): every node holds about G·R/N groups, and the same member list gives
  the same answer everywhere.

With G = 1 every topic is in group 0, stream ids start at 2^63 as they always did, and every
node holds the one group: the cluster of before groups existed.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable

#: Topic ids from here up belong to named streams (the Durable Streams protocol).
NAMED_TOPIC_BASE = 1 << 63
#: A named stream's id carries its group in the bits from here up (to bit 62).
GROUP_SHIFT = 48
#: The most groups a cluster may have (the group must fit the id's bits 48–62).
MAX_GROUPS = 1 << (63 - GROUP_SHIFT)


def _score(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def check_groups(groups: int) -> int:
    """``groups`` if it is a valid group count, else ValueError."""
    if not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"the number of groups must be from 1 to {MAX_GROUPS}, not {groups}")
    return groups


def group_of_topic(topic: int, groups: int) -> int:
    """The group a topic id belongs to (a named stream's id says it; a native id is hashed)."""
    if groups == 1:
        return 0
    if topic >= NAMED_TOPIC_BASE:
        return ((topic - NAMED_TOPIC_BASE) >> GROUP_SHIFT) % groups
    return _score(topic.to_bytes(8, "big")) % groups


def group_of_name(name: str, groups: int) -> int:
    """The group a named stream belongs to, from its name."""
    if groups == 1:
        return 0
    return _score(b"name:" + name.encode()) % groups


def first_named_topic(group: int) -> int:
    """The first topic id the catalog of ``group`` gives a named stream."""
    return NAMED_TOPIC_BASE + (group << GROUP_SHIFT)


def holders(group: int, nodes: Iterable[str], replicas: int, groups: int = 1) -> list[str]:
    """The nodes (URLs) that hold ``group`` of ``groups``, best first (see
    :func:`assignment`)."""
    return list(assignment(groups, tuple(sorted(set(nodes))), replicas)[group])


@functools.lru_cache(maxsize=64)
def assignment(groups: int, nodes: tuple[str, ...], replicas: int) -> tuple[tuple[str, ...], ...]:
    """Each group's holders: ``replicas`` nodes (all of them when there are fewer), chosen by
    rendezvous hashing with bounded loads. Group by group, the k-th takes the highest-scoring
    nodes that hold fewer than ⌈k·R/N⌉ groups so far (the least loaded others only when too
    few are under it), so no node holds much more than its share; the same nodes give the
    same answer on every node and client."""
    count = min(max(replicas, 1), len(nodes))
    if not count:
        return tuple(() for _ in range(groups))
    load = dict.fromkeys(nodes, 0)
    result = []
    for group in range(groups):
        # The bound grows with the groups placed so far, so loads stay even all the way:
        # a bound fixed at the end's share let the first nodes fill up early and left the
        # last groups only one node under it (15 groups, 3 nodes, R = 2 gave 13/10/7).
        bound = -(-(group + 1) * count // len(nodes))
        ranked = sorted(nodes, key=lambda url: (_score(b"%d:" % group + url.encode()), url),
                        reverse=True)
        chosen = [u for u in ranked if load[u] < bound][:count]
        rest = sorted((u for u in ranked if u not in chosen), key=lambda u: load[u])
        chosen += rest[:count - len(chosen)]
        for url in chosen:
            load[url] += 1
        result.append(tuple(chosen))
    return tuple(result)


def log_name(cluster: str, group: int, groups: int) -> str:
    """The name under ``/messaging/`` in etcd of one group's command log, nodes and
    checkpoint: the cluster's own name with one group (so a G = 1 cluster is unchanged)."""
    return cluster if groups == 1 else f"{cluster}~g{group}"
