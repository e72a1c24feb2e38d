"""A node of a cluster of topic groups: which groups it holds, and one broker and command log
per held group.

Every node registers under ``/messaging/<cluster>/members/`` with a lease; every second it
reads the members and computes, for each group, its holders
(:func:`messaging.placement.holders`: the same answer on every node, no leader). For a group it
holds it runs a :class:`GroupStack`: a :class:`~messaging.broker.broker.Broker` on
``DATA/groups/<g>/`` and an :class:`~messaging.log.etcd.log.EtcdLog` of the group's own key
(``/messaging/<cluster>~g<g>/log``, in the group's etcd cluster). A new holder replays the group
from etcd, or installs a current holder's snapshot when etcd compacted what it needs, and
serves the group only once it has caught up (:meth:`GroupNode.ready`). A node that stops
holding a group stops its stack and keeps the files until the group's current holders have
all registered it durable past what this node had; then it deletes them. The last copy is
never deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from messaging.aio import cancel_and_wait
from messaging.broker.view import BrokerView
from messaging.config import BrokerConfig, EtcdSettings
from messaging.errors import (
    ClusterUnavailableError,
    ConfigError,
    DataDirectoryError,
    MessagingError,
)
from messaging.files import DELETING, lock_exclusive, read_json, remove_directory
from messaging.log.base import Log
from messaging.log.etcd.client import EtcdClient, describe, load_credentials, unavailable
from messaging.log.etcd.clock_check import CHECK_INTERVAL, ClockCheck
from messaging.log.etcd.intake import Intake
from messaging.log.etcd.log import CHECKPOINT, EtcdLog
from messaging.log.etcd.membership import Membership, nodes_prefix, read_nodes
from messaging.log.etcd.share import EtcdShare
from messaging.offload.service import ObjectStorage
from messaging.placement import check_groups, first_named_topic, holders, log_name
from messaging.quiet_log import RECURRING_LOG_INTERVAL, QuietLog
from messaging.stack.assemble import Stack, etcd_log, open_stack

log = logging.getLogger(__name__)

#: How often a node reads the members and moves groups (seconds).
PLACEMENT_INTERVAL = 1.0
#: At most this many extra member reads at start while the list is still changing.
SETTLE_READS = 6
#: How long a starting node waits for its groups to catch up before it serves anyway.
START_WAIT = 10.0
#: Where a cluster of groups keeps each group's data, under the data directory.
GROUPS_DIR = "groups"


def groups_key(cluster: str) -> bytes:
    """The etcd key that records a cluster's number of groups."""
    return f"/messaging/{cluster}/groups".encode()


