"""The clock check against peers that are real HTTP servers on loopback, each answering
``/healthz`` with its clock (set by the test), and this node's clocks (wall and monotonic)
set by the test too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from messaging.log.etcd.clock_check import ClockCheck
from tests.raw_server import app_server

NOW = 1_795_000_000_000
HOUR = 3_600_000


class Clocks:
    """This node's wall clock (ms) and monotonic clock (s), moved by the test."""

    def __init__(self) -> None:
        self.wall = NOW
        self.mono = 100.0

    def advance(self, seconds: float) -> None:
        self.wall += round(seconds * 1000)
        self.mono += seconds


@asynccontextmanager
async def peer(clock: Callable[[], int]) -> AsyncIterator[str]:
    """A peer whose ``/healthz`` says ``clock()``; its URL."""
    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": "x", "time_ms": clock()})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    async with app_server(app) as url:
        yield url


def check(clocks: Clocks, peers: list[str], bound: int = 500) -> ClockCheck:
    return ClockCheck("http://me", bound, lambda: ["http://me", *peers],
                      clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)


async def test_a_node_within_the_bound_of_its_peers_takes_writes() -> None:
    clocks = Clocks()
    async with peer(lambda: clocks.wall + 200) as one, peer(lambda: clocks.wall - 100) as two:
        checker = check(clocks, [one, two])
        await checker.step()
        assert checker.problem() is None
        assert {round(r.offset) for r in checker.readings.values()} == {-200, 100}
        assert checker.command_time() == clocks.wall
        report = checker.diagnostics()
        assert report["problem"] is None and set(report["peers"]) == {one, two}
        await checker.close()


async def test_a_node_an_hour_ahead_of_most_peers_is_refused_until_it_is_back() -> None:
    clocks = Clocks()
    real = [NOW]
    async with peer(lambda: real[0]) as one, peer(lambda: real[0]) as two:
        checker = check(clocks, [one, two])
        clocks.wall = NOW + HOUR
        await checker.step()
        problem = checker.problem()
        assert problem is not None and "3600.000 s ahead of 2 of 2 peers" in problem
        assert "--max-clock-offset 500 ms" in problem
        # What a command would get is held within the bound of the cluster's time.
        assert checker.command_time() == NOW + 500
        clocks.wall = NOW  # corrected: the next check clears it
        await checker.step()
        assert checker.problem() is None
        await checker.close()


async def test_one_peer_off_does_not_stop_the_others() -> None:
    clocks = Clocks()
    async with peer(lambda: clocks.wall) as good, peer(lambda: clocks.wall + HOUR) as fast:
        checker = check(clocks, [good, fast])
        await checker.step()
        assert checker.problem() is None  # one of two peers far: not a majority
        assert checker.command_time() == clocks.wall
        await checker.close()


async def test_a_clock_step_between_checks_is_caught_at_once() -> None:
    clocks = Clocks()
    async with peer(lambda: NOW + round((clocks.mono - 100.0) * 1000)) as one:
        checker = check(clocks, [one])
        await checker.step()
        assert checker.problem() is None
        clocks.advance(0.3)
        assert checker.problem() is None  # wall and monotonic moved together
        clocks.wall -= 10_000  # stepped back ten seconds
        problem = checker.problem()
        assert problem is not None and "moved 10.000 s back" in problem
        clocks.wall += 10_000 + HOUR  # then an hour ahead: still caught, and held
        assert "ahead" in (checker.problem() or "")
        assert checker.command_time() == NOW + 300 + 500
        await checker.close()


async def test_no_peer_answering_gives_no_verdict() -> None:
    clocks = Clocks()
    async with peer(lambda: NOW) as gone:
        pass  # its port is closed now
    checker = check(clocks, [gone])
    clocks.wall = NOW + HOUR
    await checker.step()
    assert checker.readings == {} and checker.problem() is None
    assert checker.command_time() == clocks.wall
    await checker.close()


