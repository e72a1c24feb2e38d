"""The async Python client: Client (publish, ping, topics) and Conn (a subscription).

Failover: a connection that cannot be made moves to the next known URL; a 307 is followed
and its leader remembered. A publish whose request may have reached a broker is never retried
blindly (publishes are not idempotent): the caller gets :class:`PublishOutcomeUnknownError`.
Reads, pings and heartbeats retry with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from messaging.errors import (
    ConnClosedError,
    ConnectionFailedError,
    ConnStateError,
    CorruptFrameError,
    MessagingError,
    NoLeaderError,
    PublishOutcomeUnknownError,
    error_for_status,
)
from messaging.files import read_json, write_json_atomic
from messaging.message import (
    FRAMES_CONTENT_TYPE,
    HEADER_SIZE,
    Message,
    decode,
    encode_batch,
    scan,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_SIZE = 16 << 20
DEFAULT_RETRY_TIMEOUT = 15.0
_BACKOFF_START = 0.05
_BACKOFF_MAX = 1.0
_MAX_REDIRECTS = 5
_QUEUE_CHUNKS = 16
_NOT_SENT = (aiohttp.ClientConnectorError,)
_MAYBE_SENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


def _base(url: str) -> str:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        raise MessagingError(f"invalid broker URL {url!r}: expected http://HOST:PORT")
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True, slots=True)
class Response:
    """A successful broker answer."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


class Client:
    """A connection pool to a broker or cluster; use as ``async with Client(urls) as c``."""

    def __init__(self, urls: Sequence[str] | str, config_path: Path | str | None = None, *,
                 timeout: float = 30.0, retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE) -> None:
        given = [urls] if isinstance(urls, str) else list(urls)
        self.config_path = Path(config_path) if config_path is not None else None
        saved: list[str] = []
        if self.config_path is not None and self.config_path.exists():
            saved = list(read_json(self.config_path).get("urls", []))
        self.urls = _unique([_base(u) for u in [*given, *saved]])
        if not self.urls:
            raise MessagingError("no broker URL given")
        self.leader: str | None = None
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.max_request_size = max_request_size
        self._current = 0
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Create the HTTP session (``async with`` does this)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout),
                connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session (raises if the client is not open)."""
        if self._session is None:
            raise ConnStateError("the client is not open: use 'async with Client(...)'")
        return self._session

    # -- requests with failover -------------------------------------------------------------

    def _candidates(self, write: bool) -> list[str]:
        start = self._current % len(self.urls)
        ordered = self.urls[start:] + self.urls[:start]
        if write and self.leader:
            ordered = [self.leader, *[u for u in ordered if u != self.leader]]
        return ordered

    def _follow(self, location: str) -> str:
        leader = _base(location)
        self.leader = leader
        if leader not in self.urls:
            self.urls.append(leader)
        return leader

    async def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                      data: bytes | None = None, headers: dict[str, str] | None = None,
                      write: bool = False, idempotent: bool = True) -> Response:
        """One API call with failover, redirects and (for idempotent calls) retries."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_timeout
        backoff = _BACKOFF_START
        last_error: BaseException | None = None
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        while True:
            for base in self._candidates(write):
                redirects = 0
                target: str | None = base
                while target is not None:
                    try:
                        response = await self._once(method, target + path, query, data, headers)
                    except _NOT_SENT as err:
                        last_error = err
                        self._rotate(base)
                        break
                    except _MAYBE_SENT as err:
                        if not idempotent:
                            raise PublishOutcomeUnknownError(
                                f"{method} {target}{path}: the connection failed after the "
                                f"request was sent ({type(err).__name__}: {err}); the publish "
                                "may or may not have been applied") from err
                        last_error = err
                        self._rotate(base)
                        break
                    if response.status == 307 and redirects < _MAX_REDIRECTS:
                        target = self._follow(response.headers.get("Location", target))
                        redirects += 1
                        continue
                    if response.status == 503 and loop.time() < deadline:
                        last_error = _error(response)
                        target = None
                        break
                    if response.status >= 300:
                        raise _error(response)
                    return response
            if loop.time() >= deadline:
                if isinstance(last_error, MessagingError):
                    raise last_error
                raise ConnectionFailedError(
                    f"no broker reachable at {', '.join(self.urls)}: {last_error}"
                ) from last_error
            await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
            backoff = min(backoff * 2, _BACKOFF_MAX)
            self.leader = None if isinstance(last_error, NoLeaderError) else self.leader

    async def _once(self, method: str, url: str, params: dict[str, str], data: bytes | None,
                    headers: dict[str, str] | None) -> Response:
        async with self.session.request(method, url, params=params, data=data, headers=headers,
                                        allow_redirects=False) as resp:
            body = await resp.read()
            return Response(resp.status, dict(resp.headers), body)

    def _rotate(self, failed: str) -> None:
        if failed == self.leader:
            self.leader = None
        if failed in self.urls:
            self._current = (self.urls.index(failed) + 1) % len(self.urls)

    # -- the API ----------------------------------------------------------------------------

    async def publish(self, topic: int, data: bytes, type: int = 1) -> int:
        """Publish one message; returns its index once the broker acknowledged it."""
        response = await self.request(
            "POST", "/messaging/messages", params={"topicID": topic, "type": type}, data=data,
            headers={"Content-Type": "application/octet-stream"}, write=True, idempotent=False)
        return int(response.headers["X-Broker-Index"])

    async def publish_batch(self, topic: int, datas: Sequence[bytes],
                            type: int = 1) -> tuple[int, int]:
        """Publish many messages framed here (CRC computed once, on this side).

        Bodies are split at ``max_request_size``; each request is all-or-nothing, and the
        returned range spans from the first request's first index to the last one's last.
        """
        if not datas:
            raise MessagingError("publish_batch needs at least one message")
        first = last = 0
        for chunk in _split(datas, self.max_request_size):
            response = await self.request(
                "POST", "/messaging/messages", params={"topicID": topic},
                data=encode_batch(topic, chunk, type),
                headers={"Content-Type": FRAMES_CONTENT_TYPE}, write=True, idempotent=False)
            result = response.json()
            first = first or int(result["first"])
            last = int(result["last"])
        return first, last

    async def ping(self) -> list[str]:
        """Ask the leader for the cluster's URLs; remember and persist them."""
        response = await self.request("POST", "/messaging/ping", write=True)
        urls = _unique([_base(u) for u in response.json()["urls"]])
        if urls:
            self.urls = urls
            self._current = 0
            if self.config_path is not None:
                write_json_atomic(self.config_path, {"urls": urls})
        return urls

    async def topics(self) -> list[dict[str, Any]]:
        """Every topic with first/last index, size, segments and subscribers."""
        result: list[dict[str, Any]] = (await self.request("GET", "/messaging/topics")).json()
        return result

    async def topic(self, topic: int, after: int | None = None,
                    count: int | None = None) -> dict[str, Any]:
        """One topic; with ``after`` and ``count`` also the index of the count-th message."""
        response = await self.request("GET", f"/messaging/topics/{topic}",
                                      params={"after": after, "count": count})
        result: dict[str, Any] = response.json()
        return result

    async def heartbeat(self, topic: int, index: int, url: str) -> None:
        """Tell the broker subscriber ``url`` has processed ``topic`` through ``index``."""
        await self.request("POST", "/messaging/heartbeat",
                           params={"topicID": topic, "index": index, "url": url}, write=True)

    async def read(self, topic: int, index: int = 0, end: int | None = None,
                   limit: int | None = None) -> list[Message]:
        """A non-streaming read of messages ``index`` ≤ i < ``end`` (up to ``limit``)."""
        response = await self.request("GET", "/messaging/messages", params={
            "topicID": topic, "index": index, "end": end, "limit": limit})
        messages, used = decode(response.body, after=max(index - 1, 0))
        if used != len(response.body):
            raise CorruptFrameError("the broker's answer ended inside a frame")
        return messages

    def conn(self, topic: int, data_url: str | None = None,
             heartbeat_interval: float = 1.0) -> Conn:
        """A subscription to ``topic``; ``data_url`` names it for heartbeats."""
        return Conn(self, topic, data_url, heartbeat_interval)


