"""Durable Streams with a real broker process killed with SIGKILL.

(a) An idempotent producer's append, killed in flight at many different moments (mid-upload,
    just sent, a little later), then retried after a restart with the same
    (Producer-Id, Producer-Epoch, Producer-Seq): the stream holds it exactly once, and the retry
    is a 204 duplicate exactly when the append had been stored before the kill.
(b) The catalog after a crash: plain, JSON, closed, forked (at a sub-offset inside an append
    split into several messages), deleted and soft-deleted streams, TTLs, producer state and
    ``Stream-Seq``, with another writer busy at the moment of the kill: everything reads back
    identically after the restart, and the state machine decides as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from tests.conftest import BrokerProcess

TEXT = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}
OCTET = {"Content-Type": "application/octet-stream"}
TIMEOUT = aiohttp.ClientTimeout(total=30)

Answer = tuple[int, Mapping[str, str], bytes]
MakeBroker = Callable[..., BrokerProcess]


async def call(http: aiohttp.ClientSession, method: str, url: str, body: bytes | None = None,
               headers: Mapping[str, str] | None = None, **params: str) -> Answer:
    """One request; status, headers, body (no Content-Type unless given)."""
    headers = dict(headers or {})
    skip = () if any(h.lower() == "content-type" for h in headers) else ("Content-Type",)
    async with http.request(method, url, data=body, headers=headers, params=params or None,
                            skip_auto_headers=skip) as resp:
        return resp.status, resp.headers, await resp.read()


def producer(pid: str, epoch: int, seq: int) -> dict[str, str]:
    """Idempotent producer headers."""
    return {"Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


async def start(process: BrokerProcess) -> BrokerProcess:
    """Start a broker process without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, process.start)


async def kill_now(process: BrokerProcess) -> None:
    """SIGKILL at once (no thread hop before the signal), then reap it on a thread."""
    assert process.proc is not None
    process.proc.send_signal(signal.SIGKILL)
    await asyncio.get_running_loop().run_in_executor(None, process.kill)


