"""Wall-clock time as the broker and its clients write and read it: milliseconds since the
Unix epoch, and the forms a user may name a moment in (``since=``, ``at=``, ``--since``)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

#: What a bad moment's error names.
MOMENT_FORMS = ("an RFC 3339 time (2026-11-26T10:00:00Z), milliseconds since the Unix epoch "
                "(1795600000000), or a duration back from now (15m, 2h, 7d, 500ms)")
_AGO = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: Moments are refused past this (year 9999): they would not print as RFC 3339.
_LAST_MS = 253_402_300_799_999


def now_ms() -> int:
    """The wall clock now, in milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def parse_moment(text: str, now: int | None = None) -> int:
    """A moment in milliseconds since the epoch, from RFC 3339 text (a time zone or ``Z``
    required), an integer count of milliseconds, or a duration meaning that long before
    ``now`` (default: the clock now). ValueError names the accepted forms."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        moment = int(text)
    elif (ago := _AGO.match(text)) is not None:
        moment = (now_ms() if now is None else now) - round(
            float(ago.group(1)) * _UNIT_MS[ago.group(2)])
    else:
        try:
            parsed = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise ValueError(f"invalid time {text!r}: use {MOMENT_FORMS}") from None
        if parsed.tzinfo is None:
            raise ValueError(f"invalid time {text!r}: give a time zone (Z or +01:00); "
                             f"use {MOMENT_FORMS}")
        moment = round(parsed.timestamp() * 1000)
    if not 0 <= moment <= _LAST_MS:
        raise ValueError(f"invalid time {text!r}: out of range; use {MOMENT_FORMS}")
    return moment


def format_moment(ms: int) -> str:
    """RFC 3339 text of a moment, in UTC with milliseconds."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