async def test_a_step_while_no_peer_answers_is_still_caught_and_held() -> None:
    """Peers that answered once and then fall silent (slow, restarting, cut off) leave the
    last verdict and the cluster's time in place: a clock that steps meanwhile is refused
    and held within the bound, not taken as the cluster's time."""
    clocks = Clocks()
    answering = [True]

    async def healthz(_request: web.Request) -> web.StreamResponse:
        if not answering[0]:
            raise web.HTTPServiceUnavailable()
        return web.json_response({"status": "ok", "version": "x",
                                  "time_ms": NOW + round((clocks.mono - 100.0) * 1000)})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    async with app_server(app) as one, app_server(app) as two:
        checker = check(clocks, [one, two])
        await checker.step()
        assert checker.problem() is None
        answering[0] = False
        clocks.advance(1.0)
        clocks.wall += HOUR  # stepped an hour ahead while the peers are silent
        await checker.step()
        assert checker.readings == {}
        problem = checker.problem()
        assert problem is not None and "moved 3600.000 s ahead" in problem
        assert checker.command_time() == NOW + 1000 + 500
        answering[0] = True  # they answer again: the check finds the node far ahead
        await checker.step()
        assert "3600.000 s ahead of 2 of 2 peers" in (checker.problem() or "")
        clocks.wall -= HOUR  # corrected
        await checker.step()
        assert checker.problem() is None and checker.command_time() == clocks.wall
        await checker.close()


async def test_a_step_between_the_readings_and_the_verdict_does_not_move_the_reference(
        ) -> None:
    """The clock steps an hour ahead after the peers were read and before the check judges:
    the cluster's time comes from the peers' readings (carried on the monotonic clock), so
    the step is caught at once and commands are held within the bound, rather than the
    stepped clock becoming the cluster's time until the next check."""
    clocks = Clocks()
    readings = [0]

    def wall() -> int:  # the four readings of the two round trips see NOW, then +1 h
        readings[0] += 1
        return NOW if readings[0] <= 4 else NOW + HOUR

    async with peer(lambda: NOW) as one, peer(lambda: NOW) as two:
        checker = ClockCheck("http://me", 500, lambda: ["http://me", one, two], clock=wall,
                             monotonic=lambda: clocks.mono)
        await checker.step()
        problem = checker.problem()
        assert problem is not None and "moved 3600.000 s ahead" in problem
        assert checker.command_time() == NOW + 500
        await checker.close()


async def test_a_step_before_any_peer_answered_is_caught_against_the_last_check() -> None:
    """Nodes started together do not see one another's registrations at once: until a peer
    answers, this clock as of the last check is the reference, so a step meanwhile is caught
    and held rather than stamped on commands."""
    clocks = Clocks()
    checker = check(clocks, [])
    await checker.step()  # alone so far: no verdict
    assert checker.problem() is None and checker.command_time() == NOW
    clocks.advance(0.4)
    assert checker.problem() is None and checker.command_time() == NOW + 400
    clocks.wall += HOUR
    problem = checker.problem()
    assert problem is not None and "moved 3600.000 s ahead" in problem
    assert checker.command_time() == NOW + 400 + 500
    await checker.close()


async def test_a_peer_that_joins_is_read_at_once() -> None:
    clocks = Clocks()
    members: list[str] = ["http://me"]
    async with peer(lambda: NOW) as one:
        checker = ClockCheck("http://me", 500, lambda: list(members),
                             clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)
        await checker.step()
        assert checker.checks == 1
        await checker.meet()  # nobody new: no check
        assert checker.checks == 1
        clocks.wall = NOW + HOUR
        members.append(one)
        await checker.meet()
        assert checker.checks == 2 and set(checker.readings) == {one}
        assert "3600.000 s ahead of 1 of 1 peers" in (checker.problem() or "")
        await checker.meet()  # read already: not again before the next check
        assert checker.checks == 2
        await checker.close()


