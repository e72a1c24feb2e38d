"""Spark reads by append time: startingTimestamp, startingOffsetsByTimestamp and their
strategy, endingTimestamp, and the timestamp column, against a real broker (times as the
broker reports them at GET /messaging/times and /messaging/topics/{id}?at=)."""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.conftest import BrokerProcess
from tests.e2e.test_spark import publish

PAUSE = 0.15  # between bursts: their append times differ by at least this much

Row = tuple[int, int, bytes, int | None]  # topic, index, data, timestamp in ms


def get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url + path, timeout=10) as answer:
        return json.loads(answer.read())


def runs_of(url: str, topic: int) -> list[tuple[int, int | None]]:
    """The topic's append times as the broker reports them: (first index, ms) runs."""
    answer = get(url, f"/messaging/times?topicID={topic}&index=0")
    return [(int(first), t) for first, t in answer["runs"]]


def time_of(runs: list[tuple[int, int | None]], index: int) -> int | None:
    return [t for first, t in runs if first <= index][-1]


def bursts(url: str, topic: int, *sizes: int) -> list[tuple[list[int], int]]:
    """Publish a burst of messages per size, ``PAUSE`` apart; each burst's indexes and append
    time (one publish: one time), with data ``b"<burst>-<n>"``."""
    found = []
    for number, size in enumerate(sizes):
        if number:
            time.sleep(PAUSE)
        first, last = publish(url, topic, [b"%d-%d" % (number, n) for n in range(size)])
        indexes = list(range(first, last + 1))
        assert len(indexes) == size  # one topic only: its indexes are consecutive
        found.append(indexes)
    runs = runs_of(url, topic)
    result = []
    for indexes in found:
        times = {time_of(runs, i) for i in indexes}
        assert len(times) == 1, times
        moment = times.pop()
        assert moment is not None
        result.append((indexes, moment))
    for (_, earlier), (_, later) in itertools.pairwise(result):
        assert later - earlier >= PAUSE * 1000 * 0.9
    return result


def rows_of(frame: DataFrame) -> list[Row]:
    rows = frame.select("topic", "index", "data", F.unix_millis("timestamp").alias("ms")
                        ).collect()
    return sorted((r["topic"], r["index"], bytes(r["data"]), r["ms"]) for r in rows)


def batch(spark: SparkSession, url: str, topics: str, **options: str) -> list[Row]:
    reader = spark.read.format("messaging").option("url", url).option("topics", topics)
    for key, value in options.items():
        reader = reader.option(key, value)
    return rows_of(reader.load())


