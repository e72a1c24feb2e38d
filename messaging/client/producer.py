"""Idempotent producer state on the client side: ids, epochs and sequence numbers.

A publish carries ``Producer-Id``/``Producer-Epoch``/``Producer-Seq``; the broker's state
machine stores a request once however often it arrives (see :mod:`messaging.broker.catalog`), so a
publish whose answer was lost is simply sent again. Sequence numbers must reach the broker in
order, so a producer has one request in flight at a time: concurrent publishes to a topic
each take a :class:`Lane` of their own (a producer id) from a pool, and give it back when
their answer is known.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from messaging.errors import ClientError, MessagingError
from messaging.headers import PRODUCER_EPOCH_HEADER, PRODUCER_ID_HEADER, PRODUCER_SEQ_HEADER


@dataclass(slots=True)
class Lane:
    """One producer id on one topic, with the sequence number of its next request."""

    id: str
    topic: int
    epoch: int = 0
    seq: int = 0

    def headers(self) -> dict[str, str]:
        """The producer headers of the lane's next request."""
        return {PRODUCER_ID_HEADER: self.id, PRODUCER_EPOCH_HEADER: str(self.epoch),
                PRODUCER_SEQ_HEADER: str(self.seq)}


class Lanes:
    """Producer lanes per topic for one client (ids ``<client id>.<n>``)."""

    def __init__(self, client_id: str | None = None) -> None:
        self.client_id = client_id or uuid.uuid4().hex
        self._idle: dict[int, list[Lane]] = {}
        self._made = 0

    def take(self, topic: int) -> Lane:
        """A lane with no request in flight (a new one when all are busy)."""
        idle = self._idle.get(topic)
        if idle:
            return idle.pop()
        self._made += 1
        return Lane(f"{self.client_id}.{self._made}", topic)

    def give_back(self, lane: Lane, error: BaseException | None = None) -> None:
        """Return a lane once its request's outcome is known.

        Accepted (``error`` None): the next request takes the next sequence number. Refused
        by the broker (an error answer, so nothing was stored): the sequence number is used
        again. When the outcome stays unknown (no answer after every retry) or the broker
        fenced the lane, the lane is dropped: a later request could otherwise collide with a
        request of it that is still on its way.
        """
        if error is None:
            lane.seq += 1
        elif not _refused(error):
            return
        self._idle.setdefault(lane.topic, []).append(lane)


def _refused(error: BaseException) -> bool:
    """Whether the broker answered ``error`` without storing anything."""
    if not isinstance(error, MessagingError) or isinstance(error, ClientError):
        return False
    return 400 <= error.status < 600 and error.status not in (403, 409, 504)
