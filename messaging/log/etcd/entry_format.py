"""Which log entry format a cluster writes, so that it upgrades node by node.

Each node announces the newest entry format it reads and writes (``entry_version`` in its
registration; a node of a release from before announcements reads up to version 2). The
cluster's *active* format is the value of ``/messaging/<cluster>/format`` (absent: version
2, the format every release since times reads), and every node writes entries in it only,
so during a rolling upgrade old and new nodes apply the same commands. It moves up by itself,
once every live node announces the newer format (any node may move it; repeating is
harmless), and never down: a node too old for the active format refuses to start, naming
both versions.

Versions: 1, no time; 2, the writer's time; 3, a CRC-32C over header and body; 4, pointer
entries (the intake lane: :mod:`messaging.log.etcd.intake`, used only once the cluster writes
format 4, so a node that could not read them never meets one).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from messaging.errors import ConfigError
from messaging.log.etcd.client import EtcdClient

log = logging.getLogger(__name__)

#: The newest entry format this code reads and writes.
ENTRY_VERSION = 4
#: The first format with pointer entries.
POINTER_VERSION = 4
#: The active format of a cluster that has recorded none (what the previous release writes).
BASE_VERSION = 2


def format_key(cluster: str) -> bytes:
    """The key holding ``cluster``'s active entry format."""
    return f"/messaging/{cluster}/format".encode()


def announced(info: Mapping[str, Any]) -> int:
    """The newest entry format a node's registration announces (BASE_VERSION: none)."""
    try:
        return int(info.get("entry_version", BASE_VERSION))
    except (TypeError, ValueError):
        return BASE_VERSION


async def active_version(client: EtcdClient, cluster: str) -> int:
    """The cluster's active entry format."""
    response = await client.get(format_key(cluster))
    return _version(response.kvs[0].value) if response.kvs else BASE_VERSION


def _version(value: bytes) -> int:
    """A recorded format (BASE_VERSION for a value that is not one)."""
    try:
        return int(value)
    except ValueError:
        return BASE_VERSION


def check_supported(cluster: str, active: int) -> None:
    """Refuse to run a node that cannot read what ``cluster`` writes."""
    if active > ENTRY_VERSION:
        raise ConfigError(f"cluster {cluster!r} writes log entries of format {active}; this "
                          f"node reads formats up to {ENTRY_VERSION}: run a newer messaging "
                          "on it")


async def advance(client: EtcdClient, cluster: str, active: int,
                  nodes: Iterable[Mapping[str, Any]]) -> int:
    """Move the active format up to ENTRY_VERSION when every live node announces it;
    returns the active format (never lower than ``active``)."""
    if active >= ENTRY_VERSION:
        return active
    if not all(announced(info) >= ENTRY_VERSION for info in nodes):
        return active
    stored = await client.put_if_absent(format_key(cluster), str(ENTRY_VERSION).encode())
    now = max(_version(stored), active)  # another node may have recorded it first
    log.info("cluster %s: every live node reads log entry format %d: writing it from now on",
             cluster, now)
    return now
