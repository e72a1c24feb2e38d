"""Where a cluster publish's time goes, phase by phase, for the publishes answered lately.

A publish through a node of the cluster passes, in order:

- ``queued``: from the request's command reaching the writer to its put leaving (waiting for
  the put on its way to etcd to come back, so that commands coalesce, and the quorum check);
- ``put``: the put's round trip to etcd (the etcd leader's WAL fsync, replication to a
  majority);
- ``watch``: from etcd's answer to the put until this node's watch delivered the revision
  (zero when the watch was first);
- ``apply_wait``: from delivery until the writer thread took the revision up (revisions before
  it being applied);
- ``apply``: applying the batch of revisions it went in (stamping, writing, the state journal
  and, under ``--fsync always``, the fdatasync of every topic it touched);
- ``answer``: from the end of the apply until the loop answered the publisher;
- ``total``: the sum, from the command reaching the writer to its answer.

Kept on the event loop only: the last SAMPLES publishes, each with when it was answered, so
that a report can cover a recent window (``GET /messaging/diagnostics?window=S``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

PHASES = ("queued", "put", "watch", "apply_wait", "apply", "answer", "total")
#: Publishes kept (the most recent).
SAMPLES = 16384
#: The window a report covers unless asked otherwise (s).
DEFAULT_WINDOW = 60.0


class Budget:
    """Recent per-publish phase durations and their percentiles."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # (answered at, the phases' seconds in PHASES order)
        self._samples: deque[tuple[float, tuple[float, ...]]] = deque(maxlen=SAMPLES)

    def record(self, queued: float, put: float, watch: float, apply_wait: float,
               apply: float, answer: float) -> None:
        """One publish's phases (seconds; a negative one, clocks of two threads, counts 0)."""
        phases = [max(x, 0.0) for x in (queued, put, watch, apply_wait, apply, answer)]
        self._samples.append((self._clock(), (*phases, sum(phases))))

    def report(self, window: float = DEFAULT_WINDOW) -> dict[str, object]:
        """The publishes answered in the last ``window`` seconds: how many, and per phase the
        p50, p90 and p99 in milliseconds."""
        since = self._clock() - window
        rows = [phases for at, phases in self._samples if at >= since]
        out: dict[str, object] = {"window_s": window, "publishes": len(rows)}
        if rows:
            for i, phase in enumerate(PHASES):
                ordered = sorted(row[i] for row in rows)
                out[phase] = {f"p{p}_ms": round(ordered[len(ordered) * p // 100] * 1000, 3)
                              for p in (50, 90, 99)}
        return out