def stream(spark: SparkSession, url: str, topics: str, checkpoint: Path,
           **options: str) -> list[Row]:
    """An availableNow query's rows (with their timestamps)."""
    reader = (spark.readStream.format("messaging").option("url", url)
              .option("topics", topics))
    for key, value in options.items():
        reader = reader.option(key, value)
    collected: list[Row] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        collected.extend(rows_of(frame))

    query = (reader.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(240), "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return sorted(collected)


def expected(topic: int, indexes: list[int], burst: int, moment: int) -> list[Row]:
    return [(topic, i, b"%d-%d" % (burst, n), moment) for n, i in enumerate(indexes)]


def test_a_query_from_a_time_yields_exactly_the_rows_at_or_after_it(
        spark: SparkSession, spark_broker: BrokerProcess, tmp_path: Path) -> None:
    url = spark_broker.url
    (a, time_a), (b, time_b) = bursts(url, 101, 40, 25)
    (c, time_c), (d, time_d) = bursts(url, 102, 10, 15)
    after_b = expected(101, b, 1, time_b)
    # the boundary as the broker seeks it: the first index appended at or after the time
    assert get(url, f"/messaging/topics/101?at={time_b}")["index"] == b[0]
    assert get(url, f"/messaging/topics/101?at={time_a + 1}")["index"] == b[0]

    for moment in (time_b, time_b - 1, time_a + 1):
        assert batch(spark, url, "101", startingTimestamp=str(moment)) == after_b
    assert stream(spark, url, "101", tmp_path / "s1", startingTimestamp=str(time_b)) == after_b
    assert batch(spark, url, "101", startingTimestamp=str(time_a)) == (
        expected(101, a, 0, time_a) + after_b)

    # a time per topic: each from its second burst
    by_topic = json.dumps({"101": time_b, "102": time_d})
    both = after_b + expected(102, d, 1, time_d)
    assert batch(spark, url, "101,102", startingOffsetsByTimestamp=by_topic) == both
    assert stream(spark, url, "101,102", tmp_path / "s2",
                  startingOffsetsByTimestamp=by_topic, maxRecordsPerTrigger="7") == both
    # precedence: startingTimestamp > startingOffsetsByTimestamp > startingIndex
    assert batch(spark, url, "101,102", startingTimestamp=str(time_a),
                 startingOffsetsByTimestamp=by_topic, startingIndex="latest") == sorted(
        expected(101, a, 0, time_a) + after_b + expected(102, c, 0, time_c)
        + expected(102, d, 1, time_d))
    assert stream(spark, url, "101,102", tmp_path / "s3", startingOffsetsByTimestamp=by_topic,
                  startingIndex="latest") == both

    # a restarted query goes on from its checkpoint, not from the time again
    (e, time_e), = bursts(url, 101, 5)
    assert stream(spark, url, "101", tmp_path / "s1",
                  startingTimestamp=str(time_b)) == expected(101, e, 0, time_e)


def test_the_timestamp_column_matches_the_brokers_times(
        spark: SparkSession, spark_broker: BrokerProcess, tmp_path: Path) -> None:
    url = spark_broker.url
    bursts(url, 111, 30, 1, 20, 9)
    time.sleep(PAUSE)
    bursts(url, 112, 3)  # another topic between them: its indexes are not 111's
    time.sleep(PAUSE)
    bursts(url, 111, 12)
    runs = runs_of(url, 111)
    assert len({t for _, t in runs}) == 5
    # small partitions, each reading its times once; several per burst and across bursts
    rows = batch(spark, url, "111", partitionSize="7")
    assert len(rows) == 72
    assert [(i, ms) for _, i, _, ms in rows] == [(i, time_of(runs, i)) for _, i, _, _ in rows]
    streamed = stream(spark, url, "111", tmp_path / "s", partitionSize="7",
                      maxRecordsPerTrigger="20")
    assert streamed == rows
    assert all(isinstance(ms, int) for _, _, _, ms in rows)


def test_ending_timestamp_in_a_batch_read(spark: SparkSession,
                                          spark_broker: BrokerProcess) -> None:
    url = spark_broker.url
    (a, time_a), (b, time_b), (c, time_c) = bursts(url, 121, 10, 20, 5)
    first, second, third = (expected(121, a, 0, time_a), expected(121, b, 1, time_b),
                            expected(121, c, 2, time_c))
    assert batch(spark, url, "121", endingTimestamp=str(time_c)) == first + second
    assert batch(spark, url, "121", endingTimestamp=str(time_b + 1)) == first + second
    assert batch(spark, url, "121", endingTimestamp=str(time_b)) == first  # exclusive
    assert batch(spark, url, "121", startingTimestamp=str(time_b),
                 endingTimestamp=str(time_c)) == second
    assert batch(spark, url, "121", startingTimestamp=str(time_b),
                 endingTimestamp=str(time_b)) == []
    assert batch(spark, url, "121", endingTimestamp=str(time_a)) == []
    # nothing at or after it: the end of the topic
    assert batch(spark, url, "121", endingTimestamp=str(time_c + 60_000)) == (
        first + second + third)
    # endingTimestamp takes precedence over endingIndex
    assert batch(spark, url, "121", endingTimestamp=str(time_c),
                 endingIndex=json.dumps({"121": a[3]})) == first + second
    with pytest.raises(CapturedException, match="option startingTimestamp: topic 121 starts "
                       f"at {time_c} .*, after option endingTimestamp {time_b}"):
        batch(spark, url, "121", startingTimestamp=str(time_c), endingTimestamp=str(time_b))


def test_strategy_when_no_message_is_at_or_after_the_time(
        spark: SparkSession, spark_broker: BrokerProcess, tmp_path: Path) -> None:
    url = spark_broker.url
    (_, time_a), = bursts(url, 131, 8)
    later = str(time_a + 1)
    with pytest.raises(CapturedException, match="option startingTimestamp: topic 131 has "
                       f"no message appended at or after {time_a + 1} .*set option "
                       "startingOffsetsByTimestampStrategy to latest"):
        stream(spark, url, "131", tmp_path / "e", startingTimestamp=later)  # error: default
    for strategy in ({}, {"startingOffsetsByTimestampStrategy": "error"}):
        with pytest.raises(CapturedException, match="option startingOffsetsByTimestamp: topic "
                           "131 has no message appended"):
            batch(spark, url, "131", startingOffsetsByTimestamp=json.dumps({"131": later}),
                  **strategy)
    # a topic without any message yet is the same case
    with pytest.raises(CapturedException, match="topic 139 has no message appended"):
        batch(spark, url, "131,139", startingTimestamp=str(time_a))

    latest = {"startingOffsetsByTimestampStrategy": "latest"}
    assert batch(spark, url, "131", startingTimestamp=later, **latest) == []
    assert stream(spark, url, "131", tmp_path / "l", startingTimestamp=later, **latest) == []
    assert batch(spark, url, "131,139", startingTimestamp=str(time_a), **latest) == (
        expected(131, list(range(int(get(url, "/messaging/topics/131")["first_index"]),
                                 int(get(url, "/messaging/topics/131")["last_index"]) + 1)),
                 0, time_a))
    # the stream started at the end: it reads what comes next, and only that
    (b, time_b), = bursts(url, 131, 4)
    assert stream(spark, url, "131", tmp_path / "l", startingTimestamp=later,
                  **latest) == expected(131, b, 0, time_b)


def test_bad_time_options_are_clear(spark: SparkSession, spark_broker: BrokerProcess,
                                    tmp_path: Path) -> None:
    url = spark_broker.url
    publish(url, 141, [b"x"])
    for options, message in [
        ({"startingTimestamp": "yesterday"},
         "option startingTimestamp 'yesterday': expected a time in milliseconds since the "
         "Unix epoch, e.g. 1795600000000"),
        ({"startingTimestamp": "-1"}, "option startingTimestamp '-1'"),
        ({"endingTimestamp": "soon"}, "option endingTimestamp 'soon'"),
        ({"startingOffsetsByTimestamp": "1000"},
         "option startingOffsetsByTimestamp '1000': expected JSON"),
        ({"startingOffsetsByTimestamp": '{"142": 1000}'},
         "option startingOffsetsByTimestamp names topic '142', which is not one of option "
         "topics"),
        ({"startingOffsetsByTimestampStrategy": "earliest"},
         "option startingOffsetsByTimestampStrategy 'earliest': expected error"),
    ]:
        with pytest.raises(CapturedException, match=message):
            batch(spark, url, "141", **options)
    with pytest.raises(CapturedException, match="names no time for topic 141"):
        stream(spark, url, "141", tmp_path / "c1", startingOffsetsByTimestamp="{}")
    with pytest.raises(CapturedException, match="option endingTimestamp is for batch reads"):
        stream(spark, url, "141", tmp_path / "c2", endingTimestamp="1000")


def test_the_sink_takes_rows_with_a_timestamp(spark: SparkSession, spark_broker: BrokerProcess,
                                              tmp_path: Path) -> None:
    url = spark_broker.url
    bursts(url, 151, 30)
    source = spark.readStream.format("messaging").option("url", url).option("topics", "151")
    # every column of the read, the topic replaced: index and timestamp are left aside
    copy = source.load().withColumn("topic", F.lit(152))
    query = (copy.writeStream.format("messaging").option("url", url)
             .option("checkpointLocation", str(tmp_path / "copy")).trigger(availableNow=True)
             .start())
    assert query.awaitTermination(240)
    assert query.exception() is None, query.exception()
    copied = batch(spark, url, "152")
    assert [d for _, _, d, _ in copied] == [b"0-%d" % n for n in range(30)]
    assert all(ms is not None for _, _, _, ms in copied)
    (spark.read.format("messaging").option("url", url).option("topics", "151").load()
     .withColumn("topic", F.lit(153)).write.format("messaging").option("url", url)
     .mode("append").save())
    assert sorted(d for _, _, d, _ in batch(spark, url, "153")) == sorted(
        b"0-%d" % n for n in range(30))
