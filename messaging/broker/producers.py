"""Idempotent producers' state on a topic: ``Producer-Id`` -> epoch, last accepted sequence
number (with the index range that stored it) and when it was last used; the decision a new
request gets (accept, duplicate, fenced, gap) and the table's bounds.

Kept per stream and per native topic in the catalog, changed only by applied commands in the
same group transaction as the append, so "exactly once within an epoch" survives crashes and
failover (see :mod:`messaging.broker.state_log`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from messaging.errors import BadRequestError, ProducerFencedError, ProducerSequenceGapError

#: Producer entries unused this long are forgotten (seconds).
PRODUCER_TTL = 7 * 24 * 3600.0
#: At most this many producers are remembered per stream.
MAX_PRODUCERS = 10_000

@dataclass(slots=True)
class Producer:
    """An idempotent producer's state on one topic: its epoch, the last sequence number it
    had accepted (with the index range that stored it), and when it was last used."""

    epoch: int
    seq: int
    used: float
    first: int = 0
    last: int = 0


def check_producer(producers: dict[str, Producer], producer: list[Any], now: float,
                   span: int = 1) -> tuple[Producer | None, Producer | None]:
    """Validate ``[id, epoch, seq]`` against a topic's producers (PROTOCOL.md §5.2.1).

    ``span`` is how many sequence numbers the request takes (1 for an HTTP request; a Kafka
    record batch takes one per record, from its base sequence ``seq``): the state then keeps
    the last one, ``seq + span - 1``, and the next request must start right after it.

    Returns ``(new state, None)`` to accept, ``(None, state)`` for a duplicate; raises
    :class:`ProducerFencedError` (403), :class:`ProducerSequenceGapError` (409) or
    :class:`BadRequestError` (a new epoch not starting at 0).
    """
    pid, epoch, seq = str(producer[0]), int(producer[1]), int(producer[2])
    last = seq + span - 1
    state = producers.get(pid)
    if state is not None and now - state.used > PRODUCER_TTL:
        state = None
    if state is None:
        if seq != 0:
            raise ProducerSequenceGapError(
                f"producer {pid!r} is new here and must start at seq 0", 0, seq)
        return Producer(epoch, last, now), None
    if epoch < state.epoch:
        raise ProducerFencedError(f"producer {pid!r} epoch {epoch} is stale (the topic has "
                                  f"epoch {state.epoch})", state.epoch)
    if epoch > state.epoch:
        if seq != 0:
            raise BadRequestError(f"producer {pid!r}: a new epoch must start at seq 0")
        return Producer(epoch, last, now), None
    if last <= state.seq:
        return None, state
    if seq == state.seq + 1:
        return Producer(epoch, last, now), None
    raise ProducerSequenceGapError(f"producer {pid!r} sent seq {seq}, expected {state.seq + 1}",
                                   state.seq + 1, seq)


def expired_producers(producers: dict[str, Producer], now: float) -> list[str]:
    """The producers a table forgets after a change: unused for PRODUCER_TTL, then the
    oldest beyond MAX_PRODUCERS (among equally old ones, by id: the same on every node
    whatever order its table was rebuilt in, from the journal or a snapshot)."""
    gone = [p for p, s in producers.items() if now - s.used > PRODUCER_TTL]
    if len(producers) - len(gone) > MAX_PRODUCERS:
        dropped = set(gone)
        oldest = sorted((p for p in producers if p not in dropped),
                        key=lambda p: (producers[p].used, p))
        gone += oldest[:len(producers) - len(gone) - MAX_PRODUCERS]
    return gone


def state_list(state: Producer | None) -> list[Any] | None:
    """A producer's state as the state journal's change entries hold it (None: dropped)."""
    if state is None:
        return None
    return [state.epoch, state.seq, state.used, state.first, state.last]


def apply_changes(table: dict[str, Producer], changes: dict[str, list[Any] | None]) -> None:
    """Apply a journal line's producer changes (pid -> :func:`state_list` or None) to
    ``table`` in place."""
    for pid, state in changes.items():
        if state is None:
            table.pop(pid, None)
        else:
            table[pid] = Producer(*state)