def raw_append(port: int, name: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """An HTTP/1.1 POST of ``body`` to a stream, as bytes for a socket."""
    lines = [f"POST /v1/stream/{name} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             f"Content-Length: {len(body)}", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# -- (a) idempotent retries across kill -9 ------------------------------------------------------


#: How each round kills the broker: after sending that many bytes of the request (None: all
#: of it), then waiting that many seconds. Mid-upload kills cannot have stored anything; the
#: later ones (almost surely) have.
ROUNDS: list[tuple[int | None, float]] = [
    (40, 0.0), (None, 0.0), (None, 0.0), (None, 0.0005), (None, 0.001), (None, 0.002),
    (None, 0.004), (None, 0.008), (None, 0.02), (-3, 0.01), (None, 0.05), (None, 0.2),
]


async def test_idempotent_retries_across_kill_9(broker_process: MakeBroker,
                                                tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = await start(broker_process(data))
    outcomes: list[bool] = []
    expected = b""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        url = f"{broker.url}/v1/stream/orders"
        assert (await call(http, "PUT", url, headers=TEXT))[0] == 201
        for seq, (sent_bytes, delay) in enumerate(ROUNDS):
            body = f"order {seq} ".encode() * 20
            headers = {**TEXT, **producer("writer", 0, seq)}
            port = URL(broker.url).port
            assert port is not None
            request = raw_append(port, "orders", body, headers)
            if sent_bytes is not None:
                request = request[:sent_bytes]
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            if delay:
                await asyncio.sleep(delay)
            await kill_now(broker)  # the answer is never read
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

            broker = await start(broker_process(data))
            url = f"{broker.url}/v1/stream/orders"
            status, _, content = await call(http, "GET", url)
            assert status == 200
            stored = content.count(body)
            assert stored in (0, 1), f"round {seq}: stored {stored} times"
            assert content == expected + body * stored, f"round {seq}: content differs"
            outcomes.append(bool(stored))

            status, answer, _ = await call(http, "POST", url, body, headers)
            assert status == (204 if stored else 200), f"round {seq}: {status}"
            assert (answer["Producer-Epoch"], answer["Producer-Seq"]) == ("0", str(seq))
            status, _, _ = await call(http, "POST", url, body, headers)
            assert status == 204
            expected += body
            assert (await call(http, "GET", url))[2] == expected, f"round {seq}"

        # Once more after a kill of an idle broker: exactly one copy of each, in order.
        await kill_now(broker)
        broker = await start(broker_process(data))
        url = f"{broker.url}/v1/stream/orders"
        assert (await call(http, "GET", url))[2] == expected
        status, _, _ = await call(http, "POST", url, b"next", {**TEXT, **producer("writer", 0,
                                                                               len(ROUNDS))})
        assert status == 200
    print(f"stored before the kill: {outcomes}")
    assert True in outcomes and False in outcomes, outcomes


# -- (b) catalog replay after a crash -----------------------------------------------------------


async def snapshot(http: aiohttp.ClientSession, base: str, names: list[str],
                   ) -> dict[str, Any]:
    """What clients can see of each stream: HEAD metadata (or its error status), the content
    read from the start, and a read at the tail (``offset=now``)."""
    seen: dict[str, Any] = {}
    keep = ("Content-Type", "Stream-Next-Offset", "Stream-Closed", "Stream-TTL",
            "Stream-Expires-At", "ETag")
    for name in names:
        url = f"{base}/v1/stream/{name}"
        status, headers, _ = await call(http, "HEAD", url)
        entry: dict[str, Any] = {"head": status, **{k: headers.get(k) for k in keep}}
        if status == 200:
            status, headers, body = await call(http, "GET", url)
            entry.update(get=status, body=body, next=headers.get("Stream-Next-Offset"),
                         closed=headers.get("Stream-Closed"), etag=headers.get("ETag"))
            status, headers, body = await call(http, "GET", url, offset="now")
            entry.update(now=(status, body, headers.get("Stream-Next-Offset")))
        seen[name] = entry
    return seen


async def busy_writer(http: aiohttp.ClientSession, url: str, acked: list[bytes],
                      stop: asyncio.Event) -> bytes | None:
    """Append one message at a time until stopped or the broker dies; the one in flight when
    it died, if any."""
    for seq in range(100_000):
        if stop.is_set():
            return None
        body = f"noise {seq};".encode()
        try:
            status, _, _ = await call(http, "POST", url, body,
                                      {**TEXT, **producer("noise", 0, seq)})
        except (aiohttp.ClientError, ConnectionError, TimeoutError):
            return body
        if status != 200:
            return body
        acked.append(body)
    return None


def topic_dirs(data: Path) -> set[str]:
    """The topic directories of a data directory."""
    return {p.name for p in (data / "topics").iterdir()}


async def test_catalog_replays_after_kill_9(broker_process: MakeBroker, tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ("--max-message-size", "1K")
    broker = await start(broker_process(data, *args))
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        def at(name: str) -> str:
            return f"{broker.url}/v1/stream/{name}"

        big = bytes(range(256)) * 12  # 3 KiB: four messages of at most 1 KiB
        assert (await call(http, "PUT", at("plain"), b"head;", OCTET))[0] == 201
        anchor = (await call(http, "HEAD", at("plain")))[1]["Stream-Next-Offset"]
        assert (await call(http, "POST", at("plain"), big, {**OCTET, "Stream-Seq": "0001"}))[0] \
            == 204
        assert (await call(http, "POST", at("plain"), b";tail", {**OCTET,
                                                               "Stream-Seq": "0002"}))[0] == 204
        assert (await call(http, "PUT", at("fork"), headers={
            "Stream-Forked-From": "/v1/stream/plain", "Stream-Fork-Offset": anchor,
            "Stream-Fork-Sub-Offset": "1500"}))[0] == 201
        assert (await call(http, "POST", at("fork"), b"+fork", OCTET))[0] == 204

        assert (await call(http, "PUT", at("json"), b'[{"a": 1}]', JSON))[0] == 201
        assert (await call(http, "POST", at("json"), b'[[1, 2], {"b": null}]', JSON))[0] == 204
        assert (await call(http, "PUT", at("closed"), b"all there is",
                           {**TEXT, "Stream-Closed": "true"}))[0] == 201
        assert (await call(http, "PUT", at("closed-later"), b"start;", TEXT))[0] == 201
        closing = {**TEXT, **producer("closer", 2, 0), "Stream-Closed": "true"}
        assert (await call(http, "POST", at("closed-later"), b"end", closing))[0] == 200
        assert (await call(http, "PUT", at("ttl"), b"t", {**TEXT, "Stream-TTL": "3600"}))[0] \
            == 201
        assert (await call(http, "PUT", at("expires"), b"e", {
            **TEXT, "Stream-Expires-At": "2099-12-31T23:59:59Z"}))[0] == 201
        assert (await call(http, "PUT", at("producer"), headers=TEXT))[0] == 201
        for seq in range(3):
            assert (await call(http, "POST", at("producer"), f"p{seq};".encode(),
                               {**TEXT, **producer("p", 1, seq)}))[0] == 200
        assert (await call(http, "PUT", at("deleted"), b"bye", TEXT))[0] == 201
        assert (await call(http, "DELETE", at("deleted")))[0] == 204
        assert (await call(http, "PUT", at("source"), b"inherited;", TEXT))[0] == 201
        assert (await call(http, "PUT", at("source-fork"),
                           headers={"Stream-Forked-From": "source"}))[0] == 201
        assert (await call(http, "POST", at("source-fork"), b"own", TEXT))[0] == 204
        assert (await call(http, "DELETE", at("source")))[0] == 204
        assert (await call(http, "PUT", at("noise"), headers=TEXT))[0] == 201

        names = ["plain", "fork", "json", "closed", "closed-later", "ttl", "expires",
                 "producer", "deleted", "source", "source-fork"]
        before = await snapshot(http, broker.url, names)
        assert before["fork"]["body"] == b"head;" + big[:1500] + b"+fork"
        assert before["source"]["head"] == 410 and before["deleted"]["head"] == 404
        assert before["closed-later"]["Stream-Closed"] == "true"

        # Kill -9 while another stream is being written.
        acked: list[bytes] = []
        stop = asyncio.Event()
        noise = asyncio.ensure_future(busy_writer(http, at("noise"), acked, stop))
        for _ in range(500):
            if len(acked) >= 20:
                break
            await asyncio.sleep(0.01)
        await kill_now(broker)
        in_flight = await asyncio.wait_for(noise, 30)
        stop.set()
        assert len(acked) >= 20

    broker = await start(broker_process(data, *args))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        after = await snapshot(http, broker.url, names)
        for name in names:
            assert after[name] == before[name], name

        noise_body = (await call(http, "GET", at("noise")))[2]
        assert noise_body.startswith(b"".join(acked))
        assert noise_body in (b"".join(acked), b"".join(acked) + (in_flight or b""))

        # The state machine decides as it did before the crash.
        status, headers, _ = await call(http, "POST", at("producer"), b"p2;",
                                        {**TEXT, **producer("p", 1, 2)})
        assert status == 204 and headers["Producer-Seq"] == "2"
        status, headers, _ = await call(http, "POST", at("producer"), b"p3;",
                                        {**TEXT, **producer("p", 1, 3)})
        assert status == 200 and headers["Producer-Seq"] == "3"
        assert (await call(http, "POST", at("producer"), b"zombie",
                           {**TEXT, **producer("p", 0, 4)}))[1]["Producer-Epoch"] == "1"
        assert (await call(http, "GET", at("producer")))[2] == b"p0;p1;p2;p3;"
        status, headers, _ = await call(http, "POST", at("closed-later"), b"end", closing)
        assert status == 204 and headers["Stream-Closed"] == "true"
        status, headers, _ = await call(http, "POST", at("closed"), b"more", TEXT)
        assert status == 409 and headers["Stream-Closed"] == "true"
        assert (await call(http, "POST", at("plain"), b"x",
                           {**OCTET, "Stream-Seq": "0002"}))[0] == 409
        assert (await call(http, "POST", at("plain"), b"x",
                           {**OCTET, "Stream-Seq": "0003"}))[0] == 204
        assert (await call(http, "PUT", at("source"), headers=TEXT))[0] == 409
        assert (await call(http, "POST", at("source"), b"x", TEXT))[0] == 410
        assert (await call(http, "PUT", at("json"), headers=JSON))[0] == 200
        assert (await call(http, "PUT", at("json"), headers=TEXT))[0] == 409

        # The last fork goes: the soft-deleted source is collected, files and all.
        dirs = await loop.run_in_executor(None, topic_dirs, data)
        assert (await call(http, "DELETE", at("source-fork")))[0] == 204
        assert (await call(http, "HEAD", at("source")))[0] == 404
        assert len(dirs - await loop.run_in_executor(None, topic_dirs, data)) == 2
        assert (await call(http, "PUT", at("source"), headers=TEXT))[0] == 201
        assert (await call(http, "PUT", at("deleted"), headers=TEXT))[0] == 201
        assert (await call(http, "GET", at("deleted")))[2] == b""
