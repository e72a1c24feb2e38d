"""The group coordinator's rebalances, driven directly: joins complete together, the leader's
assignment reaches every member, heartbeats say when to join again, and members that leave,
time out or never join again are dropped."""

from __future__ import annotations

import asyncio
import time

import pytest

from messaging.kafka import protocol as p
from messaging.kafka.groups import EMPTY, STABLE, Coordinator, Group

PROTOCOLS = [("range", b"meta")]


async def _join(group: Group, member: str = "", session_ms: int = 10_000,
                rebalance_ms: int = 10_000) -> asyncio.Future[dict[str, object]]:
    return group.join(member, "client", session_ms, rebalance_ms, "consumer", PROTOCOLS)


async def test_one_member_joins_syncs_and_heartbeats() -> None:
    group = Group("g")
    joined = await (await _join(group))
    assert joined["error_code"] == p.NONE and joined["leader_id"] == joined["member_id"]
    member = str(joined["member_id"])
    assert joined["members"] == [{"member_id": member, "member_metadata": b"meta"}]
    synced = await group.sync(member, 1, [(member, b"all")])
    assert synced == {"error_code": p.NONE, "member_assignment": b"all"}
    assert group.state == STABLE and group.heartbeat(member, 1) == p.NONE
    assert group.heartbeat(member, 0) == p.ILLEGAL_GENERATION
    assert group.heartbeat("stranger", 1) == p.UNKNOWN_MEMBER_ID


async def test_a_second_member_makes_the_first_join_again_and_both_get_assignments() -> None:
    group = Group("g")
    first = str((await (await _join(group)))["member_id"])
    await group.sync(first, 1, [(first, b"all")])
    second_join = await _join(group)
    await asyncio.sleep(0)
    assert not second_join.done()  # waits for the first to join again
    assert group.heartbeat(first, 1) == p.REBALANCE_IN_PROGRESS
    first_join = await _join(group, first)
    joined = await asyncio.gather(first_join, second_join)
    assert {j["generation_id"] for j in joined} == {2}
    second = str(joined[1]["member_id"])
    assert joined[0]["leader_id"] == first and len(joined[0]["members"]) == 2  # type: ignore[arg-type]
    assert joined[1]["members"] == []
    follower = group.sync(second, 2, [])
    await asyncio.sleep(0)
    assert not follower.done()  # waits for the leader's assignment
    leader = group.sync(first, 2, [(first, b"a"), (second, b"b")])
    assert (await leader)["member_assignment"] == b"a"
    assert (await follower)["member_assignment"] == b"b"


async def test_a_member_that_does_not_join_again_in_time_is_dropped() -> None:
    group = Group("g")
    first = str((await (await _join(group, rebalance_ms=1000, session_ms=1000)))["member_id"])
    await group.sync(first, 1, [])
    joined = await asyncio.wait_for(await _join(group, session_ms=1000, rebalance_ms=1000), 5)
    assert joined["error_code"] == p.NONE and first not in group.members
    assert group.heartbeat(first, 1) == p.UNKNOWN_MEMBER_ID


async def test_leaving_and_expiring_members_rebalance_the_rest() -> None:
    group = Group("g")
    a = str((await (await _join(group)))["member_id"])
    b_join = await _join(group)
    a_join = await _join(group, a)
    b = str((await b_join)["member_id"])
    await a_join
    await asyncio.gather(group.sync(a, 2, [(a, b"1"), (b, b"2")]), group.sync(b, 2, []))
    assert group.leave(b) == p.NONE and group.leave(b) == p.UNKNOWN_MEMBER_ID
    assert group.heartbeat(a, 2) == p.REBALANCE_IN_PROGRESS
    await (await _join(group, a))
    group.members[a].seen -= 60
    group.expire(asyncio.get_running_loop().time() + 1e9)
    assert group.state == EMPTY and not group.members


async def test_a_member_sharing_no_protocol_with_the_group_is_refused() -> None:
    group = Group("g")
    first = str((await (await _join(group)))["member_id"])
    await group.sync(first, 1, [])
    other = group.join("", "client", 10_000, 10_000, "consumer", [("roundrobin", b"")])
    assert (await other)["error_code"] == p.INCONSISTENT_GROUP_PROTOCOL
    empty = group.join("", "client", 10_000, 10_000, "consumer", [])
    assert (await empty)["error_code"] == p.INCONSISTENT_GROUP_PROTOCOL
    both = group.join("", "client", 10_000, 10_000, "consumer",
                      [("roundrobin", b"r"), ("range", b"m")])
    again = await _join(group, first)
    joined = await asyncio.gather(both, again)
    assert {j["group_protocol"] for j in joined} == {"range"}  # the one every member speaks
    assert group.state != EMPTY


async def test_a_join_whose_connection_went_away_is_not_counted() -> None:
    coordinator = Coordinator()
    group = coordinator.group("g")
    first = str((await (await _join(group)))["member_id"])
    await group.sync(first, 1, [])
    waiting = asyncio.ensure_future(coordinator.join_group(
        {"group": "g", "member_id": "", "session_timeout": 1000, "rebalance_timeout": 1000,
         "protocol_type": "consumer", "group_protocols": [
             {"protocol_name": "range", "protocol_metadata": b""}]}, "gone"))
    await asyncio.sleep(0.05)
    waiting.cancel()  # the client hung up while its JoinGroup waited
    await asyncio.gather(waiting, return_exceptions=True)
    group.expire(time.monotonic())
    assert len(group.members) == 1 and first in group.members
    await coordinator.close()


@pytest.mark.parametrize("session_ms", [10, 10_000_000])
async def test_an_unreasonable_session_timeout_is_refused(session_ms: int) -> None:
    joined = await (await _join(Group("g"), session_ms=session_ms))
    assert joined["error_code"] == p.INVALID_SESSION_TIMEOUT


async def test_commits_are_checked_against_the_generation() -> None:
    coordinator = Coordinator()
    group = coordinator.group("g")
    member = str((await (await _join(group)))["member_id"])
    assert coordinator.check_commit("g", -1, "") == p.NONE  # outside the group protocol
    assert coordinator.check_commit("g", 1, member) == p.NONE
    assert coordinator.check_commit("g", 0, member) == p.ILLEGAL_GENERATION
    assert coordinator.check_commit("g", 1, "other") == p.UNKNOWN_MEMBER_ID
    assert coordinator.check_commit("h", 1, member) == p.UNKNOWN_MEMBER_ID
    await coordinator.close()
