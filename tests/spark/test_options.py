"""The Spark source's options by time (startingTimestamp, startingOffsetsByTimestamp,
startingOffsetsByTimestampStrategy, endingTimestamp) and the mapping of append times onto
rows, without Spark or a broker (brokers are stand-ins answering what a broker would)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from messaging.errors import MessagingError
from messaging.spark import times as times_module
from messaging.spark.options import SourceOptions
from messaging.spark.source import MessagingStreamReader, Planner
from messaging.spark.times import TIMESTAMP, AppendTimes

URL = "http://127.0.0.1:1"


def options(**given: str) -> SourceOptions:
    return SourceOptions({"url": URL, "topics": "1,2", **given})


# -- precedence -----------------------------------------------------------------------------


def test_starting_timestamp_takes_precedence_over_the_others() -> None:
    parsed = options(startingTimestamp="1000", startingOffsetsByTimestamp='{"1": 5, "2": 6}',
                     startingIndex="latest")
    assert parsed.start_option == "startingTimestamp"
    assert parsed.start_times == {1: 1000, 2: 1000}


def test_starting_offsets_by_timestamp_takes_precedence_over_starting_index() -> None:
    parsed = options(startingOffsetsByTimestamp='{"1": 5, "2": "6"}', startingIndex="latest")
    assert parsed.start_option == "startingOffsetsByTimestamp"
    assert parsed.start_times == {1: 5, 2: 6}


def test_without_a_time_the_index_options_decide() -> None:
    parsed = options(startingIndex="latest")
    assert (parsed.start_option, parsed.start_times) == (None, None)
    assert parsed.starting == "latest" and parsed.ending_time is None
    assert parsed.strategy == "error" and parsed.ending_given == []


def test_option_names_are_case_insensitive() -> None:
    parsed = SourceOptions({"URL": URL, "Topics": "1", "STARTINGTIMESTAMP": " 7 ",
                            "startingoffsetsbytimestampstrategy": "LATEST",
                            "EndingTimestamp": "9"})
    assert parsed.start_times == {1: 7} and parsed.strategy == "latest"
    assert parsed.ending_time == 9 and parsed.ending_given == ["endingTimestamp"]


# -- clear errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "message"), [
    ({"startingTimestamp": "yesterday"}, "option startingTimestamp 'yesterday': expected a "
                                         "time in milliseconds since the Unix epoch"),
    ({"startingTimestamp": "-5"}, "option startingTimestamp '-5': expected a time"),
    ({"startingTimestamp": "1.5"}, "option startingTimestamp '1.5'"),
    ({"startingTimestamp": ""}, "option startingTimestamp '': expected a time"),
    ({"startingTimestamp": str(1 << 63)}, "option startingTimestamp"),
    ({"endingTimestamp": "2024-01-01"}, "option endingTimestamp '2024-01-01': expected a time"),
    ({"startingOffsetsByTimestamp": "1000"}, 'expected JSON with a time .* like {"1": '),
    ({"startingOffsetsByTimestamp": "{oops"}, "option startingOffsetsByTimestamp '{oops'"),
    ({"startingOffsetsByTimestamp": '{"1": 5}'}, "names no time for topic 2"),
    ({"startingOffsetsByTimestamp": '{"1": 5, "2": 5, "3": 5}'},
     "names topic '3', which is not one of option topics \\(1,2\\)"),
    ({"startingOffsetsByTimestamp": '{"x": 5, "2": 5}'}, "names topic 'x'"),
    ({"startingOffsetsByTimestamp": '{"1": -1, "2": 5}'}, "topic 1: -1: expected a time"),
    ({"startingOffsetsByTimestamp": '{"1": 1.5, "2": 5}'}, "topic 1: 1.5"),
    ({"startingOffsetsByTimestamp": '{"1": true, "2": 5}'}, "topic 1: True"),
    # checked even when startingTimestamp takes precedence: a bad value is a mistake
    ({"startingTimestamp": "5", "startingOffsetsByTimestamp": "[]"},
     "option startingOffsetsByTimestamp '\\[\\]'"),
    ({"startingOffsetsByTimestampStrategy": "earliest"},
     "option startingOffsetsByTimestampStrategy 'earliest': expected error .* or latest"),
    ({"startingTimestamp": "2000", "endingTimestamp": "1000"},
     "option startingTimestamp: topic 1 starts at 2000 .*, after option endingTimestamp 1000"),
    ({"startingOffsetsByTimestamp": '{"1": 500, "2": 1500}', "endingTimestamp": "1000"},
     "option startingOffsetsByTimestamp: topic 2 starts at 1500"),
])
def test_bad_values_name_their_option(given: dict[str, str], message: str) -> None:
    with pytest.raises(MessagingError, match=message):
        options(**given)


def test_a_stream_refuses_an_end() -> None:
    for name in ("endingTimestamp", "endingIndex"):
        value = "1000" if name == "endingTimestamp" else "latest"
        with pytest.raises(MessagingError, match=f"option {name} is for batch reads"):
            MessagingStreamReader({"url": URL, "topics": "1", name: value})


def test_start_at_the_end_time_reads_nothing_but_is_allowed() -> None:
    assert options(startingTimestamp="1000", endingTimestamp="1000").ending_time == 1000


# -- resolving times to indexes -----------------------------------------------------------


class FakeBroker:
    """What a broker answers: topic -> [(index, time)] of its messages."""

    def __init__(self, messages: dict[int, list[tuple[int, int | None]]]) -> None:
        self.messages = messages

    def index_at(self, topic: int, time_ms: int) -> int | None:
        return next((i for i, t in self.messages.get(topic, []) if t is not None
                     and t >= time_ms), None)

    def topic(self, topic: int, after: int | None = None, count: int | None = None,
              at: int | None = None) -> dict[str, Any] | None:
        found = self.messages.get(topic)
        if not found:
            return None
        return {"first_index": found[0][0], "last_index": found[-1][0]}

    def broker_index(self, topic: int) -> int:
        return max(i for found in self.messages.values() for i, _ in found)


def planner(broker: FakeBroker, **given: str) -> Planner:
    plan = Planner(options(**given))
    plan.broker = broker  # type: ignore[assignment]
    return plan


BROKER = FakeBroker({1: [(1, None), (2, 100), (3, 100), (6, 250)],
                     2: [(4, 120), (5, 200)]})


def test_a_time_starts_each_topic_at_its_first_message_at_or_after_it() -> None:
    assert planner(BROKER, startingTimestamp="100").start() == {"1": 2, "2": 4}
    assert planner(BROKER, startingTimestamp="101").start() == {"1": 6, "2": 4}
    assert planner(BROKER, startingTimestamp="0").start() == {"1": 2, "2": 4}
    assert planner(BROKER, startingOffsetsByTimestamp='{"1": 250, "2": 121}').start() == {
        "1": 6, "2": 5}


def test_strategy_when_a_topic_has_nothing_at_or_after_the_time() -> None:
    with pytest.raises(MessagingError, match=r"option startingTimestamp: topic 2 has no message "
                       r"appended at or after 201 .*set option startingOffsetsByTimestampStrat"):
        planner(BROKER, startingTimestamp="201").start()
    with pytest.raises(MessagingError, match="option startingOffsetsByTimestamp: topic 1 has "
                       "no message appended at or after 251"):
        planner(BROKER, startingOffsetsByTimestamp='{"1": 251, "2": 0}').start()
    latest = planner(BROKER, startingTimestamp="201",
                     startingOffsetsByTimestampStrategy="latest")
    assert latest.start() == {"1": 6, "2": 6}  # 2 is at its end; 1 has 6 at 250
    nothing = planner(FakeBroker({}), startingTimestamp="5",
                      startingOffsetsByTimestampStrategy="latest")
    nothing.broker.broker_index = lambda topic: 41  # type: ignore[method-assign]
    assert nothing.start() == {"1": 42, "2": 42}  # no message yet: after the last index


def test_ending_timestamp_ends_before_the_first_message_at_or_after_it() -> None:
    assert planner(BROKER, endingTimestamp="200").end() == {"1": 6, "2": 5}
    assert planner(BROKER, endingTimestamp="300").end() == {"1": 7, "2": 6}  # at the end
    assert planner(BROKER, endingTimestamp="0").end() == {"1": 2, "2": 4}
    assert planner(BROKER, endingIndex='{"1": 3, "2": 5}').end() == {"1": 3, "2": 5}


# -- the timestamp column -------------------------------------------------------------------


class TimesBroker:
    """Answers /messaging/times from runs, reaching at most ``reach`` per answer."""

    def __init__(self, runs: list[tuple[int, int | None]], last: int,
                 reach: list[int] | None = None) -> None:
        self.runs = runs
        self.last = last
        self.reach = reach or []
        self.asked: list[tuple[int, int]] = []

    def times(self, topic: int, start: int, end: int,
              ) -> tuple[int, list[tuple[int, int | None]]]:
        self.asked.append((start, end))
        through = min(end - 1, self.reach.pop(0) if self.reach else self.last)
        found = [(max(first, start), t) for n, (first, t) in enumerate(self.runs)
                 if first <= through and (n + 1 == len(self.runs)
                                          or self.runs[n + 1][0] > start)]
        return through, found


def test_times_map_onto_rows_with_one_request() -> None:
    broker = TimesBroker([(1, None), (5, 1000), (9, 1000), (12, 2500)], last=20)
    times = AppendTimes(broker, 7, 3, 21)  # type: ignore[arg-type]
    index = np.array([3, 4, 5, 8, 12, 13, 20], dtype=np.int64)
    column = times.column(index)
    assert column.type == TIMESTAMP
    micros = [None if v is None else v // 1000 for v in column.cast("int64").to_pylist()]
    assert micros == [None, None, 1000, 1000, 2500, 2500, 2500]
    assert broker.asked == [(3, 21)]
    assert times.column(np.array([], dtype=np.int64)).to_pylist() == []


def test_times_are_asked_again_when_an_answer_stops_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(times_module, "_PAUSE", 0)
    broker = TimesBroker([(1, 10), (6, 20)], last=9, reach=[4, 4, 7])
    times = AppendTimes(broker, 7, 1, 10)  # type: ignore[arg-type]
    first = times.column(np.array([1, 2, 4], dtype=np.int64))
    assert broker.asked == [(1, 10)]
    later = times.column(np.array([5, 6, 7], dtype=np.int64))
    assert broker.asked == [(1, 10), (5, 10), (5, 10)]
    assert first.cast("int64").to_pylist() == [10_000] * 3
    assert later.cast("int64").to_pylist() == [10_000, 20_000, 20_000]
    stuck = TimesBroker([(1, 10)], last=9, reach=[3] * 10)
    short = AppendTimes(stuck, 7, 1, 10)  # type: ignore[arg-type]
    with pytest.raises(MessagingError, match="topic 7: the broker answered the append times "
                       "of indexes through 3 only, not of index 8"):
        short.column(np.array([2, 8], dtype=np.int64))
    assert len(stuck.asked) == 1 + times_module._ATTEMPTS


def test_messages_from_before_times_have_none() -> None:
    times = AppendTimes(TimesBroker([(1, None)], last=4), 7, 1, 5)  # type: ignore[arg-type]
    assert times.column(np.array([1, 2, 4], dtype=np.int64)).to_pylist() == [None] * 3
