"""A watcher of one etcd key for the watch-cost and etcd-floor experiments, in a process of
its own so that its CPU is its own: it receives ``count`` events after ``warm`` and prints one
JSON line with its CPU per event (every thread of the process).

Modes (``python -m bench.harness.etcd_watcher MODE TARGET WARM COUNT``):

- ``grpc-aio``: :meth:`messaging.log.etcd.client.EtcdClient.watch`, what a node runs today
  (grpc's own poller thread, then the event loop);
- ``grpc-thread``: the same generated stubs on a blocking grpc channel, the stream read on a
  thread of its own while the event loop waits;
- ``gateway-loop``: etcd's JSON gateway (``POST /v3/watch``) read by aiohttp on the event loop:
  one JSON line per response, the value base64;
- ``gateway-thread``: the same stream read by a blocking socket on a thread of its own while
  the event loop waits (the loop is never woken by an event);
- ``tcp-floor``: no etcd: a plain asyncio protocol that counts the bytes of ``size``-byte
  messages a paced sender writes to it (``TARGET`` is the size): one event-loop wake-up per
  message, the least any watch on the loop costs.

For etcd modes ``TARGET`` is the member's client URL; the log key is :data:`KEY`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

KEY = b"/bench/watch-cost/log"


class Meter:
    """Counts events; the process's CPU from the ``warm``-th event to the last."""

    def __init__(self, warm: int, count: int) -> None:
        self.warm, self.count = warm, count
        self.seen = 0
        self.cpu = 0.0
        self.started = 0.0
        self.done = threading.Event()

    def event(self) -> None:
        """One event received (any thread)."""
        self.seen += 1
        if self.seen == self.warm:
            self.cpu, self.started = time.process_time(), time.perf_counter()
        elif self.seen == self.warm + self.count:
            self.cpu = time.process_time() - self.cpu
            self.started = time.perf_counter() - self.started
            self.done.set()

    def result(self, mode: str) -> dict[str, Any]:
        """The JSON line this process prints."""
        return {"mode": mode, "events": self.count,
                "cpu_us_per_event": self.cpu * 1e6 / self.count, "seconds": self.started}


async def grpc_aio(url: str, meter: Meter) -> None:
    from messaging.config import EtcdSettings
    from messaging.log.etcd.client import EtcdClient

    client = EtcdClient(EtcdSettings((url,), "bench"))
    call = await client.watch(KEY, 0, 0)  # 0: from the next revision
    try:
        async for response in call:
            for event in response.events:
                bytes(event.kv.value)
                meter.event()
            if meter.done.is_set():
                return
    finally:
        call.cancel()
        await client.close()


def _read_grpc(url: str, meter: Meter) -> None:
    """The watch on a blocking grpc channel (its own thread)."""
    import grpc
    from aetcd import rpc

    with grpc.insecure_channel(url.removeprefix("http://")) as channel:
        create = rpc.WatchCreateRequest(key=KEY)  # no start revision: from the next one
        stream = rpc.WatchStub(channel).Watch(iter([rpc.WatchRequest(create_request=create)]))
        for response in stream:
            for event in response.events:
                bytes(event.kv.value)
                meter.event()
            if meter.done.is_set():
                stream.cancel()
                return


async def grpc_thread(url: str, meter: Meter) -> None:
    await _on_a_thread(_read_grpc, url, meter)


async def _on_a_thread(read: Callable[[str, Meter], None], url: str, meter: Meter) -> None:
    """Run ``read`` on a thread of its own; the loop waits without being woken by events."""
    reader = threading.Thread(target=read, args=(url, meter), daemon=True)
    reader.start()
    await asyncio.get_running_loop().run_in_executor(None, meter.done.wait)


def _create_request() -> bytes:
    # No start revision: from the next one.
    return json.dumps({"create_request": {"key": base64.b64encode(KEY).decode()}}).encode()


def _events(line: bytes, meter: Meter) -> None:
    for event in json.loads(line)["result"].get("events", ()):
        base64.b64decode(event["kv"]["value"])
        meter.event()


async def gateway_loop(url: str, meter: Meter) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.post(
            f"{url}/v3/watch", data=_create_request(),
            timeout=aiohttp.ClientTimeout(total=None)) as resp:
        async for line in resp.content:
            if line.strip():
                _events(line, meter)
            if meter.done.is_set():
                return


def _read_gateway(url: str, meter: Meter) -> None:
    """The gateway's chunked stream, read with blocking calls (its own thread)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = _create_request()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v3/watch HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n%b" % (host.encode(), len(body), body))
        stream = sock.makefile("rb", buffering=1 << 16)
        while stream.readline() not in (b"\r\n", b""):
            pass  # the response head
        pending = b""
        while not meter.done.is_set():
            size = int(stream.readline().split(b";")[0], 16)
            if size == 0:
                return
            pending += stream.read(size)
            stream.readline()
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    _events(line, meter)


async def gateway_thread(url: str, meter: Meter) -> None:
    await _on_a_thread(_read_gateway, url, meter)


async def tcp_floor(size: str, meter: Meter) -> None:
    message = int(size)
    received = 0

    class Counter(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            nonlocal received
            received += len(data)
            while received >= message:
                received -= message
                meter.event()

    server = await asyncio.get_running_loop().create_server(Counter, "127.0.0.1", 0)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, meter.done.wait)
    server.close()


MODES = {"grpc-aio": grpc_aio, "grpc-thread": grpc_thread, "gateway-loop": gateway_loop,
         "gateway-thread": gateway_thread, "tcp-floor": tcp_floor}


def main() -> None:
    mode, target, warm, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    meter = Meter(warm, count)
    asyncio.run(MODES[mode](target, meter))
    print(json.dumps(meter.result(mode)), flush=True)


if __name__ == "__main__":
    main()