async def test_a_slow_answer_does_not_make_a_right_clock_look_moved() -> None:
    """Peers busy starting answer after 1.2 s: the reading is exact only to 0.6 s, so it
    neither finds this (right) clock off nor becomes the cluster's time that this clock is
    held to; a prompt answer later does."""
    clocks = Clocks()
    slow = [True]

    async def healthz(_request: web.Request) -> web.StreamResponse:
        now = clocks.wall  # the peer's clock agrees with this node's
        if slow[0]:
            clocks.advance(1.2)  # it answers 1.2 s after it read its clock
        return web.json_response({"status": "ok", "version": "x", "time_ms": now})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    async with app_server(app) as one:
        checker = check(clocks, [one])
        await checker.step()
        reading = checker.readings[one]
        assert reading.uncertainty == 600
        assert checker.problem() is None and checker.command_time() == clocks.wall
        clocks.wall += HOUR  # a step is still caught, against this clock at the check
        assert "moved 3600.000 s ahead" in (checker.problem() or "")
        clocks.wall -= HOUR
        slow[0] = False
        await checker.step()
        assert checker.problem() is None
        clocks.wall += HOUR
        assert "moved 3600.000 s ahead" in (checker.problem() or "")
        await checker.close()


async def test_a_node_off_stays_off_when_its_slow_peers_then_fall_silent() -> None:
    """Restarted an hour ahead beside peers that are busy (answers too slow to carry the
    cluster's time): it is off, its commands are held to the peers' time, and a check that
    no peer answers then changes nothing."""
    clocks = Clocks()
    mode = ["slow"]

    async def healthz(_request: web.Request) -> web.StreamResponse:
        if mode[0] == "silent":
            raise web.HTTPServiceUnavailable()
        real = NOW + round((clocks.mono - 100.0) * 1000)
        clocks.advance(1.7)
        return web.json_response({"status": "ok", "version": "x", "time_ms": real})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    async with app_server(app) as one, app_server(app) as two:
        checker = check(clocks, [one, two])
        clocks.wall += HOUR
        await checker.step()
        assert all(r.uncertainty > 800 for r in checker.readings.values())
        assert "ahead of 2 of 2 peers" in (checker.problem() or "")
        real_now = NOW + round((clocks.mono - 100.0) * 1000)
        assert abs(checker.command_time() - (real_now + 500)) < 2000  # not an hour ahead
        mode[0] = "silent"
        await checker.step()
        assert checker.readings == {}
        assert "ahead of 2 of 2 peers" in (checker.problem() or "")
        assert checker.command_time() < clocks.wall - HOUR + 3000
        await checker.close()


async def test_one_peer_near_the_bound_does_not_make_the_agreeing_majority_refuse() -> None:
    """Two peers agree with this clock, a third is 499 ms behind (within the bound, as
    exact as the others): the cluster's time is the agreeing readings' median, not the one
    peer's, so a wobble of this clock by a few ms is not judged a move past the bound."""
    clocks = Clocks()
    async with peer(lambda: clocks.wall - 499) as a, peer(lambda: clocks.wall) as b, \
            peer(lambda: clocks.wall + 20) as c:
        checker = check(clocks, [a, b, c])
        await checker.step()
        clocks.advance(0.5)
        clocks.wall += 2
        assert checker.problem() is None
        assert checker.command_time() == clocks.wall
        await checker.close()


async def test_checks_run_one_at_a_time() -> None:
    clocks = Clocks()
    inflight = [0, 0]  # now, most
    release = asyncio.Event()

    async def healthz(_request: web.Request) -> web.StreamResponse:
        inflight[0] += 1
        inflight[1] = max(inflight[1], inflight[0])
        await release.wait()
        inflight[0] -= 1
        return web.json_response({"status": "ok", "version": "x", "time_ms": clocks.wall})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    members = ["http://me"]
    async with app_server(app) as one, app_server(app) as two:
        members.append(one)
        checker = ClockCheck("http://me", 500, lambda: list(members),
                             clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)
        periodic = asyncio.create_task(checker.step())
        try:
            await asyncio.sleep(0.05)
            members.append(two)  # joins while the periodic check waits for the first peer
            meeting = asyncio.create_task(checker.meet())
            await asyncio.sleep(0.05)
            assert inflight == [1, 1]  # the second check waits for the first
        finally:
            release.set()
        await asyncio.gather(periodic, meeting)
        assert inflight[1] <= 2 and checker.checks == 2
        assert set(checker.readings) == {one, two}
        await checker.close()
