"""The Kafka listener of a node in a cluster of topic groups: each topic's requests go to its
group.

A Kafka topic NAME lives wholly in the group NAME hashes to
(:func:`messaging.placement.group_of_name`; its partitions' ids are that group's). A node
serves the topics of the groups it holds and has caught up with (one :class:`Face` each):

- Produce, Fetch and ListOffsets of another group's partitions answer NOT_LEADER_OR_FOLLOWER,
  and the client reads Metadata again;
- Metadata names this node the leader of its own groups' partitions; for the others it asks
  a holder (:mod:`messaging.kafka.forward`), whose answer names that holder, so a client
  goes to the node that serves each partition (the holders with topic groups);
- CreateTopics, DeleteTopics and DescribeConfigs of another group's topics, and a consumer
  group's OffsetCommit and OffsetFetch for them, are asked of a holder. The consumer group's
  coordinator (any node, by the group's name) checks the member and generation first, then
  hands the holder a plain commit (generation -1), which a holder always takes.

A request forwarded here is not forwarded again: what this node does not hold is an error
code, which the client acts on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from messaging.kafka import protocol as p
from messaging.kafka.access import allowed
from messaging.kafka.admin import BROKER_RESOURCE, TOPIC_RESOURCE, cluster_metadata
from messaging.kafka.face import Face
from messaging.kafka.fetch import long_poll, partition_answer
from messaging.kafka.forward import Forwarder, ForwardError
from messaging.kafka.groups import Coordinator
from messaging.kafka.nodes import Nodes
from messaging.kafka.offsets import commit_check
from messaging.placement import group_of_name

log = logging.getLogger(__name__)

T = TypeVar("T")
#: The APIs routed by topic (the others do not name topics).
ROUTED = frozenset({p.PRODUCE, p.FETCH, p.LIST_OFFSETS, p.METADATA, p.CREATE_TOPICS,
                    p.DELETE_TOPICS, p.DESCRIBE_CONFIGS, p.OFFSET_COMMIT, p.OFFSET_FETCH})


class GroupRouter:
    """Sends each topic of a request to its group's face here, or asks a holder."""

    def __init__(self, groups: int, face_of: Callable[[int], Face | None],
                 holder_of: Callable[[int], str | None], nodes: Nodes,
                 coordinator: Coordinator, forwarder: Forwarder) -> None:
        self.groups = groups
        #: The face of a group this node holds and has caught up with (None: it has not).
        self.face_of = face_of
        #: The Kafka address of another live node that holds a group (None: none known).
        self.holder_of = holder_of
        self.nodes = nodes
        self.coordinator = coordinator
        self.forwarder = forwarder

    def group(self, name: str) -> int:
        """The group a Kafka topic lives in."""
        return group_of_name(name, self.groups)

    def _split(self, items: Iterable[T], name_of: Callable[[T], str]) -> dict[int, list[T]]:
        split: dict[int, list[T]] = {}
        for item in items:
            split.setdefault(self.group(name_of(item)), []).append(item)
        return split

    async def dispatch(self, key: int, version: int, request: dict[str, Any],
                       password: str | None, forwarded: bool) -> dict[str, Any] | None:
        """The answer to one request of a :data:`ROUTED` API."""
        call = _Call(self, version, password, forwarded)
        handlers: dict[int, Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]] = {
            p.PRODUCE: call.produce, p.FETCH: call.fetch, p.LIST_OFFSETS: call.list_offsets,
            p.METADATA: call.metadata, p.CREATE_TOPICS: call.create_topics,
            p.DELETE_TOPICS: call.delete_topics, p.DESCRIBE_CONFIGS: call.describe_configs,
            p.OFFSET_COMMIT: call.offset_commit, p.OFFSET_FETCH: call.offset_fetch}
        return await handlers[key](request)


