"""Message append times on the client side: the runs ``GET /messaging/times`` answers, looked
up by index, and :class:`TimedMessage`, a :class:`~messaging.frames.Message` that carries its
time. Only readers that ask for times pay for them: a Conn made with ``times=True`` fetches
the runs of what it hands out, one request per stretch of messages, not per message.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from messaging.errors import MessagingError
from messaging.frames import FrameBatch, Message, decode_verified

_new_tuple = tuple.__new__


class TimedMessage(Message):
    """A message with its append time (:attr:`time`); equal to the same message without."""

    @property
    def time(self) -> int | None:
        """The append time in ms since the Unix epoch (None: stored before times existed)."""
        value: int | None = self.__dict__.get("time")  # (a copy made by _replace has none)
        return value


def timed(message: Message, time_ms: int | None) -> TimedMessage:
    """``message`` with its append time."""
    result: TimedMessage = _new_tuple(TimedMessage, message)
    result.__dict__["time"] = time_ms
    return result


@dataclass(slots=True)
class TimeRuns:
    """The append times of a topic's messages from ``index`` through ``through``: each run
    (first index, time) holds until the next one starts."""

    index: int
    through: int
    firsts: list[int] = field(default_factory=list)
    times: list[int | None] = field(default_factory=list)

    @classmethod
    def parse(cls, answer: Any) -> TimeRuns:
        """The runs of a ``GET /messaging/times`` answer (MessagingError if malformed)."""
        try:
            runs = cls(int(answer["index"]), int(answer["through"]))
            for first, time_ms in answer["runs"]:
                runs.firsts.append(int(first))
                runs.times.append(None if time_ms is None else int(time_ms))
        except (KeyError, TypeError, ValueError) as err:
            raise MessagingError(f"the broker's times answer is malformed: {err}") from err
        return runs

    def covers(self, index: int) -> bool:
        """Whether the time of ``index`` is known here."""
        return self.index <= index <= self.through and bool(self.firsts)

    def time_of(self, index: int) -> int | None:
        """The append time of ``index`` (which :meth:`covers` must cover)."""
        j = bisect_right(self.firsts, index) - 1
        return self.times[j] if j >= 0 else None

    def stamp(self, messages: Iterable[Message]) -> list[TimedMessage]:
        """Each message with its time."""
        return [timed(m, self.time_of(m.index)) for m in messages]


@dataclass(frozen=True, slots=True)
class TimedBatch(FrameBatch):
    """A :class:`~messaging.frames.FrameBatch` with its messages' append times (what
    ``Conn.batches()`` hands out for a Conn made with ``times=True``): :meth:`time_of` looks
    one up, :meth:`messages` decodes them as :class:`TimedMessage`."""

    runs: TimeRuns | None = None  # None: times unknown (retention took them, or no times)

    def time_of(self, index: int) -> int | None:
        """The append time of message ``index`` of this batch (None: unknown)."""
        runs = self.runs
        if runs is None or not runs.covers(index):
            return None
        return runs.time_of(index)

    def messages(self) -> list[Message]:
        """Decode every message of the batch, each with its time (a :class:`TimedMessage`)."""
        return [timed(m, self.time_of(m.index)) for m in decode_verified(self.buffer)]
