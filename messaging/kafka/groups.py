"""The consumer group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup): the classic
rebalance, the broker being its own group coordinator.

The broker keeps only membership, in memory, as Kafka's coordinator does between rebalances:
which members are in a group, the generation, the leader, the assignment the leader sent. The
assignors (range, round-robin, cooperative-sticky) run in the clients, as they always do in
Kafka; the broker passes their metadata and assignments through unread. What must outlive a
broker, the committed offsets, are the project's consumer positions
(:mod:`messaging.kafka.offsets`). A restarted broker starts with no members: every client's
next heartbeat is answered UNKNOWN_MEMBER_ID and it joins again, as after a coordinator
failover in Kafka.

A rebalance starts when a member joins, leaves, or misses its session timeout; the others learn
it from their next heartbeat (REBALANCE_IN_PROGRESS) and join again. It completes once every
member has joined, or after the longest rebalance timeout, without those that did not.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from messaging.kafka import protocol as p
from messaging.kafka.access import allowed
from messaging.kafka.nodes import Nodes

log = logging.getLogger(__name__)

#: How often members are checked for a missed session timeout.
SWEEP_INTERVAL = 1.0
#: Bounds on what clients may ask for (Kafka's group.min/max.session.timeout.ms).
MIN_SESSION_MS, MAX_SESSION_MS = 1_000, 1_800_000


@dataclass(eq=False)
class Member:
    """One member of a group as its last JoinGroup described it."""

    id: str
    session_timeout: float
    rebalance_timeout: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    seen: float = field(default_factory=time.monotonic)
    joining: asyncio.Future[dict[str, Any]] | None = None
    syncing: asyncio.Future[dict[str, Any]] | None = None
    assignment: bytes = b""


EMPTY, PREPARING, AWAITING_SYNC, STABLE = "Empty", "PreparingRebalance", "AwaitingSync", "Stable"


class Group:
    """One consumer group's membership and rebalance state (on the event loop only)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = EMPTY
        self.generation = 0
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self._deadline: asyncio.TimerHandle | None = None

    # -- JoinGroup -------------------------------------------------------------------------------

    def join(self, member_id: str, client_id: str | None, session_ms: int, rebalance_ms: int,
             protocol_type: str, protocols: list[tuple[str, bytes]],
             ) -> asyncio.Future[dict[str, Any]]:
        """A member joins (or joins again); its answer comes when the rebalance completes."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[dict[str, Any]] = loop.create_future()
        if not MIN_SESSION_MS <= session_ms <= MAX_SESSION_MS:
            answer.set_result(_join_error(p.INVALID_SESSION_TIMEOUT, member_id))
            return answer
        others = [m for m in self.members.values() if m.id != member_id]
        if not protocols or any(m.protocol_type != protocol_type for m in others) or (
                others and not self._candidates(others) & {name for name, _ in protocols}):
            # Kafka's rule: a member must speak a protocol every other member speaks.
            answer.set_result(_join_error(p.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return answer
        if member_id and member_id not in self.members:
            answer.set_result(_join_error(p.UNKNOWN_MEMBER_ID, member_id))
            return answer
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            log.info("group %r: member %s joins", self.name, member_id)
        member = self.members.get(member_id)
        if member is None:
            member = self.members[member_id] = Member(
                member_id, session_ms / 1000, max(rebalance_ms, session_ms) / 1000,
                protocol_type, protocols)
        else:
            member.protocols = protocols
            member.session_timeout = session_ms / 1000
            member.rebalance_timeout = max(rebalance_ms, session_ms) / 1000
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(_join_error(p.REBALANCE_IN_PROGRESS, member_id))
        member.joining = answer
        member.seen = time.monotonic()
        self._prepare()
        self._complete_join_if_ready()
        return answer

    def _prepare(self) -> None:
        """Start a rebalance (the members still syncing are told to join again)."""
        if self.state == PREPARING:
            return
        self.state = PREPARING
        for member in self.members.values():
            if member.syncing is not None and not member.syncing.done():
                member.syncing.set_result({"error_code": p.REBALANCE_IN_PROGRESS,
                                           "member_assignment": b""})
        timeout = max((m.rebalance_timeout for m in self.members.values()), default=1.0)
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = asyncio.get_running_loop().call_later(timeout, self._join_deadline)

    def _join_deadline(self) -> None:
        """The rebalance timeout passed: complete without the members that did not join."""
        self._deadline = None
        if self.state != PREPARING:
            return
        for member in [m for m in self.members.values() if m.joining is None]:
            log.info("group %r: member %s did not join again in time and is removed",
                     self.name, member.id)
            del self.members[member.id]
        self._complete_join_if_ready()

    def _complete_join_if_ready(self) -> None:
        if self.state != PREPARING or any(m.joining is None for m in self.members.values()):
            return
        if not self.members:
            self._empty()
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.generation += 1
        self.protocol = self._choose_protocol()
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        members = [{"member_id": m.id, "member_metadata": dict(m.protocols)[self.protocol]}
                   for m in self.members.values()]
        self.state = AWAITING_SYNC
        log.info("group %r: generation %d with %d members, protocol %s, leader %s", self.name,
                 self.generation, len(self.members), self.protocol, self.leader)
        for member in self.members.values():
            joining, member.joining = member.joining, None
            member.assignment = b""
            if joining is not None and not joining.done():
                joining.set_result({
                    "error_code": p.NONE, "generation_id": self.generation,
                    "group_protocol": self.protocol, "leader_id": self.leader,
                    "member_id": member.id,
                    "members": members if member.id == self.leader else []})

    @staticmethod
    def _candidates(members: list[Member]) -> set[str]:
        """The protocols every one of ``members`` offers."""
        return set.intersection(*({name for name, _ in m.protocols} for m in members))

    def _choose_protocol(self) -> str:
        """The first of the leader's (or any member's) protocols that every member offers
        (there is one: a member that shares none is refused when it joins)."""
        candidates = self._candidates(list(self.members.values()))
        first = self.members.get(self.leader or "") or next(iter(self.members.values()))
        return next(name for name, _ in first.protocols if name in candidates)

    def _empty(self) -> None:
        self.state = EMPTY
        self.leader = None
        self.protocol = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    # -- SyncGroup, Heartbeat, LeaveGroup --------------------------------------------------------

    def sync(self, member_id: str, generation: int,
             assignments: list[tuple[str, bytes]]) -> asyncio.Future[dict[str, Any]]:
        """A member asks for its assignment; the leader brings everyone's."""
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        member = self.members.get(member_id)
        code = self._check(member, generation)
        if code is None and self.state == PREPARING:
            code = p.REBALANCE_IN_PROGRESS
        if code is not None or member is None:
            answer.set_result({"error_code": code, "member_assignment": b""})
            return answer
        member.seen = time.monotonic()
        if self.state == STABLE:
            answer.set_result({"error_code": p.NONE, "member_assignment": member.assignment})
            return answer
        member.syncing = answer
        if member_id == self.leader:
            given = dict(assignments)
            for each in self.members.values():
                each.assignment = given.get(each.id, b"")
            self.state = STABLE
            for each in self.members.values():
                syncing, each.syncing = each.syncing, None
                if syncing is not None and not syncing.done():
                    syncing.set_result({"error_code": p.NONE,
                                        "member_assignment": each.assignment})
        return answer

    def heartbeat(self, member_id: str, generation: int) -> int:
        """A member is alive; the error code tells it to join again when it must."""
        member = self.members.get(member_id)
        code = self._check(member, generation)
        if code is not None or member is None:
            return code if code is not None else p.UNKNOWN_MEMBER_ID
        member.seen = time.monotonic()
        return p.REBALANCE_IN_PROGRESS if self.state == PREPARING else p.NONE

    def leave(self, member_id: str) -> int:
        """A member leaves: the others rebalance without it."""
        if member_id not in self.members:
            return p.UNKNOWN_MEMBER_ID
        self._remove(member_id, "leaves")
        return p.NONE

    def _check(self, member: Member | None, generation: int) -> int | None:
        if member is None:
            return p.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return p.ILLEGAL_GENERATION
        return None

    def abandon(self, answer: asyncio.Future[dict[str, Any]]) -> None:
        """A member's JoinGroup connection went away before its answer: it is not counted
        as joined (its session ends it if it does not come back)."""
        for member in self.members.values():
            if member.joining is answer:
                member.joining = None
                member.seen = time.monotonic() - member.session_timeout  # expires next sweep

    def _remove(self, member_id: str, why: str) -> None:
        member = self.members.pop(member_id)
        log.info("group %r: member %s %s", self.name, member_id, why)
        for future in (member.joining, member.syncing):
            if future is not None and not future.done():
                future.set_result(_join_error(p.UNKNOWN_MEMBER_ID, member_id)
                                  if future is member.joining else
                                  {"error_code": p.UNKNOWN_MEMBER_ID, "member_assignment": b""})
        if not self.members:
            self._empty()
            return
        if self.state == PREPARING:
            self._complete_join_if_ready()
        else:
            self._prepare()

    def expire(self, now: float) -> None:
        """Remove the members whose session timed out (those waiting on a join are alive)."""
        for member in list(self.members.values()):
            waiting = member.joining is not None or (member.syncing is not None
                                                     and not member.syncing.done())
            if not waiting and now - member.seen > member.session_timeout:
                self._remove(member.id, f"missed its session timeout "
                                        f"({member.session_timeout:g} s)")

    def describe(self) -> dict[str, Any]:
        """The group as a listing shows it."""
        return {"state": self.state, "generation": self.generation, "protocol": self.protocol,
                "leader": self.leader, "members": sorted(self.members)}


