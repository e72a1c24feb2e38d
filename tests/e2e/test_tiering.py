"""Object storage end to end: a broker process on a real S3 server (SeaweedFS over HTTP).

A topic holds 100 times what its disk keeps (``--local-retention-size``), and every read path
returns exactly what was published: native frames, SSE, the client's ``read`` and ``Conn``,
``messaging tail``, a Durable Streams read, seeks by time, consumer lag, and Spark.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from messaging.client import Client
from messaging.frames import decode
from tests.conftest import BrokerProcess, cli
from tests.objects.conftest import (  # noqa: F401 (the session's SeaweedFS fixture)
    ACCESS_KEY,
    BUCKET,
    SECRET_KEY,
    SeaweedFS,
    seaweedfs,
)

LOCAL = 8 << 10  # --local-retention-size
SEGMENT = 4 << 10  # --max-segment-size
TOPIC = 5
MESSAGES = 4000
SIZE = 200  # bytes of data per message: 4000 * 224-byte frames = 109 * LOCAL
STREAM = "tiered-stream"


def s3_env() -> dict[str, str]:
    """Credentials and region the standard AWS way: the environment."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1"}


def payload(k: int) -> bytes:
    return f"{k:06d}".encode().ljust(SIZE, b".")


async def topic_info(http: aiohttp.ClientSession, url: str, topic: int | str,
                     ) -> dict[str, Any]:
    async with http.get(f"{url}/messaging/topics/{topic}") as resp:
        assert resp.status == 200, await resp.text()
        info: dict[str, Any] = await resp.json()
        return info


