"""Ids and indexes in JSON (messaging.json_ids): every u64 survives a reader that parses JSON
numbers as doubles, as JavaScript's JSON.parse and jq do, and comes back in either form."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.json_ids import SAFE_LIMIT, U64_LIMIT, dumps, jsonable, parse_u64, with_integers

u64 = st.one_of(st.integers(0, U64_LIMIT - 1),
                st.integers(SAFE_LIMIT - 4, SAFE_LIMIT + 4),  # the edge, hit every run
                st.integers(U64_LIMIT - 4, U64_LIMIT - 1),
                st.integers(1 << 63, (1 << 63) + (1 << 50)))  # named streams' ids


def javascript_parse(text: str) -> Any:
    """JSON.parse's view of a document: every number is a double."""
    return json.loads(text, parse_int=float)


@given(u64)
def test_every_u64_round_trips_through_a_double_reader(value: int) -> None:
    parsed = javascript_parse(dumps({"id": value}))["id"]
    if isinstance(parsed, float):  # only numbers a double holds exactly are numbers
        assert value < SAFE_LIMIT and parsed == value and int(parsed) == value
    else:
        assert value >= SAFE_LIMIT and parsed == str(value)
    assert parse_u64(parsed if isinstance(parsed, str) else int(parsed)) == value
    assert parse_u64(json.loads(dumps(value))) == value  # a plain JSON reader too


def test_numbers_below_the_limit_stay_numbers() -> None:
    assert dumps([0, SAFE_LIMIT - 1, SAFE_LIMIT, 1 << 63]) == (
        f'[0, {SAFE_LIMIT - 1}, "{SAFE_LIMIT}", "{1 << 63}"]')
    assert dumps(-SAFE_LIMIT) == f'"{-SAFE_LIMIT}"'


def test_jsonable_walks_containers_and_leaves_other_values() -> None:
    value = {"a": [1, (2, 1 << 60)], "b": {"c": True, "d": None, "e": 1.5, "f": "7"}}
    assert jsonable(value) == {"a": [1, [2, str(1 << 60)]],
                               "b": {"c": True, "d": None, "e": 1.5, "f": "7"}}


@pytest.mark.parametrize("value", [0, 7, "0", "18446744073709551615", U64_LIMIT - 1,
                                   "9223372036854775808"])
def test_parse_u64_takes_a_number_or_a_decimal_string(value: object) -> None:
    assert parse_u64(value) == int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize("value", [True, False, None, 1.0, 1e3, -1, "-1", "+1", " 1", "1 ",
                                   "1.0", "1e3", "0x10", "１２", "1_0", "", U64_LIMIT,
                                   str(U64_LIMIT), "9" * 21, [1], {"id": 1}])
def test_parse_u64_refuses_everything_else(value: object) -> None:
    with pytest.raises(ValueError, match="invalid index"):
        parse_u64(value, "index")


def test_with_integers_reads_fields_and_maps_in_either_form() -> None:
    row = {"id": str(1 << 63), "first_index": 1, "index": None, "name": "42",
           "subscribers": {"a": "9007199254740993", "b": 2}}
    assert with_integers(row, ("id", "first_index", "index", "subscribers", "missing")) == {
        "id": 1 << 63, "first_index": 1, "index": None, "name": "42",
        "subscribers": {"a": 9007199254740993, "b": 2}}
    with pytest.raises(ValueError, match="invalid id"):
        with_integers({"id": "x"}, ("id",))