def _join_error(code: int, member_id: str) -> dict[str, Any]:
    return {"error_code": code, "generation_id": -1, "group_protocol": None,
            "leader_id": None, "member_id": member_id, "members": []}


class Coordinator:
    """Every consumer group this node coordinates (all of them: it answers FindCoordinator
    with itself), and the sweep that expires silent members."""

    def __init__(self, nodes: Nodes | None = None) -> None:
        self.groups: dict[str, Group] = {}
        #: The cluster's Kafka nodes (None: this node coordinates every group).
        self.nodes = nodes
        self._sweeper: asyncio.Task[None] | None = None

    def _refused(self, name: str) -> int | None:
        """Why this node does not serve a group's member now (None: it does)."""
        if not allowed("consume", name):
            return p.GROUP_AUTHORIZATION_FAILED
        if self.nodes is not None and not self.nodes.coordinates(name):
            return p.NOT_COORDINATOR
        return None

    def group(self, name: str) -> Group:
        """The group of that name (created empty on first use)."""
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = Group(name)
            if self._sweeper is None:
                self._sweeper = asyncio.ensure_future(self._sweep())
        return group

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            now = time.monotonic()
            for group in list(self.groups.values()):
                try:
                    group.expire(now)
                except Exception:  # one group's failure must not end every group's expiry
                    log.exception("group %r: expiring members failed", group.name)
                if group.state == EMPTY and not group.members:
                    del self.groups[group.name]

    async def close(self) -> None:
        """Stop the sweep (the groups go with the process)."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)

    # -- the APIs --------------------------------------------------------------------------------

    async def join_group(self, request: dict[str, Any], client_id: str | None,
                         ) -> dict[str, Any]:
        """JoinGroup: wait for the rebalance this join is part of."""
        refused = self._refused(request["group"])
        if refused is not None:
            return _join_error(refused, request["member_id"])
        group = self.group(request["group"])
        session = request["session_timeout"]
        answer = group.join(request["member_id"], client_id, session,
                            request.get("rebalance_timeout", session), request["protocol_type"],
                            [(g["protocol_name"], g["protocol_metadata"] or b"")
                             for g in request["group_protocols"]])
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            group.abandon(answer)
            raise

    async def sync_group(self, request: dict[str, Any]) -> dict[str, Any]:
        """SyncGroup: this member's assignment (the leader's request carries them all)."""
        refused = self._refused(request["group"])
        if refused is not None:
            return {"error_code": refused, "member_assignment": b""}
        group = self.groups.get(request["group"])
        if group is None:
            return {"error_code": p.UNKNOWN_MEMBER_ID, "member_assignment": b""}
        return await group.sync(request["member_id"], request["generation_id"],
                                [(a["member_id"], a["member_metadata"])
                                 for a in request["group_assignment"]])

    def heartbeat(self, request: dict[str, Any]) -> dict[str, Any]:
        """Heartbeat: alive, or join again."""
        refused = self._refused(request["group"])
        if refused is not None:
            return {"error_code": refused}
        group = self.groups.get(request["group"])
        code = (p.UNKNOWN_MEMBER_ID if group is None
                else group.heartbeat(request["member_id"], request["generation_id"]))
        return {"error_code": code}

    def leave_group(self, request: dict[str, Any]) -> dict[str, Any]:
        """LeaveGroup: the member goes; the others rebalance."""
        refused = self._refused(request["group"])
        if refused is not None:
            return {"error_code": refused}
        group = self.groups.get(request["group"])
        code = p.UNKNOWN_MEMBER_ID if group is None else group.leave(request["member_id"])
        return {"error_code": code}

    def check_commit(self, name: str, generation: int, member_id: str) -> int:
        """Whether a member may commit offsets now (generation -1: a consumer outside the
        group protocol, which may always)."""
        if generation < 0 and not member_id:
            return p.NONE
        group = self.groups.get(name)
        if group is None or member_id not in group.members:
            return p.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return p.ILLEGAL_GENERATION
        if group.state == PREPARING:
            return p.REBALANCE_IN_PROGRESS
        return p.NONE
