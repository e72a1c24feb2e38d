"""The two processes of the split experiment (its run.py starts them with ``python -m
bench.experiments.split.processes``): an HTTP front and a log.

``front --port P --log SOCKET``: the broker's own publish handler (``MessageHandlers.publish``
behind ``errors_middleware``, served by ``BrokerConnection`` with the broker's defaults) on
uvloop, so every request is parsed, validated, encoded and answered exactly as the broker
does it. Its log is a :class:`LogClient` (a :class:`messaging.log.base.Log`), which hands
each command to the log process over a Unix socket: whatever commands are ready when the loop
comes round go out as one write, and a FIFO of futures takes the answers. Several fronts may
share the port (SO_REUSEPORT).

``log --data DIR --socket SOCKET``: the real ``Broker`` and ``LocalLog(fsync="always")``;
every command goes through ``await log.apply(command)`` as in the broker, so group commit,
the write and the fdatasync are the real ones, and an answer is sent only once its command
is durable. Answers go back in the order the commands came (the wire format:
:mod:`bench.experiments.split.wire`).

Each process prints ``ready`` once it serves and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
from array import array
from collections import deque
from pathlib import Path
from typing import Any, cast

from aiohttp import web

from bench.experiments.split.wire import (
    ANSWER,
    APPLIED,
    COMMAND,
    ERROR,
    OFFSET_SIZE,
    PLAIN,
    STATS,
    STATS_KIND,
    command_frame,
)
from messaging.broker.broker import Broker
from messaging.broker.commands import ApplyResult, Command
from messaging.broker.metrics import BrokerMetrics
from messaging.broker.view import BrokerView
from messaging.cli.main import event_loop_factory
from messaging.config import BrokerConfig
from messaging.errors import BrokerClosedError, MessagingError, error_for_status
from messaging.headers import ERROR_HEADER
from messaging.http.app import errors_middleware
from messaging.http.connections import ConnectionLimits, connection_factory
from messaging.http.executors import Executors
from messaging.http.limits import Limits
from messaging.http.messages import MessageHandlers
from messaging.http.server import LISTEN_BACKLOG
from messaging.log.base import Log
from messaging.log.local import LocalLog

#: Commands the front queues for the log before it refuses more (50 connections need 50).
MAX_IN_FLIGHT = 100_000


# -- the front ------------------------------------------------------------------------------


class LogClient(asyncio.Protocol):
    """The front's log: commands go to the log process, answers come back in order.

    A :class:`messaging.log.base.Log` standing for a single node that always leads; the
    answer carries the index range only (no stream outcome: the experiment sends no producer
    headers) and the topics touched are not reported (the front has no readers to wake).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._transport: asyncio.Transport | None = None
        self._waiting: deque[asyncio.Future[ApplyResult]] = deque()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._buffer = bytearray()
        self._lost: str | None = None

    # the protocol's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = f"the log process went away ({exc or 'closed'})"
        self._transport = None
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(BrokerClosedError(self._lost))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at, size = 0, ANSWER.size
        while len(buffer) - at >= size:
            kind, a, b = ANSWER.unpack_from(buffer, at)
            end = at + size + (b if kind == ERROR else 0)
            if end > len(buffer):
                break
            result: ApplyResult | MessagingError
            if kind == APPLIED:
                result = ApplyResult(a, b, frozenset())
            else:
                message = bytes(buffer[at + size:end]).decode("utf-8", "replace")
                result = error_for_status(a, {ERROR_HEADER: message})
            at = end
            future = self._waiting.popleft()
            if future.done():  # its request was cancelled (the client went away)
                continue
            if isinstance(result, MessagingError):
                future.set_exception(result)
            else:
                future.set_result(result)
        del buffer[:at]

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if self._transport is not None and out:
            self._transport.write(b"".join(out))

    # the Log protocol's side

    async def start(self) -> None:
        """Nothing to start: the connection is made by ``connect``."""

    async def close(self) -> None:
        """Close the connection to the log process (queued commands are answered 503)."""
        if self._transport is not None:
            self._transport.close()

    async def apply(self, command: bytes) -> ApplyResult:
        """Send the command with whatever else is ready this turn; wait for its answer."""
        if self._lost is not None or self._transport is None:
            raise BrokerClosedError(self._lost or "not connected to the log process")
        if len(self._waiting) >= MAX_IN_FLIGHT:
            raise BrokerClosedError("too many commands waiting for the log process")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ApplyResult] = loop.create_future()
        self._waiting.append(future)
        self._out += command_frame(command)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return await future

    def urls(self) -> list[str]:
        """Just this front."""
        return [self.url]

    def not_ready(self) -> str | None:
        """Why the front cannot take writes (None: it can)."""
        return self._lost

    async def read_barrier(self) -> None:
        """Nothing to wait for: the log process answers a command once it is applied, and
        the front reads the same files."""

    def diagnostics(self, window: float = 60.0) -> dict[str, Any]:
        """Commands waiting for their answers."""
        return {"role": "split-front", "waiting": len(self._waiting)}


class _NoReads:
    """The broker side of a front: the publish route uses only the metrics."""

    def __init__(self) -> None:
        self.metrics = BrokerMetrics()


