"""What the soak's load generator did and saw: every publish acknowledged (topic, index,
publisher tag), every subscription and range read with the indexes and tags it received,
and the errors met. The checks (:mod:`bench.soak.checks`) compare the readers against it."""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field

from messaging.errors import MessagingError

TOPICS = (1, 2, 3, 4)


@dataclass
class Session:
    """One streaming subscription and what it received (indexes and publisher tags)."""

    kind: str  # follower | laggard | slow
    topic: int
    url: str
    start: int
    opened_at: float = 0.0
    closed_at: float = 0.0
    indexes: array[int] = field(default_factory=lambda: array("Q"))
    tags: array[int] = field(default_factory=lambda: array("q"))
    error: str = ""
    error_at: float = 0.0
    truncated_first: int = 0  # X-Broker-First-Index of a 410
    reconnects: int = 0
    resumed: bool = False  # started where an earlier session with this id stopped
    next_index: int = 0  # where a resumed session starts: the last heartbeated index + 1


@dataclass
class RangeRead:
    """One non-streaming read: what was asked, the topic's last index then, what came back."""

    topic: int
    index: int
    end: int | None
    limit: int | None
    last_index: int
    indexes: array[int] = field(default_factory=lambda: array("Q"))
    tags: array[int] = field(default_factory=lambda: array("q"))
    truncated_first: int = 0  # set when the answer was 410


@dataclass
class Ledger:
    """What the load generator did and saw; the checks compare readers against ``acked``."""

    acked: dict[int, dict[int, int]] = field(default_factory=lambda: {t: {} for t in TOPICS})
    unknown: set[int] = field(default_factory=set)  # tags of publishes with unknown outcome
    sessions: list[Session] = field(default_factory=list)
    reads: list[RangeRead] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)  # unexpected, by operation and status
    expected: Counter[str] = field(default_factory=Counter)  # 410s the design allows
    anomalies: list[str] = field(default_factory=list)
    published = 0
    delivered = 0
    range_messages = 0
    open_sessions = 0
    time_reads = 0  # reads with append times, and reads since= one of them
    time_problems: list[str] = field(default_factory=list)
    window_single: list[float] = field(default_factory=list)
    window_batch: list[float] = field(default_factory=list)

    def ack(self, topic: int, index: int, tag: int) -> None:
        self.acked[topic][index] = tag
        self.published += 1

    def error(self, operation: str, err: BaseException) -> None:
        status = err.status if isinstance(err, MessagingError) else type(err).__name__
        self.errors[f"{operation} {status}"] += 1
