"""Durable appends through ``Topic.append``, with and without append times, in the same run.

Three arms run interleaved round by round (A B C, then C B A, ...), each into a file of its
own, and every figure is the median over the rounds:

- ``before``: ``Topic.append(..., time_ms=None)``: no time index is written, exactly the path
  of the code before append times existed;
- ``after``: the same appends each given a time the way the broker gives them: a
  millisecond clock read per append (per group, in the broker) that only moves when it is at
  least ``TIME_RESOLUTION_MS`` past its last value (``Broker.advance_time``), so the topic's
  time index gets a record, written and fsynced before its frames, once per step;
- ``raw``: ``os.write`` + ``fdatasync`` of the same bytes, the disk's own figure.

An op is one append of ``batch`` frames, ``Topic.sync`` (write + fdatasync) and
``Topic.commit``; each op is timed alone (the frames' indexes are renumbered between ops,
outside the timing), so a round gives both its rate (messages over the summed op times) and,
at batch 1, the latency of a single durable append.
"""

from __future__ import annotations

import os
import statistics
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.figures import percentile
from messaging.broker.commands import stamp_indexes
from messaging.clock import now_ms
from messaging.frames import HEADER_SIZE, Message, encode_many
from messaging.topic.times import TIME_RESOLUTION_MS, TIMES_SUFFIX
from messaging.topic.topic import Topic

ARMS = ("before", "after", "raw")
#: What each arm is, for the tables.
ARM_NAMES = {"before": "time_ms=None, no time index: the path before times",
             "after": "with append times, as the broker gives them",
             "raw": "os.write + fdatasync"}


class BrokerClock:
    """Append times as ``Broker.advance_time`` hands them out: the wall clock in ms, moving
    only in steps of at least ``TIME_RESOLUTION_MS`` and never back."""

    def __init__(self) -> None:
        self.time = 0

    def __call__(self) -> int:
        now = now_ms()
        if now >= self.time + TIME_RESOLUTION_MS:
            self.time = now
        return self.time


@dataclass
class ArmRounds:
    """One arm's measured rounds: messages/s, and per-op latency p50/p99 (s), per round."""

    rates: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)
    #: "after" only, per round: the ops whose time moved (a time record written and
    #: fsynced), and their median duration less the others' (s).
    timed_ops: list[int] = field(default_factory=list)
    record_cost: list[float] = field(default_factory=list)

    def median(self, what: str = "rates") -> float:
        values: list[float] = getattr(self, what)
        return statistics.median(values)


class Arm:
    """One arm's file(s) and its op: a topic (with or without times) or a raw file."""

    def __init__(self, kind: str, directory: Path, size: int, batch: int) -> None:
        self.kind, self.batch = kind, batch
        payload = os.urandom(size)
        frame = HEADER_SIZE + size
        self.stride = frame
        self.offsets = array("q", range(0, batch * frame, frame))
        self.buffer = bytearray(encode_many(Message(1 + i, 1, 1, payload)
                                            for i in range(batch)))
        self.next_index = 1
        self.directory = directory / kind
        self.topic: Topic | None = None
        self.fd: int | None = None
        self.clock = BrokerClock()
        if kind == "raw":
            self.directory.mkdir(parents=True)
            self.fd = os.open(self.directory / "raw", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                              0o644)
        else:
            self.topic = Topic.open(self.directory, 1)

    def op(self) -> Callable[[], None]:
        """The timed operation of this arm."""
        if self.fd is not None:
            fd, blob = self.fd, self.buffer

            def raw() -> None:
                os.write(fd, blob)
                os.fdatasync(fd)
            return raw
        topic, buffer, offsets = self.topic, self.buffer, self.offsets
        assert topic is not None
        if self.kind == "before":
            def before() -> None:
                topic.append(buffer, offsets, self.next_index, None)
                topic.sync()
                topic.commit()
            return before
        clock = self.clock

        def after() -> None:
            topic.append(buffer, offsets, self.next_index, clock())
            topic.sync()
            topic.commit()
        return after

    def run(self, seconds: float, max_ops: int) -> list[float]:
        """Ops until ``seconds`` of op time or ``max_ops`` ops: each op's duration (s);
        which of them moved the time (and so wrote a time record) goes to ``self.moved``."""
        op = self.op()
        durations: list[float] = []
        self.moved: list[bool] = []
        spent = 0.0
        clock = time.perf_counter
        for _ in range(max_ops):
            last_time = self.clock.time
            started = clock()
            op()
            took = clock() - started
            durations.append(took)
            self.moved.append(self.clock.time != last_time)
            spent += took
            self.next_index += self.batch
            # Frames are copied when staged: the same buffer, renumbered, is the next batch.
            stamp_indexes(self.buffer, self.offsets, self.next_index, self.stride)
            if spent >= seconds:
                break
        return durations

    def time_files(self) -> int:
        """How many time index files this arm's topic has."""
        return len(list(self.directory.glob(f"*{TIMES_SUFFIX}")))

    def close(self) -> None:
        if self.topic is not None:
            self.topic.close()
        if self.fd is not None:
            os.close(self.fd)


def append_ab(directory: Path, size: int, batch: int, *, rounds: int, seconds: float,
              max_ops: int, warmup_ops: int = 20) -> dict[str, ArmRounds]:
    """Every arm's rounds for ``size``-byte messages in batches of ``batch``; raises when the
    arms did not write what they should (times only in ``after``)."""
    arms = {kind: Arm(kind, directory, size, batch) for kind in ARMS}
    measured = {kind: ArmRounds() for kind in ARMS}
    try:
        for arm in arms.values():
            arm.run(seconds, warmup_ops)
        for r in range(rounds):
            order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
            for kind in order:
                durations = arms[kind].run(seconds, max_ops)
                m = measured[kind]
                m.rates.append(len(durations) * batch / sum(durations))
                m.p50.append(percentile(durations, 50))
                m.p99.append(percentile(durations, 99))
                m.ops.append(len(durations))
                moved = arms[kind].moved
                if kind == "after" and any(moved) and not all(moved):
                    m.timed_ops.append(sum(moved))
                    m.record_cost.append(
                        statistics.median(d for d, x in zip(durations, moved, strict=True) if x)
                        - statistics.median(d for d, x in zip(durations, moved, strict=True)
                                            if not x))
        with_times, without = arms["after"].time_files(), arms["before"].time_files()
        if with_times == 0 or without != 0:
            raise RuntimeError(f"time index files: {with_times} with times, {without} without "
                               "(expected some, and none)")
    finally:
        for arm in arms.values():
            arm.close()
    return measured