class _Call:
    """One routed request: who asked (the token, whether another node did) and its version."""

    def __init__(self, router: GroupRouter, version: int, password: str | None,
                 forwarded: bool) -> None:
        self.router = router
        self.version = version
        self.password = password
        self.forwarded = forwarded

    async def _ask(self, group: int, api_key: int, body: dict[str, Any],
                   ) -> dict[str, Any] | str:
        """A holder's answer, or why there is none."""
        if self.forwarded:
            return f"this node does not hold group {group} (a forwarded request)"
        holder = self.router.holder_of(group)
        if holder is None:
            return f"no live node serves group {group} to Kafka clients now"
        try:
            return await self.router.forwarder.ask(holder, api_key, self.version, body,
                                                   self.password)
        except ForwardError as err:
            log.info("Kafka request for group %d not answered by %s: %s", group, holder, err)
            return f"group {group}'s holder {holder} did not answer: {err}"

    async def _each(self, split: dict[int, list[T]],
                    run: Callable[[int, list[T]], Any]) -> list[Any]:
        """``run`` for every group of a split, side by side; their results in one list."""
        results = await asyncio.gather(*(run(group, items) for group, items in split.items()))
        return [item for result in results for item in result]

    # -- records ----------------------------------------------------------------------------

    async def produce(self, request: dict[str, Any]) -> dict[str, Any] | None:
        async def run(group: int, topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
            face = self.router.face_of(group)
            if face is None:
                return [{"topic": t["topic"], "partitions": [
                    {"partition": part["partition"], "error_code": p.NOT_LEADER_OR_FOLLOWER,
                     "offset": -1, "timestamp": -1, "log_start_offset": -1,
                     "error_message": f"group {group} is served by another node"}
                    for part in t["partitions"]]} for t in topics]
            answer = await face.producing.produce({**request, "topics": topics})
            return [] if answer is None else answer["topics"]

        topics = await self._each(self.router._split(request["topics"], _topic), run)
        return None if request["required_acks"] == 0 else {"topics": topics}

    async def fetch(self, request: dict[str, Any]) -> dict[str, Any]:
        """Each group's partitions read by its face, one group after another against the
        request's ``max_bytes``; a long-poll over several groups waits for ``min_bytes`` in
        all of them together, and a commit to any of them wakes it."""
        split = self.router._split(request["topics"], _topic)
        return await long_poll(request, lambda: self._read_groups(split, request),
                               lambda timeout: self._wait_groups(split, request, timeout))

    async def _read_groups(self, split: dict[int, list[dict[str, Any]]],
                           request: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
        topics: list[dict[str, Any]] = []
        spent = 0
        for group, items in split.items():
            face = self.router.face_of(group)
            if face is None:
                topics.extend({"topics": t["topic"], "partitions": [
                    partition_answer(part["partition"], p.NOT_LEADER_OR_FOLLOWER)
                    for part in t["partitions"]]} for t in items)
                continue
            found, size = await face.fetching.read({**request, "topics": items}, spent)
            topics.extend(found)
            spent += size
        return topics, spent

    async def _wait_groups(self, split: dict[int, list[dict[str, Any]]],
                           request: dict[str, Any], timeout: float) -> bool:
        """Wait for a commit to any partition of the groups served here; False when the time
        ran out (or a wait failed: the answer is what there is)."""
        faces = [(face, items) for group, items in split.items()
                 if (face := self.router.face_of(group)) is not None]
        if not faces:
            await asyncio.sleep(timeout)
            return False
        waits = [asyncio.ensure_future(face.fetching.wait_for_more(
            {**request, "topics": items}, timeout)) for face, items in faces]
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            outcomes = await asyncio.gather(*waits, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                log.warning("waiting for records of a Kafka fetch failed: %s", outcome)
                return False
        return any(task.result() for task in done if not task.cancelled())

    async def list_offsets(self, request: dict[str, Any]) -> dict[str, Any]:
        async def run(group: int, topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
            face = self.router.face_of(group)
            if face is None:
                return [{"topic": t["topic"], "partitions": [
                    {"partition": part["partition"], "error_code": p.NOT_LEADER_OR_FOLLOWER,
                     "timestamp": -1, "offset": -1} for part in t["partitions"]]}
                    for t in topics]
            return list((await face.fetching.list_offsets({**request, "topics": topics}))[
                "topics"])

        return {"topics": await self._each(self.router._split(request["topics"], _topic), run)}

    # -- metadata and topics ----------------------------------------------------------------

    async def metadata(self, request: dict[str, Any]) -> dict[str, Any]:
        router = self.router
        asked = request.get("topics")
        every = asked is None or (self.version == 0 and not asked)
        split: dict[int, list[str]] = (
            {key: [] for key in range(router.groups)} if every
            else router._split(asked or [], str))
        create = not every and request.get("allow_auto_topic_creation", True)

        async def run(group: int, names: list[str]) -> list[dict[str, Any]]:
            face = router.face_of(group)
            if face is not None:
                if every:
                    names = [name for name in face.topics.names() if allowed("read", name)]
                return [await face.admin.topic_metadata(name, create and face.admin.auto_create)
                        for name in names]
            answer = await self._ask(group, p.METADATA, request if every
                                     else {**request, "topics": names})
            if isinstance(answer, str):
                return [] if every else [
                    {"error_code": p.LEADER_NOT_AVAILABLE, "topic": name, "is_internal": False,
                     "partitions": []} for name in names]
            return [t for t in answer["topics"] if router.group(t["topic"]) == group]

        return {**cluster_metadata(router.nodes), "topics": await self._each(split, run)}

    async def _here_or_asked(self, group: int, api_key: int, body: dict[str, Any],
                             here: Callable[[Face], Awaitable[dict[str, Any]]], field: str,
                             failed: Callable[[str], list[dict[str, Any]]],
                             ) -> list[dict[str, Any]]:
        """``field`` of the answer of this node's face of ``group`` (``here``), or of a
        holder's; ``failed(why)`` when no holder answered."""
        face = self.router.face_of(group)
        answer = await (here(face) if face is not None else self._ask(group, api_key, body))
        return failed(answer) if isinstance(answer, str) else list(answer[field])

    async def create_topics(self, request: dict[str, Any]) -> dict[str, Any]:
        async def run(group: int, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            body = {**request, "create_topic_requests": items}
            return await self._here_or_asked(
                group, p.CREATE_TOPICS, body, lambda face: face.admin.create_topics(body),
                "topic_errors", lambda why: [{"topic": item["topic"],
                                              "error_code": p.NOT_CONTROLLER,
                                              "error_message": why} for item in items])

        return {"topic_errors": await self._each(
            self.router._split(request["create_topic_requests"], _topic), run)}

    async def delete_topics(self, request: dict[str, Any]) -> dict[str, Any]:
        async def run(group: int, names: list[str]) -> list[dict[str, Any]]:
            body = {**request, "topics": names}
            return await self._here_or_asked(
                group, p.DELETE_TOPICS, body, lambda face: face.admin.delete_topics(body),
                "topic_error_codes", lambda _why: [{"topic": name, "error_code": p.NOT_CONTROLLER}
                                                   for name in names])

        return {"topic_error_codes": await self._each(
            self.router._split(request["topics"], str), run)}

    async def describe_configs(self, request: dict[str, Any]) -> dict[str, Any]:
        topics = [r for r in request["resources"] if r["resource_type"] == TOPIC_RESOURCE]
        others = [{"error_code": p.NONE if r["resource_type"] == BROKER_RESOURCE
                   else p.INVALID_REQUEST,
                   "error_message": None if r["resource_type"] == BROKER_RESOURCE
                   else f"resource type {r['resource_type']} is not described here",
                   "resource_type": r["resource_type"], "resource_name": r["resource_name"],
                   "config_entries": []}
                  for r in request["resources"] if r["resource_type"] != TOPIC_RESOURCE]

        async def run(group: int, resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
            body = {**request, "resources": resources}
            return await self._here_or_asked(
                group, p.DESCRIBE_CONFIGS, body, lambda face: face.admin.describe_configs(body),
                "resources", lambda why: [
                    {"error_code": p.LEADER_NOT_AVAILABLE, "error_message": why,
                     "resource_type": r["resource_type"], "resource_name": r["resource_name"],
                     "config_entries": []} for r in resources])

        found = await self._each(self.router._split(topics, lambda r: r["resource_name"]), run)
        return {"resources": [*found, *others]}

    # -- committed offsets ------------------------------------------------------------------

    async def offset_commit(self, request: dict[str, Any]) -> dict[str, Any]:
        router = self.router
        # Checked here whoever asks: a commit asked of this node by another (generation -1,
        # no member) passes, with the same token, what it passed there.
        code = commit_check(router.coordinator, router.nodes, request)

        def failed(topics: list[dict[str, Any]], error: int) -> list[dict[str, Any]]:
            return [{"topic": t["topic"], "partitions": [
                {"partition": part["partition"], "error_code": error}
                for part in t["partitions"]]} for t in topics]

        async def run(group: int, topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
            face = router.face_of(group)
            if face is not None:
                body = {**request, "topics": topics}
                return list((await face.offsets.commit_checked(body, code))["topics"])
            if code != p.NONE:
                return failed(topics, code)
            # checked here: the holder takes it as a plain commit
            answer = await self._ask(group, p.OFFSET_COMMIT, {
                **request, "topics": topics, "consumer_group_generation_id": -1,
                "consumer_id": ""})
            if isinstance(answer, str):
                return failed(topics, p.COORDINATOR_NOT_AVAILABLE)
            return list(answer["topics"])

        return {"topics": await self._each(router._split(request["topics"], _topic), run)}

    async def offset_fetch(self, request: dict[str, Any]) -> dict[str, Any]:
        router = self.router
        asked = request.get("topics")
        split: dict[int, list[dict[str, Any]]] = (
            {key: [] for key in range(router.groups)} if asked is None
            else router._split(asked, _topic))
        codes: list[int] = []

        async def run(group: int, topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
            body = {**request, "topics": None if asked is None else topics}
            face = router.face_of(group)
            answer: dict[str, Any] | str
            if face is not None:
                answer = await face.offsets.fetch(body)
            else:
                answer = await self._ask(group, p.OFFSET_FETCH, body)
            if isinstance(answer, str):  # the client asks again (v2 and later read this)
                codes.append(p.COORDINATOR_NOT_AVAILABLE)
                return [] if asked is None else [{"topic": t["topic"], "partitions": [
                    {"partition": part, "offset": -1, "metadata": "",
                     "error_code": p.COORDINATOR_NOT_AVAILABLE} for part in t["partitions"]]}
                    for t in topics]
            codes.append(answer.get("error_code", p.NONE))
            return [t for t in answer["topics"] if router.group(t["topic"]) == group]

        topics = await self._each(split, run)
        return {"topics": topics, "error_code": next((c for c in codes if c), p.NONE)}


def _topic(item: dict[str, Any]) -> str:
    name: str = item["topic"]
    return name
