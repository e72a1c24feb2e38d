"""Topic ids and indexes in JSON, exact for every reader: the one rule, shared by every room.

Topic ids and indexes are u64, and named streams' ids are 2^63 and up, but JavaScript (and
``jq``) read every JSON number as a double: past 2^53 - 1 (``Number.MAX_SAFE_INTEGER``) a
number is silently rounded, and the id read back names another topic. So:

- **written**: every integer whose magnitude is 2^53 or more is a JSON *string* of its decimal
  digits; smaller ones stay numbers, as they always were (existing clients keep working, and
  every id a native topic is likely to have stays a number). :func:`jsonable` applies the
  rule to a whole answer, :func:`dumps` serialises with it.
- **read**: an id or index may come as a number or as a decimal string
  (:func:`parse_u64`); anything else (a fraction, a sign, spaces, a boolean) is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

#: The first integer a double cannot hold together with its neighbours (2^53).
SAFE_LIMIT = 1 << 53
#: One past the largest u64.
U64_LIMIT = 1 << 64
_MAX_DIGITS = len(str(U64_LIMIT - 1))


def json_integer(value: int) -> int | str:
    """``value`` as JSON writes it: a number when a double holds it exactly, else a string."""
    return value if -SAFE_LIMIT < value < SAFE_LIMIT else str(value)


def jsonable(value: Any) -> Any:
    """``value`` (dicts, lists and tuples of JSON values) with :func:`json_integer` applied to
    every integer in it (booleans are left alone)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return json_integer(value)
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` of :func:`jsonable` ``(value)``: what every JSON answer is made with."""
    return json.dumps(jsonable(value), **options)


def parse_u64(value: object, what: str = "value") -> int:
    """A u64 given as a JSON number or a decimal string (ASCII digits only); ValueError naming
    ``what`` for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif (isinstance(value, str) and value.isascii() and value.isdigit()
          and len(value) <= _MAX_DIGITS):
        number = int(value)
    else:
        raise ValueError(f"invalid {what} {value!r}: expected an unsigned integer (a number "
                         "or a string of decimal digits)")
    if not 0 <= number < U64_LIMIT:
        raise ValueError(f"invalid {what} {value!r}: expected an unsigned integer below 2^64")
    return number


def with_integers(row: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """A copy of ``row`` whose ``fields`` (those present and not null) are read with
    :func:`parse_u64`, whichever form they came in; a map (``{"url": index}``) has each of
    its values read so."""
    result = dict(row)
    for field in fields:
        value = result.get(field)
        if isinstance(value, Mapping):
            result[field] = {key: parse_u64(item, f"{field}[{key!r}]")
                             for key, item in value.items()}
        elif value is not None:
            result[field] = parse_u64(value, field)
    return result