async def drained(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """Diagnostics once nothing waits for upload and local copies are down to the limit
    (bounded: 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        async with http.get(f"{url}/messaging/diagnostics") as resp:
            diagnostics: dict[str, Any] = await resp.json()
        store = diagnostics["broker"]["object_store"] if "broker" in diagnostics \
            else diagnostics["object_store"]
        info = await topic_info(http, url, TOPIC)
        if store["backlog"]["segments"] == 0 and info["size"] <= LOCAL + 2 * SEGMENT:
            return diagnostics
        assert time.monotonic() < deadline, f"not drained: {store} {info}"
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def tiered_broker(tmp_path_factory: pytest.TempPathFactory,
                  seaweedfs: SeaweedFS) -> Any:  # noqa: F811
    data = tmp_path_factory.mktemp("tiered") / "data"
    prefix = f"tiered-{uuid.uuid4().hex[:8]}"
    process = BrokerProcess(
        data, "--object-store", f"s3://{BUCKET}/{prefix}", "--s3-endpoint", seaweedfs.endpoint,
        "--max-segment-size", str(SEGMENT), "--local-retention-size", str(LOCAL),
        "--object-cache-size", "1M", "--truncation-interval", "200ms",
        env=s3_env()).start()
    yield process, prefix
    process.kill()


@pytest.fixture(scope="module")
def published(tiered_broker: Any) -> dict[str, Any]:
    """4000 messages in two halves a second apart, and a stream of 300 appends, all
    offloaded; the moment between the halves."""
    process, _prefix = tiered_broker

    async def run() -> dict[str, Any]:
        async with Client(process.url) as client:
            for start in range(0, MESSAGES // 2, 100):
                await client.publish_batch(TOPIC, [payload(k) for k in range(start,
                                                                             start + 100)])
            await asyncio.sleep(1.0)
            middle = int(time.time() * 1000)
            await asyncio.sleep(0.3)
            for start in range(MESSAGES // 2, MESSAGES, 100):
                await client.publish_batch(TOPIC, [payload(k) for k in range(start,
                                                                             start + 100)])
        async with aiohttp.ClientSession() as http:
            url = f"{process.url}/v1/stream/{STREAM}"
            async with http.put(url, headers={"Content-Type": "text/plain"}) as resp:
                assert resp.status in (200, 201), await resp.text()
            for k in range(300):
                async with http.post(url, data=payload(k)[:60],
                                     headers={"Content-Type": "text/plain"}) as resp:
                    assert resp.status in (200, 204), await resp.text()
            diagnostics = await drained(http, process.url)
            info = await topic_info(http, process.url, TOPIC)
        return {"middle": middle, "diagnostics": diagnostics, "info": info}

    return asyncio.run(run())


def expected(start: int = 0) -> list[bytes]:
    return [payload(k) for k in range(start, MESSAGES)]


async def test_the_topic_holds_100_times_what_its_disk_keeps(published: dict[str, Any],
                                                             ) -> None:
    info = published["info"]
    assert info["offloaded_size"] >= 100 * LOCAL
    assert info["size"] <= LOCAL + 2 * SEGMENT
    assert info["first_index"] < info["local_first_index"]
    assert info["offloaded_segments"] > 50


async def test_native_frames_from_the_first_index(tiered_broker: Any,
                                                  published: dict[str, Any]) -> None:
    process, _prefix = tiered_broker
    async with aiohttp.ClientSession() as http, http.get(
            f"{process.url}/messaging/messages", params={"topicID": str(TOPIC)}) as resp:
        assert resp.status == 200
        body = await resp.read()
    messages, used = decode(body)
    assert used == len(body)
    assert [bytes(m.data) for m in messages] == expected()
    indexes = [m.index for m in messages]
    assert indexes == sorted(set(indexes))


async def test_client_read_conn_and_times(tiered_broker: Any, published: dict[str, Any],
                                          ) -> None:
    process, _prefix = tiered_broker
    async with Client(process.url) as client:
        whole = await client.read(TOPIC, times=True)
        assert [m.data for m in whole] == expected()
        assert all(m.time is not None for m in whole)
        # a seek by time lands in the store, at the second half's first message
        later = await client.read(TOPIC, since=published["middle"])
        assert [m.data for m in later] == expected(MESSAGES // 2)
        # from the middle of an object
        start = whole[1234].index
        assert [m.data for m in await client.read(TOPIC, start)] == expected(1234)
        conn = client.conn(TOPIC)
        await conn.open(0, streaming=False)
        got = [m.data async for m in conn]
        await conn.close()
        assert got == expected()
        times = await client.times(TOPIC, 0)
        assert times, "append times over the store"


async def test_sse_reads_the_store_then_the_disk(tiered_broker: Any,
                                                 published: dict[str, Any]) -> None:
    process, _prefix = tiered_broker
    events: list[str] = []
    async with aiohttp.ClientSession() as http, http.get(
            f"{process.url}/messaging/messages",
            params={"topicID": str(TOPIC), "format": "sse", "limit": str(MESSAGES)}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data:"):
                events.append(line[5:].strip().decode())
            if len(events) >= MESSAGES:
                break
    assert len(events) == MESSAGES


async def test_consumer_lag_counts_the_store(tiered_broker: Any,
                                             published: dict[str, Any]) -> None:
    process, _prefix = tiered_broker
    async with Client(process.url) as client:
        whole = await client.read(TOPIC, limit=11)
        await client.heartbeat(TOPIC, whole[10].index, "lagging-reader")
        rows = await client.consumers(TOPIC)
    row = next(r for r in rows if r["name"] == "lagging-reader")
    assert row["lag"] == MESSAGES - 11


def test_cli_tail_reads_the_store(tiered_broker: Any, published: dict[str, Any]) -> None:
    process, _prefix = tiered_broker
    done = cli("tail", str(TOPIC), "--url", process.url, "--format", "json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["data"] for line in lines] == [p.decode() for p in expected()]


async def test_durable_stream_read_from_the_start(tiered_broker: Any,
                                                  published: dict[str, Any]) -> None:
    process, _prefix = tiered_broker
    async with aiohttp.ClientSession() as http:
        info = await topic_info(http, process.url, STREAM)
        assert info["offloaded_segments"] > 0
        assert info["first_index"] < info["local_first_index"]
        async with http.get(f"{process.url}/v1/stream/{STREAM}",
                            params={"offset": "-1"}) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.read()
    assert body == b"".join(payload(k)[:60] for k in range(300))


def test_spark_reads_the_store(spark: Any, tiered_broker: Any,
                               published: dict[str, Any]) -> None:
    process, _prefix = tiered_broker
    df = (spark.read.format("messaging").option("url", process.url)
          .option("topics", str(TOPIC)).option("partitionSize", "700").load())
    rows = sorted(df.select("index", "data").collect())
    assert [bytes(r["data"]) for r in rows] == expected()


def test_objects_are_named_by_what_they_hold(tiered_broker: Any, seaweedfs: SeaweedFS,  # noqa: F811
                                             published: dict[str, Any], tmp_path: Path) -> None:
    _process, prefix = tiered_broker
    store = seaweedfs.store(prefix)
    names = asyncio.run(store.list(str(TOPIC)))
    assert names
    seg = [o.name for o in names if o.name.endswith(".seg")]
    assert all(n.startswith(f"{TOPIC}/") for n in seg)
    assert any(o.name.endswith(".time") for o in names)


def store_read_bytes(url: str) -> float:
    """The broker's own reads from the store so far (its metric)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("messaging_object_store_read_bytes_total"))


def test_spark_executors_read_the_store_themselves(spark: Any, tiered_broker: Any,
                                                   seaweedfs: SeaweedFS,  # noqa: F811
                                                   published: dict[str, Any]) -> None:
    """Given the store and its credentials, executors read the offloaded part straight from
    it: the broker's own store reads do not move, and the rows are the same."""
    process, prefix = tiered_broker
    before = store_read_bytes(process.url)
    df = (spark.read.format("messaging").option("url", process.url)
          .option("topics", str(TOPIC)).option("partitionSize", "700")
          .option("objectStore", f"s3://{BUCKET}/{prefix}")
          .option("s3Endpoint", seaweedfs.endpoint).option("s3AccessKeyId", ACCESS_KEY)
          .option("s3SecretAccessKey", SECRET_KEY).option("s3Region", "us-east-1").load())
    rows = sorted(df.select("index", "data").collect())
    assert [bytes(r["data"]) for r in rows] == expected()
    assert store_read_bytes(process.url) == before
