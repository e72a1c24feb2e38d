"""A moment a request names (``since=``, ``at=``): RFC 3339 with a zone, ms since the epoch,
or a duration back from now; a 400 naming those forms for anything else."""

from __future__ import annotations

from messaging.clock import parse_moment
from messaging.errors import BadRequestError


def parse_time(value: str, name: str) -> int:
    """The moment ``value`` names (ms since the epoch); 400 naming the accepted forms."""
    try:
        return parse_moment(value)
    except ValueError as err:
        raise BadRequestError(str(err).replace("invalid time", f"invalid {name}", 1)) from None
