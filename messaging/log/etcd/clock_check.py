"""This node's wall clock against its peers': a node whose clock is too far off stops serving
writes rather than move the cluster's time (CockroachDB's maximum clock offset).

Every command's time is the wall clock of the node that puts it to etcd, and the state
machine never lets time go back, so one clock running ahead would push the shared time
there for good. Each node therefore measures its offset from every live peer, every
:data:`CHECK_INTERVAL`, as NTP does: it reads its clock, asks the peer's ``/healthz`` (which
carries the peer's clock, ``time_ms``), and reads its clock again; the peer's clock lies
between the two readings, so the offset is known to within half the round trip.

- A node is **off** when it is more than ``--max-clock-offset`` (beyond that uncertainty)
  from more than half of the peers that answered. Then it answers publishes and stream
  commands 503 naming its clock and the offset, ``/readyz`` says so, and it serves again by
  itself once a check finds it back within the bound. A node that no peer has answered yet
  (alone) has no verdict and goes on, its own clock as of each check the reference that a
  step is caught against (below). The cluster's time is the median of the agreeing peers'
  readings, each exact to half its round trip: while this node is within the bound, readings
  less exact than half the bound (peers busy starting) judge it but leave the reference as
  it was, and a clock is judged moved only beyond the bound give or take the reference's
  own uncertainty, as a check judges. A check that no peer answers (peers slow, restarting, or
  cut off) changes nothing once peers have answered: the last verdict stands, and the clock
  is still held to the cluster's time carried forward from the last check that had answers,
  so a clock that steps while its peers are silent is caught all the same. A peer that
  joins is read at once (:meth:`ClockCheck.meet`), not at the next check. In a cluster of
  two nodes, one clock off stops both: neither can tell which clock is wrong.
- **Between checks**, a clock that steps (an operator, a bad NTP step, a VM resumed) is
  caught at once: the cluster's time is carried forward from the last check on the monotonic
  clock, and a node whose wall clock has left it by more than the bound is off until a check
  finds it back within the bound. That holds before any peer has answered too (nodes
  started together do not see one another's registrations at once): the reference is then
  this clock as of the last check.
  The time a command gets is never more than the bound ahead of that estimate
  (:meth:`ClockCheck.command_time`), so no clock can move the shared time further.

Threads: everything runs on the event loop, one check at a time (the writer thread reads
the latest estimate, a tuple replaced whole).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from messaging.clock import now_ms

log = logging.getLogger(__name__)

#: How often every peer's clock is read (seconds).
CHECK_INTERVAL = 1.0
#: How long one peer may take to answer (seconds).
ASK_TIMEOUT = 2.0
#: The default bound on a node's offset (ms): CockroachDB's --max-offset.
DEFAULT_MAX_CLOCK_OFFSET_MS = 500


@dataclass(frozen=True, slots=True)
class PeerClock:
    """One reading of a peer's clock: how far this node's clock is ahead of it (ms; negative:
    behind), give or take ``uncertainty`` (half the round trip); and the peer's time itself
    (``time``, ms) with this node's monotonic clock in the middle of the round trip (``at``,
    s), which is where the cluster's time is carried forward from."""

    offset: float
    uncertainty: float
    time: float
    at: float