async def record_groups(client: EtcdClient, cluster: str, groups: int) -> None:
    """Record ``groups`` for a new cluster, or check it against what the cluster recorded
    (:class:`ConfigError` when they differ: the count is fixed at creation)."""
    value = json.dumps({"groups": groups}).encode()
    failures: list[tuple[str, BaseException]] = []
    for i in range(len(client.endpoints)):
        client.current = i
        try:
            stored = await client.put_if_absent(groups_key(cluster), value)
            break
        except grpc.aio.AioRpcError as err:
            failures.append((client.endpoints[i], err))
    else:  # etcd refusing this node's credentials is said first, with the fix
        raise unavailable(f"cannot reach etcd to read cluster {cluster!r}'s number of groups",
                          failures)
    try:
        recorded = int(json.loads(stored)["groups"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"etcd key {groups_key(cluster).decode()} is not ours: "
                          f"{stored[:80]!r}") from err
    if recorded != groups:
        raise ConfigError(f"cluster {cluster!r} was created with --groups {recorded}; this node "
                          f"was started with --groups {groups}: start it with --groups "
                          f"{recorded} (the number of groups is fixed when a cluster is created)")


async def check_single_group(settings: EtcdSettings) -> None:
    """A node started without --groups (one group) refuses a cluster created with more; an
    etcd it cannot reach now is left to the log, which waits for it."""
    loop = asyncio.get_running_loop()
    client = EtcdClient(settings, await loop.run_in_executor(None, load_credentials, settings))
    try:
        await record_groups(client, settings.cluster, 1)
    except ClusterUnavailableError as err:
        log.info("could not check the cluster's number of groups yet: %s", err)
    finally:
        await client.close()


#: One held group: its broker (state machine and files), its command log (an
#: :class:`EtcdLog`) and uploader, assembled by :func:`messaging.stack.assemble.open_stack`.
GroupStack = Stack[EtcdLog]


class GroupNode:
    """The groups this node holds, kept in line with the members etcd lists."""

    def __init__(self, config: BrokerConfig, url: str, settings: EtcdSettings,
                 storage: ObjectStorage | None = None) -> None:
        self.config = config
        #: With --object-store: the store each held group's broker uses.
        self.storage = storage
        self.url = url
        self.settings = settings
        self.cluster = settings.cluster
        self.groups = check_groups(config.groups)
        self.replicas = config.replicas
        self._endpoints = config.group_endpoints()
        self._client = EtcdClient(settings)
        self._credentials: grpc.ChannelCredentials | None = None
        self._clients: dict[tuple[str, ...], EtcdClient] = {}
        #: One share (watch stream, quorum reads) per etcd cluster, for the logs of every
        #: group held there.
        self._shares: dict[tuple[str, ...], EtcdShare] = {}
        self._members = Membership(self._client, self.cluster, url, lambda: 0, 1 << 62,
                                   kind="members")
        #: This node's clock against every member's, checked once for all its groups' logs.
        self.clock = ClockCheck(url, settings.max_clock_offset_ms, self.members,
                                ca=str(config.peer_ca) if config.peer_ca else None)
        self._clock_task: asyncio.Task[None] | None = None
        #: With --object-store: the intake lane, shared by every held group's log.
        self.intake = Intake.for_config(config, storage.store if storage is not None else None)
        self.stacks: dict[int, GroupStack] = {}
        #: Groups this node stopped holding whose files it keeps: group → revision it had.
        self.retired: dict[int, int] = {}
        self._starting: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self._lock_fd: int | None = None
        self._quiet = QuietLog(log, RECURRING_LOG_INTERVAL)
        #: Awaited with a group's number before its stack stops (the HTTP layer drops its
        #: handlers).
        self.on_stopped: list[Callable[[int], Awaitable[None]]] = []

    # -- where things are -------------------------------------------------------------------

    def group_settings(self, group: int) -> EtcdSettings:
        """How to reach the etcd cluster of ``group``'s command log."""
        return replace(self.settings, cluster=log_name(self.cluster, group, self.groups),
                       endpoints=self._endpoints.get(group, self.settings.endpoints))

    def members(self) -> list[str]:
        """The live nodes of the cluster (this one included)."""
        return self._members.urls()

    def holders(self, group: int) -> list[str]:
        """The nodes that hold ``group`` now, best first."""
        return holders(group, self.members(), self.replicas, self.groups)

    def ready(self, group: int, *, read: bool = True) -> GroupStack | None:
        """The stack of ``group`` when this node holds it and may serve it: for a read, once
        it has caught up; for a write, once its log takes writes (the answer waits until
        this node has applied the write, after whatever came before it)."""
        stack = self.stacks.get(group)
        if stack is None:
            return None
        if read:
            return stack if stack.log.caught_up() else None
        return stack if stack.log.not_ready() is None else None

    def held(self, group: int) -> tuple[BrokerView, Log] | None:
        """The broker and log of ``group`` when this node holds it and has caught up (the
        Kafka listener's view of the node)."""
        stack = self.ready(group)
        return None if stack is None else (stack.broker, stack.log)

    def announce_kafka(self, address: str) -> None:
        """Register this node's Kafka listener with its membership (others forward to it)."""
        self._members.announce_kafka(address)

    def kafka_addresses(self) -> list[str]:
        """The Kafka listeners of the live nodes."""
        return self._members.kafka_addresses()

    def kafka_holder(self, group: int) -> str | None:
        """The Kafka listener of another live node that holds ``group``, best first (None:
        none has one)."""
        for url in self.holders(group):
            info = self._members.nodes.get(url)
            if url != self.url and info is not None and info.get("kafka"):
                return str(info["kafka"])
        return None

    def not_ready(self) -> str | None:
        """Why this node cannot serve every group it holds (None: it can)."""
        for group in sorted(self.stacks):
            stack = self.stacks[group]
            if not stack.log.caught_up():
                why = stack.log.not_ready() or "catching up"
                return f"group {group}: {why}"
        missing = [g for g in range(self.groups) if self.url in self.holders(g)
                   and g not in self.stacks]
        if missing:
            return f"groups {', '.join(map(str, missing))} are starting"
        return None

    def path(self, group: int) -> Path:
        """The data directory of ``group`` on this node."""
        return self.config.data / GROUPS_DIR / str(group)

    def describe(self) -> dict[str, Any]:
        """Each group, its holders with the revisions this node knows, and its etcd."""
        groups = []
        for group in range(self.groups):
            stack = self.stacks.get(group)
            groups.append({
                "group": group,
                "holders": self.holders(group),
                "etcd": list(self.group_settings(group).endpoints),
                "log": log_name(self.cluster, group, self.groups),
                "here": None if stack is None else self._progress(stack),
            })
        return {"cluster": self.cluster, "groups": groups, "replicas": self.replicas,
                "members": self.members(), "node": self.url}

    def etcd_diagnostics(self) -> list[dict[str, Any]]:
        """Each etcd cluster this node's groups use: its endpoints, the one watch stream and
        the gathered quorum reads the groups held there share."""
        return [share.diagnostics() for share in self._shares.values()]

    @staticmethod
    def _progress(stack: GroupStack) -> dict[str, Any]:
        """How far this node is in a group it holds, and the durable revision each node
        applying the group registered."""
        diagnostics = stack.log.diagnostics()
        return {"applied_revision": stack.log.applied_revision(),
                "caught_up": stack.log.caught_up(), "lag": diagnostics["lag"],
                "durable_revisions": diagnostics["nodes"]}

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the group count, register, start the held groups, then keep them in line."""
        loop = asyncio.get_running_loop()
        self._lock_fd = await loop.run_in_executor(None, self._lock)
        self._credentials = await loop.run_in_executor(None, load_credentials, self.settings)
        self._client = EtcdClient(self.settings, self._credentials)
        self._members.client = self._client
        try:
            await record_groups(self._client, self.cluster, self.groups)
            await self._members.register()
            await self._settle()
            await self._first_clock_check()
            self.retired = await loop.run_in_executor(
                None, find_retired, self.config.data / GROUPS_DIR, self.groups)
            await self._place()
            await self._caught_up(START_WAIT)
        except BaseException:
            await self.close()
            raise
        self._task = asyncio.create_task(self._run(), name="messaging-groups")
        self._clock_task = asyncio.create_task(self._check_clock(), name="messaging-clock-check")
        log.info("cluster %s: %d groups, %d replicas; this node holds %s", self.cluster,
                 self.groups, self.replicas, self._held_text())

    async def _first_clock_check(self) -> None:
        """Check this node's clock against the members before any group takes a write, so
        a node started with its clock far off never forms a command. Peers that do not
        answer yet are no reason to stop: the periodic check follows within a second."""
        await self.clock.step()
        problem = self.clock.problem()
        if problem is not None:
            log.error("cluster %s: %s", self.cluster, problem)

    async def _check_clock(self) -> None:
        """Check the clock every CHECK_INTERVAL (a failure is logged, never fatal)."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            try:
                await self.clock.step()
            except Exception:  # a bug: logged, and the check goes on next time
                self._quiet.log("clock check", logging.ERROR, "checking the clock failed",
                                exc_info=True)

    def _lock(self) -> int:
        """Take the data directory (one node per directory)."""
        root = self.config.data
        try:
            (root / GROUPS_DIR).mkdir(parents=True, exist_ok=True)
            fd = lock_exclusive(root / ".lock")
        except OSError as err:
            raise DataDirectoryError(f"cannot use data directory {root}: {err.strerror}") from err
        if fd is None:
            raise DataDirectoryError(f"data directory {root} is in use by another broker")
        return fd

    async def _settle(self) -> None:
        """Read the members until two reads agree (briefly), so that nodes started together
        do not each start groups they hold only until they see one another."""
        await self._members.refresh()
        for _ in range(SETTLE_READS):
            before = self.members()
            await asyncio.sleep(PLACEMENT_INTERVAL / 2)
            await self._members.refresh()
            if self.members() == before:
                return

    async def _caught_up(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for every held group to catch up, so that a
        node that says it is listening serves its groups' reads at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            behind = [g for g, stack in self.stacks.items() if not stack.log.caught_up()]
            if not behind:
                return
            await asyncio.sleep(0.05)
        log.info("groups %s are still catching up; other holders serve their reads meanwhile",
                 ", ".join(map(str, sorted(behind))))

    def _held_text(self) -> str:
        return ", ".join(map(str, sorted(self.stacks))) or "none"

    async def close(self) -> None:
        """Stop every group (each checkpoints), leave the cluster."""
        await cancel_and_wait(self._task)
        for group in sorted(self.stacks):
            await self._stop(group)
        await cancel_and_wait(self._clock_task)
        await self.clock.close()
        with contextlib.suppress(grpc.aio.AioRpcError, MessagingError):
            await self._members.leave()
        for share in self._shares.values():
            await share.close()
        self._shares.clear()
        for client in [self._client, *self._clients.values()]:
            await client.close()
        self._clients.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def enforce_retention(self) -> int:
        """Run retention in every held group (each on its broker's retention thread); the
        bytes deleted."""
        deleted = 0
        for stack in list(self.stacks.values()):
            deleted += await stack.retention.run_now()
        return deleted

    # -- keeping in line --------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(PLACEMENT_INTERVAL)
            try:
                await self._members.register()
                await self._members.refresh()
                await self._place()
                await self._delete_retired()
                await self.clock.meet()  # a member that joined: its clock read at once
            except (grpc.aio.AioRpcError, MessagingError, OSError) as err:
                self._quiet.log("placement", logging.WARNING, "cannot place groups now: %s",
                                describe(err))
            except Exception:  # a bug: logged, and placement goes on next time
                self._quiet.log("placement bug", logging.ERROR, "placing groups failed",
                                exc_info=True)

    async def _place(self) -> None:
        """Start the groups this node now holds, stop the ones it no longer holds."""
        held = {g for g in range(self.groups) if self.url in self.holders(g)}
        for group in sorted(set(self.stacks) - held):
            revision = self.stacks[group].log.applied_revision()
            await self._stop(group)
            self.retired[group] = revision
            log.info("group %d moved to %s: stopped applying it (files kept until its holders "
                     "are durable past revision %d)", group, ", ".join(self.holders(group)),
                     revision)
        for group in sorted(held - set(self.stacks)):
            await self._start(group)

    async def _start(self, group: int) -> None:
        path = self.path(group)
        try:
            stack = await open_stack(
                self.config, self.url, etcd_log(self.config, self.url,
                                                self.group_settings(group), self.clock,
                                                self._share_for(group), self.intake),
                path=path, storage=self.storage, first_named_topic=first_named_topic(group),
                is_uploader=lambda: self.holders(group)[:1] == [self.url], group=group)
        except (MessagingError, OSError, grpc.aio.AioRpcError) as err:
            self._quiet.log(f"start {group}", logging.WARNING,
                            "cannot start group %d yet: %s", group, describe(err))
            return
        self.stacks[group] = stack
        self.retired.pop(group, None)
        log.info("group %d: this node holds it now (data %s)", group, path)

    async def _stop(self, group: int) -> None:
        stack = self.stacks.pop(group)
        for stopped in self.on_stopped:
            await stopped(group)
        await stack.close()

    def _share_for(self, group: int) -> EtcdShare:
        """The client, watch stream and quorum reads of the etcd cluster of ``group``'s log,
        shared by every group held there."""
        endpoints = self.group_settings(group).endpoints
        share = self._shares.get(endpoints)
        if share is None:
            share = self._shares[endpoints] = EtcdShare.over(self._client_for(group),
                                                             list(endpoints))
        return share

    def _client_for(self, group: int) -> EtcdClient:
        settings = self.group_settings(group)
        if settings.endpoints == self.settings.endpoints:
            return self._client
        client = self._clients.get(settings.endpoints)
        if client is None:
            client = self._clients[settings.endpoints] = EtcdClient(
                settings, self._credentials)
        return client

    async def _delete_retired(self) -> None:
        """Delete a retired group's files once every current holder is durable past them."""
        for group, revision in sorted(self.retired.items()):
            if group in self.stacks:
                continue
            others = [u for u in self.holders(group) if u != self.url]
            if not others:
                continue  # this node would be the last copy
            registered = await read_nodes(self._client_for(group),
                                          nodes_prefix(log_name(self.cluster, group,
                                                                self.groups)))
            durable = [u for u in others
                       if registered.get(u, {}).get("durable_revision", -1) >= revision]
            if len(durable) < len(others):
                continue
            path = self.path(group)
            await asyncio.get_running_loop().run_in_executor(None, remove_group, path)
            del self.retired[group]
            log.info("group %d: deleted this node's copy (%s): %s hold it durable past "
                     "revision %d", group, path, ", ".join(durable), revision)


def find_retired(root: Path, groups: int) -> dict[int, int]:
    """The group directories an earlier run left under ``root`` (``DATA/groups``), with the
    revision each checkpointed: retired until placed again. What an interrupted deletion
    left is removed (blocking: call it on a thread)."""
    retired: dict[int, int] = {}
    if not root.is_dir():
        return retired
    for entry in root.iterdir():
        if entry.name.startswith(DELETING):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        if not entry.name.isdigit() or int(entry.name) >= groups:
            continue
        try:
            retired[int(entry.name)] = int(read_json(entry / CHECKPOINT)["revision"])
        except (OSError, ValueError, KeyError, TypeError):
            retired[int(entry.name)] = 0
    return retired


def remove_group(path: Path) -> None:
    """Delete a group's directory so that a crash never leaves part of it under its name
    (a node that holds the group again must find all of it or nothing): rename it away
    durably first, then delete the renamed tree; a start removes what a crash left."""
    remove_directory(path)
