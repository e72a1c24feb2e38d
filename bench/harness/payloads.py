"""The 100-byte message the benchmarks send, the frame it is stored and streamed as, and the
stamped variant that carries its send time so that a reader can time its delivery."""

from __future__ import annotations

import time

from messaging.frames import HEADER_SIZE

PAYLOAD = b"x" * 100
#: Bytes of one stored (and streamed) 100-byte message: a frame header and the payload.
FRAME = HEADER_SIZE + len(PAYLOAD)


def stamped(k: int) -> bytes:
    """A 100-byte payload carrying its number and its send time (``time.perf_counter``)."""
    return (b"%d %.6f " % (k, time.perf_counter())).ljust(len(PAYLOAD), b"x")


def latency_of(data: bytes, now: float) -> float:
    """Seconds since the send time ``stamped`` put into ``data``."""
    return now - float(data.split(b" ", 2)[1])