class ClockCheck:
    """This node's clock against its live peers' (see the module)."""

    def __init__(self, url: str, max_offset_ms: int, peers: Callable[[], list[str]], *,
                 ca: str | None = None, clock: Callable[[], int] = now_ms,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.max_offset_ms = max_offset_ms
        self._peers = peers
        self._ca = ca
        self._clock = clock
        self._monotonic = monotonic
        self._session: aiohttp.ClientSession | None = None
        #: The last reading of each peer that answered.
        self.readings: dict[str, PeerClock] = {}
        #: Why the last check found this node off (None: it is not, or no verdict).
        self._off: str | None = None
        #: (monotonic seconds, the cluster's time then in ms, give or take ms) as of the
        #: last check.
        self._reference: tuple[float, float, float] | None = None
        #: Whether a peer has answered since start: from then on, a check no peer answers
        #: changes nothing (False: alone so far, the reference is this clock at each check).
        self._answered = False
        #: Whether ``_reference`` comes from peers' readings.
        self._anchored = False
        self.checks = 0
        #: The peers the last check asked.
        self._asked: frozenset[str] = frozenset()
        #: One check at a time (the periodic one and :meth:`meet`'s).
        self._checking = asyncio.Lock()

    # -- checking (the loop) ----------------------------------------------------------------

    async def step(self) -> None:
        """Read every live peer's clock once (side by side) and judge this node's; one check
        at a time, so an older check never overrides a newer one's verdict."""
        async with self._checking:
            peers = [url for url in self._peers() if url != self.url]
            if self._session is None:
                connector = aiohttp.TCPConnector(
                    ssl=ssl.create_default_context(cafile=self._ca) if self._ca else True)
                self._session = aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT))
            self._asked = frozenset(peers)
            answers = await asyncio.gather(*(self._ask(peer) for peer in peers))
            self.readings = {peer: reading
                             for peer, reading in zip(peers, answers, strict=True)
                             if reading is not None}
            self.checks += 1
            self._judge()

    async def meet(self) -> None:
        """Check at once when a live peer has appeared since the last check (a node started
        beside others learns of them after it started checking)."""
        if self._new_peer():
            async with self._checking:
                if not self._new_peer():
                    return  # a check that ended meanwhile asked it
            await self.step()

    def _new_peer(self) -> bool:
        return any(url != self.url and url not in self._asked for url in self._peers())

    async def _ask(self, peer: str) -> PeerClock | None:
        """One reading of ``peer``'s clock (None: it did not answer in time)."""
        assert self._session is not None
        try:
            before, sent = self._clock(), self._monotonic()
            async with self._session.get(f"{peer.rstrip('/')}/healthz") as resp:
                body = await resp.json()
            after, received = self._clock(), self._monotonic()
            theirs = float(body["time_ms"])
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError):
            return None  # down, slow, or a release that does not tell its time
        return PeerClock((before + after) / 2 - theirs, max(after - before, 0) / 2, theirs,
                         (sent + received) / 2)

    def _judge(self) -> None:
        """Decide from the readings whether this node is off, and where the cluster's time
        is (from the peers agreeing with the majority)."""
        readings = list(self.readings.values())
        if not readings:
            if self._answered:
                return  # silent peers: the last verdict and the cluster's time stand
            self._off = None  # no verdict: alone so far
            self._reference = (self._monotonic(), float(self._clock()), 0.0)
            return
        self._answered = True
        far: list[PeerClock] = []
        near: list[PeerClock] = []
        for r in readings:
            (far if abs(r.offset) - r.uncertainty > self.max_offset_ms else near).append(r)
        off = len(far) * 2 > len(readings)
        agreeing = far if off else near
        offset = statistics.median(r.offset for r in agreeing)  # never empty: see off
        # The cluster's time from the agreeing peers' own readings (their median), each
        # carried to now on the monotonic clock: never from this clock read after them,
        # which may have stepped meanwhile (a reference taken from a stepped clock would let
        # it stamp commands unchecked). A reading is only as exact as half its round trip:
        # while this node is within the bound, readings less exact than half the bound
        # (peers busy starting, say) leave the reference where it was, since they would make
        # a right clock look moved; a node found off is held to the peers' time however
        # inexact, which is still nearer than its own.
        at = self._monotonic()
        exact = agreeing if off else [r for r in agreeing
                                      if r.uncertainty <= self.max_offset_ms / 2]
        if exact:
            self._reference = (at, statistics.median(r.time + (at - r.at) * 1000
                                                     for r in exact),
                               statistics.median(r.uncertainty for r in exact))
            self._anchored = True
        elif not self._anchored:  # as if alone, until a reading is exact enough
            self._reference = (at, float(self._clock()), 0.0)
        was = self._off
        if off:
            self._off = (f"this node's clock is {_seconds(offset)} "
                         f"{'ahead of' if offset > 0 else 'behind'} {len(far)} of "
                         f"{len(readings)} peers (--max-clock-offset "
                         f"{self.max_offset_ms} ms): it takes no writes until its clock is "
                         "back within the bound")
            if was is None:
                log.error("%s", self._off)
        else:
            self._off = None
            if was is not None:
                log.warning("this node's clock is back within %d ms of its peers: taking "
                            "writes again", self.max_offset_ms)

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- what the node asks (any thread) ----------------------------------------------------

    def cluster_time(self) -> float | None:
        """The cluster's time now (ms), carried forward from the last check on the monotonic
        clock (None: not checked yet)."""
        estimate = self._estimate()
        return None if estimate is None else estimate[0]

    def _estimate(self) -> tuple[float, float] | None:
        """The cluster's time now (ms) and how exact it is (ms), from one reference."""
        reference = self._reference  # replaced whole by the loop: read once
        if reference is None:
            return None
        at, cluster, give_or_take = reference
        return cluster + (self._monotonic() - at) * 1000, give_or_take

    def problem(self) -> str | None:
        """Why this node must not take writes because of its clock (None: it may)."""
        if self._off is not None:
            return self._off
        estimate = self._estimate()
        if estimate is None:
            return None
        cluster, give_or_take = estimate
        # Within the bound give or take the reference's own uncertainty, as a check judges.
        drift = self._clock() - cluster
        if abs(drift) - give_or_take > self.max_offset_ms:
            return (f"this node's clock moved {_seconds(drift)} "
                    f"{'ahead' if drift > 0 else 'back'} since its last clock check "
                    f"(--max-clock-offset {self.max_offset_ms} ms): it takes no writes "
                    "until a check finds it within the bound")
        return None

    def command_time(self) -> int:
        """The time a command formed now gets: this clock, never more than the bound ahead
        of the cluster's time."""
        now = self._clock()
        cluster = self.cluster_time()
        if cluster is None:
            return now
        return min(now, int(cluster) + self.max_offset_ms)

    def diagnostics(self) -> dict[str, Any]:
        """The last readings (offset and uncertainty in ms, per peer) and the verdict."""
        return {"max_offset_ms": self.max_offset_ms, "checks": self.checks,
                "peers": {url: {"offset_ms": round(r.offset, 1),
                                "uncertainty_ms": round(r.uncertainty, 1)}
                          for url, r in sorted(self.readings.items())},
                "problem": self.problem()}


def _seconds(ms: float) -> str:
    return f"{abs(ms) / 1000:.3f} s"