def _error(response: Response) -> MessagingError:
    message = response.headers.get("X-Broker-Error") or response.body.decode(errors="replace")
    return error_for_status(response.status, message.strip() or f"HTTP {response.status}",
                            response.headers.get("X-Broker-First-Index"))


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _split(datas: Sequence[bytes], max_bytes: int) -> Iterator[Sequence[bytes]]:
    start = 0
    size = 0
    for i, data in enumerate(datas):
        frame = HEADER_SIZE + len(data)
        if i > start and size + frame > max_bytes:
            yield datas[start:i]
            start, size = i, 0
        size += frame
    yield datas[start:]


@dataclass(frozen=True, slots=True)
class MessageBatch:
    """Verified frames of one topic over one buffer; messages are decoded only when asked."""

    topic: int
    buffer: bytes
    count: int
    first: int
    last: int

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def messages(self) -> list[Message]:
        """Decode every message of the batch."""
        return decode(self.buffer)[0]


class _End:
    """Queued by the reader task when a non-streaming read reached the end of the topic."""


class Conn:
    """A subscription: ``await conn.open(index)``, then ``async for message in conn``.

    A background task reads the stream (reconnecting from ``index + 1`` with backoff after a
    break, so nothing is re-delivered or skipped) and another heartbeats :attr:`index`.
    """

    def __init__(self, client: Client, topic: int, data_url: str | None,
                 heartbeat_interval: float) -> None:
        self.client = client
        self.topic = topic
        self.data_url = data_url
        self.heartbeat_interval = heartbeat_interval
        self.index = 0
        self.streaming = True
        self._state = "new"
        self._queue: asyncio.Queue[MessageBatch | BaseException | _End] = asyncio.Queue(
            _QUEUE_CHUNKS)
        self._current: list[Message] = []
        self._current_batch: MessageBatch | None = None
        self._position = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._received = 0
        self.reconnects = 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._state == "closed"

    async def open(self, index: int = 0, streaming: bool = True) -> None:
        """Start reading from ``index`` (inclusive); non-streaming stops at the topic's end."""
        if self._state == "closed":
            raise ConnClosedError("this Conn is closed; create a new one")
        if self._state == "open":
            raise ConnStateError("this Conn is already open")
        self._state = "open"
        self.streaming = streaming
        self.index = self._received = max(index - 1, 0)
        self._tasks.append(asyncio.create_task(self._read_loop(), name="messaging-conn-read"))
        if self.data_url:
            self._tasks.append(asyncio.create_task(self._heartbeat_loop(),
                                                   name="messaging-conn-heartbeat"))

    async def close(self) -> None:
        """End the iteration and stop the background tasks."""
        if self._state == "closed":
            return
        was_open = self._state == "open"
        self._state = "closed"
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(_End())
        if was_open and self.data_url and self.index:
            with contextlib.suppress(MessagingError, *_MAYBE_SENT):
                await self.client.heartbeat(self.topic, self.index, self.data_url)

    async def __aenter__(self) -> Conn:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Conn:
        return self

    async def __anext__(self) -> Message:
        if self._position < len(self._current):
            message = self._current[self._position]
            self._position += 1
            self.index = message.index
            return message
        batch = await self._next_batch()
        self._current_batch = batch
        self._current = batch.messages()
        self._position = 1
        message = self._current[0]
        self.index = message.index
        return message

    async def batches(self) -> AsyncIterator[MessageBatch]:
        """Messages in batches over one buffer each (no Python object per message)."""
        if self._position < len(self._current) and self._current_batch is not None:
            # Hand over the rest of the current buffer as it came: the publisher's CRCs intact.
            rest = self._current[self._position:]
            used = sum(HEADER_SIZE + len(m.data) for m in self._current[:self._position])
            self._position = len(self._current)
            self.index = rest[-1].index
            yield MessageBatch(self.topic, self._current_batch.buffer[used:], len(rest),
                               rest[0].index, rest[-1].index)
        while True:
            try:
                batch = await self._next_batch()
            except StopAsyncIteration:
                return
            self.index = batch.last
            yield batch

    async def _next_batch(self) -> MessageBatch:
        if self._state == "new":
            raise ConnStateError("open() the Conn before iterating it")
        if self._state == "closed":
            raise ConnClosedError("this Conn is closed")
        item = await self._queue.get()
        if isinstance(item, _End):
            if self._state != "closed":
                self._queue.put_nowait(item)  # a finished read: later calls end too
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    async def _read_loop(self) -> None:
        backoff = _BACKOFF_START
        failures = 0
        while True:
            before = self._received
            try:
                finished = await self._read_once()
            except (*_MAYBE_SENT, CorruptFrameError, ConnectionFailedError,
                    NoLeaderError) as err:
                finished = False
                failures += 1
                log.info("topic %d: stream broke after index %d (%s); reconnecting",
                         self.topic, self._received, err)
                if failures > 1000:
                    await self._queue.put(err)
                    return
            except MessagingError as err:
                await self._queue.put(err)
                return
            if finished:
                await self._queue.put(_End())
                return
            if self._received > before:  # it was making progress: reconnect at once
                backoff = _BACKOFF_START
                failures = 0
            self.reconnects += 1
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def _read_once(self) -> bool:
        """One GET; returns whether it reached the end of a non-streaming read."""
        client = self.client
        params = {"topicID": str(self.topic), "index": str(self._received + 1),
                  "streaming": "true" if self.streaming else "false"}
        last_error: BaseException | None = None
        for base in client._candidates(write=False):
            try:
                resp = await client.session.get(base + "/messaging/messages", params=params,
                                                allow_redirects=False)
            except _MAYBE_SENT as err:
                last_error = err
                client._rotate(base)
                continue
            async with resp:
                if resp.status >= 300:
                    raise _error(Response(resp.status, dict(resp.headers), await resp.read()))
                return await self._consume(resp)
        raise ConnectionFailedError(f"no broker reachable for topic {self.topic}: {last_error}")

    async def _consume(self, resp: aiohttp.ClientResponse) -> bool:
        pending = bytearray()
        async for data in resp.content.iter_any():
            pending += data
            result = scan(pending, after=self._received)
            if result.error is not None:
                raise result.error
            if result.count:
                batch = MessageBatch(self.topic, bytes(pending[: result.end]), result.count,
                                     result.first_index, result.last_index)
                del pending[: result.end]
                self._received = result.last_index
                await self._queue.put(batch)
        if pending:
            raise CorruptFrameError(f"stream ended inside a frame ({len(pending)} bytes)")
        return not self.streaming

    async def _heartbeat_loop(self) -> None:
        """Heartbeat at once (so retention keeps everything from the starting point on), then
        every ``heartbeat_interval``."""
        assert self.data_url is not None
        while True:
            try:
                await self.client.heartbeat(self.topic, self.index, self.data_url)
            except (MessagingError, *_MAYBE_SENT) as err:
                log.info("topic %d: heartbeat failed: %s", self.topic, err)
            await asyncio.sleep(self.heartbeat_interval)
