"""The idempotent producer headers of a request (native publish and Durable Streams append)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from messaging.errors import BadRequestError
from messaging.headers import PRODUCER_EPOCH_HEADER, PRODUCER_ID_HEADER, PRODUCER_SEQ_HEADER

_DIGITS = re.compile(r"[0-9]+")
_MAX_SAFE_INTEGER = 2**53 - 1


def parse_producer(headers: Mapping[str, str]) -> tuple[str, int, int] | None:
    """``Producer-Id``/``-Epoch``/``-Seq`` of a request: all three or none (400 otherwise)."""
    pid = headers.get(PRODUCER_ID_HEADER)
    epoch = headers.get(PRODUCER_EPOCH_HEADER)
    seq = headers.get(PRODUCER_SEQ_HEADER)
    if pid is None and epoch is None and seq is None:
        return None
    if pid is None or epoch is None or seq is None:
        raise BadRequestError("Producer-Id, Producer-Epoch and Producer-Seq go together")
    if not pid:
        raise BadRequestError("Producer-Id must not be empty")
    numbers = []
    for label, text in ((PRODUCER_EPOCH_HEADER, epoch), (PRODUCER_SEQ_HEADER, seq)):
        if not _DIGITS.fullmatch(text) or int(text) > _MAX_SAFE_INTEGER:
            raise BadRequestError(f"invalid {label} {text!r}: an integer 0..2^53-1")
        numbers.append(int(text))
    return pid, numbers[0], numbers[1]
