"""Spark reads and writes topics through the messaging data source, against a real broker."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import SparkSession

from messaging.client.client import Client
from messaging.errors import ConnectionFailedError
from messaging.frames import encode_batch
from messaging.spark.broker_http import BrokerHTTP
from tests.conftest import BrokerProcess
from tests.proxy import FaultProxy, dead_url


def publish(url: str, topic: int, datas: list[bytes]) -> tuple[int, int]:
    async def run() -> tuple[int, int]:
        async with Client(url) as client:
            return await client.publish_batch(topic, datas)

    return asyncio.run(run())


def topic_info(url: str, topic: int) -> dict:
    async def run() -> dict:
        async with Client(url) as client:
            return await client.topic(topic)

    return asyncio.run(run())


def drain(spark: SparkSession, url: str, topics: str, checkpoint: Path, **options: str):
    """Run an availableNow query into a memory table; returns (rows, batch sizes)."""
    name = f"out_{abs(hash((str(checkpoint), topics))) % 10**8}"
    reader = (spark.readStream.format("messaging").option("url", url)
              .option("topics", topics))
    for key, value in options.items():
        reader = reader.option(key, value)
    sizes: list[int] = []

    def collect(batch, batch_id: int) -> None:
        rows = batch.collect()
        sizes.append(len(rows))
        # Row is a tuple: r.index would be tuple.index, so columns are read by name.
        collected.extend((r["topic"], r["index"], r["type"], bytes(r["data"])) for r in rows)

    collected: list[tuple[int, int, int, bytes]] = []
    query = (reader.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
             .queryName(name).start())
    assert query.awaitTermination(240), "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return collected, [s for s in sizes if s]


def test_available_now_with_admission_control_and_restart(spark: SparkSession,
                                                          spark_broker: BrokerProcess,
                                                          tmp_path: Path) -> None:
    url = spark_broker.url
    first_a = publish(url, 11, [b"a%05d" % i for i in range(25_000)])
    first_b = publish(url, 12, [b"b%05d" % i for i in range(25_000)])
    checkpoint = tmp_path / "checkpoint"
    rows, sizes = drain(spark, url, "11,12", checkpoint, maxRecordsPerTrigger="8000",
                        partitionSize="3000")
    assert len(rows) == 50_000
    assert len({(t, i) for t, i, _, _ in rows}) == 50_000  # every row once
    assert max(sizes) <= 8000 and len(sizes) >= 7  # capped batches
    by_topic: dict[int, list[tuple[int, bytes]]] = {11: [], 12: []}
    for topic, index, type_, data in sorted(rows):
        by_topic[topic].append((index, data))
        assert type_ == 1
    assert by_topic[11][0] == (first_a[0], b"a00000")
    assert [d for _, d in by_topic[12]] == [b"b%05d" % i for i in range(25_000)]

    publish(url, 11, [b"later-a%d" % i for i in range(300)])
    publish(url, 12, [b"later-b%d" % i for i in range(200)])
    again, _ = drain(spark, url, "11,12", checkpoint, maxRecordsPerTrigger="8000")
    assert sorted(d for _, _, _, d in again) == sorted(
        [b"later-a%d" % i for i in range(300)] + [b"later-b%d" % i for i in range(200)])
    assert first_b[1] < min(i for _, i, _, _ in again)


def test_starting_index_variants(spark: SparkSession, spark_broker: BrokerProcess,
                                 tmp_path: Path) -> None:
    url = spark_broker.url
    first, _ = publish(url, 21, [b"x%d" % i for i in range(10)])
    rows, _ = drain(spark, url, "21", tmp_path / "c1", startingIndex="latest")
    assert rows == []
    rows, _ = drain(spark, url, "21", tmp_path / "c2",
                    startingIndex=json.dumps({"21": first + 7}))
    assert [d for _, _, _, d in rows] == [b"x7", b"x8", b"x9"]
    rows, _ = drain(spark, url, "21", tmp_path / "c3", startingIndex="earliest")
    assert len(rows) == 10
    with pytest.raises(CapturedException, match="names no index for topic 21"):
        drain(spark, url, "21", tmp_path / "c4", startingIndex='{"99": 1}')


def test_batch_read_of_a_range(spark: SparkSession, spark_broker: BrokerProcess) -> None:
    url = spark_broker.url
    first, _ = publish(url, 31, [b"r%d" % i for i in range(100)])
    df = (spark.read.format("messaging").option("url", url).option("topics", "31")
          .option("startingIndex", json.dumps({"31": first + 10}))
          .option("endingIndex", json.dumps({"31": first + 20}))
          .option("partitionSize", "3").load())
    assert df.rdd.getNumPartitions() == 4
    rows = sorted(df.collect(), key=lambda r: int(r["index"]))
    assert [bytes(r.data) for r in rows] == [b"r%d" % i for i in range(10, 20)]
    assert df.count() == 10
    whole = spark.read.format("messaging").option("url", url).option("topics", "31").load()
    assert whole.count() == 100


def test_fail_on_data_loss_both_ways(spark: SparkSession, tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path / "data", "--max-segment-size", "1K",
                            "--max-topic-size", "2K").start()
    try:
        url = process.url
        publish(url, 41, [b"y" * 100 for _ in range(60)])
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(
            f"{url}/messaging/retention", method="POST"), timeout=10).read()
        first_kept = topic_info(url, 41)["first_index"]
        assert first_kept > 1
        with pytest.raises(CapturedException, match=f"first available index is {first_kept}"):
            drain(spark, url, "41", tmp_path / "strict", startingIndex='{"41": 1}')
        rows, _ = drain(spark, url, "41", tmp_path / "lenient", startingIndex='{"41": 1}',
                        failOnDataLoss="false")
        assert sorted(i for _, i, _, _ in rows)[0] == first_kept
        assert len(rows) == 60 - first_kept + 1
    finally:
        process.terminate()


def test_sink_round_trip(spark: SparkSession, spark_broker: BrokerProcess,
                         tmp_path: Path) -> None:
    url = spark_broker.url
    publish(url, 51, [b"%d" % i for i in range(1000)])
    source = (spark.readStream.format("messaging").option("url", url).option("topics", "51")
              .load())
    doubled = source.selectExpr("52 AS topic", "CAST(CAST(CAST(data AS STRING) AS INT) * 2 "
                                "AS STRING) AS data", "7 AS type")
    query = (doubled.writeStream.format("messaging").option("url", url)
             .option("checkpointLocation", str(tmp_path / "sink")).trigger(availableNow=True)
             .start())
    assert query.awaitTermination(240)
    assert query.exception() is None

    async def read_back() -> list:
        async with Client(url) as client:
            return await client.read(52)

    messages = asyncio.run(read_back())
    assert sorted(int(m.data) for m in messages) == [2 * i for i in range(1000)]
    assert {m.type for m in messages} == {7}
    spark.createDataFrame([(53, b"batch write")], "topic long, data binary").write.format(
        "messaging").option("url", url).mode("append").save()
    assert topic_info(url, 53)["last_index"] > 0


def test_bad_options_are_clear(spark: SparkSession, spark_broker: BrokerProcess) -> None:
    with pytest.raises(CapturedException, match="option topics"):
        spark.read.format("messaging").option("url", spark_broker.url).load().count()
    with pytest.raises(CapturedException, match="maxRecordsPerTrigger"):
        (spark.read.format("messaging").option("url", spark_broker.url)
         .option("topics", "1").option("maxRecordsPerTrigger", "-3").load().count())


def test_example_pipeline_end_to_end(spark: SparkSession, spark_broker: BrokerProcess,
                                     tmp_path: Path) -> None:
    from examples.generate_events import make_events, publish_events
    from examples.spark_pipeline import start

    url = spark_broker.url
    events = make_events(500, minutes=3, seed=7)
    asyncio.run(publish_events(url, 61, events))
    query = start(spark, url, 61, 62, str(tmp_path / "parquet"), str(tmp_path / "ckpt"),
                  available_now=True)
    assert query.awaitTermination(240)
    assert query.exception() is None
    expected: dict[tuple[str, str], int] = {}
    for event in events:
        minute = str(event["ts"])[:16]
        key = (minute, str(event["key"]))
        expected[key] = expected.get(key, 0) + 1
    table = spark.read.parquet(str(tmp_path / "parquet")).collect()
    got = {(r["minute"].astimezone(datetime.UTC).isoformat()[:16], r["key"]): r["events"]
           for r in table}
    assert got == expected

    async def read_back() -> list:
        async with Client(url) as client:
            return await client.read(62)

    published = [json.loads(m.data) for m in asyncio.run(read_back())]
    assert sum(p["events"] for p in published) == 500


@contextlib.contextmanager
def redirecting_server(target: str) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every request with a 307 to ``target``."""

    class Redirect(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(307)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_broker_http_fails_over_and_follows_redirects(spark_broker: BrokerProcess) -> None:
    url = spark_broker.url
    _, last = publish(url, 71, [b"h"])
    broker = BrokerHTTP([dead_url(), url])
    assert (broker.topic(71) or {}).get("last_index") == last
    assert broker.brokers.order(write=False)[0] == url  # past the URL that refused
    with redirecting_server(url) as redirecting:
        broker = BrokerHTTP([redirecting])
        broker.publish_frames(encode_batch(71, [b"redirected"], 1))
        assert broker.brokers.leader == url
        assert (broker.topic(71) or {}).get("last_index", 0) > last
    dead = dead_url()
    with pytest.raises(ConnectionFailedError, match=f"^no broker reachable: {dead}: ") as info:
        BrokerHTTP([dead]).topic(71)
    assert info.value.refused


def test_sink_exactly_once_across_task_retries_and_restarts(
        spark: SparkSession, spark_broker: BrokerProcess, tmp_path: Path) -> None:
    """Publishes whose answers are lost fail their tasks, which Spark retries; a streaming
    query that fails mid-batch is restarted from its checkpoint: every row is stored once."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    url = spark_broker.url

    async def read_back(topic: int) -> list[int]:
        async with Client(url) as client:
            return [int(m.data) for m in await client.read(topic)]

    # A task retry: the proxy forwards a publish but drops its answer, so the task that sent
    # it fails after part of its rows (and that publish) were stored; Spark runs it again.
    with _proxy_in_thread(int(url.rsplit(":", 1)[1])) as proxy:
        proxy.drop_connections = {6}
        rows = spark.range(0, 2000, numPartitions=2).select(
            F.lit(81).alias("topic"), F.col("id").cast("string").alias("data"))
        rows.write.format("messaging").option("url", proxy.url) \
            .option("maxPublishBytes", "600").mode("append").save()
        assert proxy.connections > 6, proxy.connections
    stored = asyncio.run(read_back(81))
    assert sorted(stored) == list(range(2000)), (len(stored), len(set(stored)))

    # A restarted query: one partition of the micro-batch is published, the other fails
    # (twice: Spark's retry too); the restart runs the whole micro-batch again.
    publish(url, 82, [b"%d" % i for i in range(1000)])
    flag = tmp_path / "fail"
    flag.write_text("fail")
    flag_path = str(flag)

    def fail_while_flagged(value: int) -> int:
        if value == 900 and os.path.exists(flag_path):
            time.sleep(1.0)  # the other partition finishes meanwhile
            raise RuntimeError("injected query failure")
        return value

    fail_stream = F.udf(fail_while_flagged, LongType(), useArrow=False)

    def start() -> Any:
        source = (spark.readStream.format("messaging").option("url", url)
                  .option("topics", "82").option("partitionSize", "500").load())
        out = source.select(F.lit(83).alias("topic"),
                            fail_stream(F.col("data").cast("string").cast("long"))
                            .cast("string").alias("data"))
        return (out.writeStream.format("messaging").option("url", url)
                .option("maxPublishBytes", "600")
                .option("checkpointLocation", str(tmp_path / "exactly-once"))
                .trigger(availableNow=True).start())

    first = start()
    with pytest.raises(Exception, match="injected query failure"):
        first.awaitTermination(240)
    partial = asyncio.run(read_back(83))
    assert 0 < len(partial) < 1000  # one partition was published before the failure
    flag.unlink()
    second = start()
    assert second.awaitTermination(240)
    assert second.exception() is None
    stored = asyncio.run(read_back(83))
    assert sorted(stored) == list(range(1000)), (len(stored), len(set(stored)))


@contextlib.contextmanager
def _proxy_in_thread(port: int) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` to ``port`` served by a loop on its own thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    proxy = asyncio.run_coroutine_threadsafe(FaultProxy(port).start(), loop).result(10)
    try:
        yield proxy
    finally:
        asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_spark_over_tls_with_a_token(spark: SparkSession, broker_process,
                                     tmp_path: Path) -> None:
    """The source and the sink verify the broker's certificate (option ca) and send a bearer
    token (option token)."""
    from messaging.http.auth import new_token, parse_scope, token_line
    from tests.tls import make_certificates

    certs = tmp_path / "certs"
    certs.mkdir()
    make_certificates(certs)
    token = new_token()
    tokens = tmp_path / "tokens"
    tokens.write_text(token_line("spark", token, [parse_scope("read=71"),
                                                   parse_scope("write=72")]) + "\n")
    broker = broker_process(tmp_path / "data", "--tokens", str(tokens),
                            "--tls-cert", str(certs / "server.pem"),
                            "--tls-key", str(certs / "server-key.pem")).start()
    try:
        url, ca = broker.url, str(certs / "ca.pem")

        async def setup() -> None:
            async with Client(url, token=token, ca=ca) as client:
                with pytest.raises(Exception, match="no write scope"):
                    await client.publish(71, b"refused")
            admin = new_token()
            with tokens.open("a") as f:
                f.write(token_line("admin", admin, [parse_scope("admin")]) + "\n")
            os.kill(broker.pid, __import__("signal").SIGHUP)
            for _ in range(100):
                try:
                    async with Client(url, token=admin, ca=ca, retry_timeout=0.2) as client:
                        await client.publish_batch(71, [b"%d" % i for i in range(20)])
                        return
                except Exception:
                    await asyncio.sleep(0.1)
            raise AssertionError("the admin token was not accepted after SIGHUP")

        asyncio.run(setup())
        rows = (spark.read.format("messaging").option("url", url).option("topics", "71")
                .option("ca", ca).option("token", token).load().collect())
        assert sorted(int(r.data) for r in rows) == list(range(20))
        spark.createDataFrame([(72, b"tls write")], "topic long, data binary").write.format(
            "messaging").option("url", url).option("ca", ca).option("token", token) \
            .mode("append").save()
        with pytest.raises(CapturedException, match="certificate"):
            spark.read.format("messaging").option("url", url).option("topics", "71") \
                .option("token", token).load().collect()
    finally:
        broker.terminate()