def listening_socket(port: int) -> socket.socket:
    """127.0.0.1:``port`` with SO_REUSEPORT, so that several fronts share it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


async def run_front(port: int, log_socket: str, stop: asyncio.Event) -> None:
    """Serve POST /messaging/messages as the broker does, its log in the log process."""
    loop = asyncio.get_running_loop()
    defaults = BrokerConfig(data=Path("unused"))  # the broker's default limits
    url = f"http://127.0.0.1:{port}"
    _, client = await loop.create_unix_connection(lambda: LogClient(url), log_socket)
    log: Log = client
    executors = Executors()  # big bodies are validated on its threads, as in the broker
    handlers = MessageHandlers(cast(BrokerView, _NoReads()), log, executors,
                               defaults.max_message_size, defaults.max_request_size, Limits())
    app = web.Application(middlewares=[errors_middleware], client_max_size=max(
        defaults.max_request_size, defaults.max_message_size + 1024))
    app.on_startup.append(executors.start)
    app.on_cleanup.append(executors.stop)
    app.router.add_post("/messaging/messages", handlers.publish)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)
    await runner.setup()
    assert runner.server is not None
    limits = ConnectionLimits(defaults.header_timeout, defaults.max_connections)
    listener = await loop.create_server(connection_factory(runner.server, limits),
                                        sock=listening_socket(port), backlog=LISTEN_BACKLOG)
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        listener.close()
        await client.close()
        await runner.cleanup()
        limits.close()


# -- the log process ------------------------------------------------------------------------


class LogServer(asyncio.Protocol):
    """One front's connection: each command through ``LocalLog.apply``, answers in order."""

    def __init__(self, log: LocalLog, broker: Broker) -> None:
        self.log = log
        self.broker = broker
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiting: deque[asyncio.Future[ApplyResult | tuple[int, int]]] = deque()
        self._out: list[bytes] = []
        self._flush_scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None  # commands already handed to the log still complete

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at, size = 0, COMMAND.size
        loop = asyncio.get_running_loop()
        while len(buffer) - at >= size:
            length, topic, stride, count = COMMAND.unpack_from(buffer, at)
            body_at = at + size + count * OFFSET_SIZE
            end = body_at + length
            if end > len(buffer):
                break
            future: asyncio.Future[Any]
            if topic == STATS:
                future = loop.create_future()
                future.set_result((self.log.groups, self.broker.index))
            else:
                body = bytes(buffer[body_at:end])
                if topic == PLAIN:
                    command = body
                else:
                    offsets = array("q")
                    offsets.frombytes(buffer[at + size:body_at])
                    command = Command.of(body, offsets, topic, stride)
                future = loop.create_task(self.log.apply(command))
            at = end
            self._waiting.append(future)
            future.add_done_callback(self._answer)
        del buffer[:at]

    def _answer(self, _done: asyncio.Future[Any]) -> None:
        """Answer every finished command at the head of the FIFO (they finish in order)."""
        waiting = self._waiting
        while waiting and waiting[0].done():
            self._out.append(_encode(waiting.popleft()))
        if self._out and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if self._transport is not None and out:
            self._transport.write(b"".join(out))


def _encode(done: asyncio.Future[Any]) -> bytes:
    """The answer for one finished command (or stats request)."""
    error = (BrokerClosedError("the log process is shutting down") if done.cancelled()
             else done.exception())
    if error is None:
        result = done.result()
        if isinstance(result, ApplyResult):
            first, last = result.first, result.last
            outcome = result.stream
            if outcome is not None and outcome.producer is not None:
                first, last = outcome.first, outcome.last
            return ANSWER.pack(APPLIED, first, last)
        groups, index = result
        return ANSWER.pack(STATS_KIND, groups, index)
    status = error.status if isinstance(error, MessagingError) else 500
    message = str(error).encode("utf-8", "replace")
    return ANSWER.pack(ERROR, status, len(message)) + message


async def run_log(data: Path, path: str, stop: asyncio.Event) -> None:
    """Open the broker, run its LocalLog with fsync always, serve the fronts on ``path``."""
    loop = asyncio.get_running_loop()
    defaults = BrokerConfig(data=data)
    broker = await loop.run_in_executor(None, lambda: Broker.open(
        data, max_segment_size=defaults.max_segment_size,
        max_topic_size=defaults.max_topic_size,
        subscriber_timeout=defaults.subscriber_timeout))
    log = LocalLog(broker, f"unix:{path}", fsync="always")
    await log.start()
    server = await loop.create_unix_server(lambda: LogServer(log, broker), path)
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        await log.close()
        await loop.run_in_executor(None, broker.close)


# -- the command line -----------------------------------------------------------------------


async def _until_terminated(role: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if role.role == "front":
        await run_front(role.port, role.log, stop)
    else:
        await run_log(role.data, role.socket, stop)


def main(argv: list[str] | None = None) -> None:
    """``front --port P --log SOCKET`` or ``log --data DIR --socket SOCKET``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    roles = parser.add_subparsers(dest="role", required=True)
    front = roles.add_parser("front", help="the HTTP front")
    front.add_argument("--port", type=int, required=True)
    front.add_argument("--log", required=True, help="the log process's Unix socket")
    log = roles.add_parser("log", help="the log process")
    log.add_argument("--data", type=Path, required=True)
    log.add_argument("--socket", required=True)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(_until_terminated(args))


if __name__ == "__main__":
    main()
