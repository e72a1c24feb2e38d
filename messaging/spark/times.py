"""Append times of a partition's rows: fetched once per partition from the broker
(``GET /messaging/times``), then mapped onto every Arrow batch's indexes with numpy.

The broker answers a range's times as runs, ``(first index, ms or None)``, each holding until
the next run starts; a batch's ``timestamp`` column is one ``searchsorted`` of its indexes into
the runs' first indexes. Times are non-decreasing in index order, so the runs stay few: one
per burst of appends, never one per message.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from messaging.errors import MessagingError
from messaging.spark.broker_http import BrokerHTTP

#: The Arrow type of Spark's TimestampType as Python data sources hand it over.
TIMESTAMP = pa.timestamp("us", tz="UTC")
#: Asks for the times of rows that an answer did not reach (a lagging node in a cluster)
#: before the task fails (Spark then runs it again).
_ATTEMPTS = 5
_PAUSE = 0.2


class AppendTimes:
    """The append times of ``topic``'s messages ``start`` <= index < ``end``."""

    def __init__(self, broker: BrokerHTTP, topic: int, start: int, end: int) -> None:
        self.broker = broker
        self.topic = topic
        self.end = end
        self.through = start - 1
        self.firsts = np.empty(0, dtype=np.int64)
        self.micros = np.empty(0, dtype=np.int64)
        self.known = np.empty(0, dtype=bool)
        self._fetch(start)

    def _fetch(self, start: int) -> None:
        """Add the runs of ``start`` .. ``end - 1`` (as far as the broker answers)."""
        through, runs = self.broker.times(self.topic, start, self.end)
        self.add(through, runs)

    def add(self, through: int, runs: list[tuple[int, int | None]]) -> None:
        """Take runs that cover the indexes after those known, through ``through``."""
        if runs:
            self.firsts = np.concatenate(
                [self.firsts, np.array([first for first, _ in runs], dtype=np.int64)])
            self.micros = np.concatenate(
                [self.micros, np.array([(t or 0) * 1000 for _, t in runs], dtype=np.int64)])
            self.known = np.concatenate(
                [self.known, np.array([t is not None for _, t in runs], dtype=bool)])
        self.through = max(self.through, through)

    def column(self, index: np.ndarray) -> pa.Array:
        """The ``timestamp`` column of rows with these (increasing) indexes: null where the
        time is unknown (written before the broker kept times)."""
        if len(index) and int(index[-1]) > self.through:
            self._cover(int(index[-1]))
        if len(self.firsts) == 0:
            return pa.nulls(len(index), type=TIMESTAMP)
        run = np.searchsorted(self.firsts, index, side="right") - 1
        found = run >= 0  # no run before the first: an index retention took meanwhile
        run = np.where(found, run, 0)
        null = ~(found & self.known[run])
        return pa.array(self.micros[run], type=TIMESTAMP, mask=null)

    def _cover(self, last: int) -> None:
        """Ask again for the times after those known, until they reach index ``last``."""
        for attempt in range(_ATTEMPTS):
            if attempt:
                time.sleep(_PAUSE)
            self._fetch(self.through + 1)
            if self.through >= last:
                return
        raise MessagingError(f"topic {self.topic}: the broker answered the append times of "
                             f"indexes through {self.through} only, not of index {last} "
                             "that it returned")
