"""The async Python client: Client (publish, ping, topics) and Conn (a subscription).

Failover: a connection that cannot be made moves to the next known URL; a 307 is followed
and its leader remembered. A publish whose request may have reached a broker is never retried
blindly (publishes are not idempotent): the caller gets :class:`PublishOutcomeUnknownError`.
Reads, pings and heartbeats retry with backoff for ``retry_timeout`` seconds; while a client
has never reached any broker, a refused connection (or an unknown host) on every URL is
definitive after a few quick rounds. Only :class:`MessagingError` subclasses leave this
module, worded for users: what failed, where, and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import random
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp

from messaging.errors import (
    ClientConfigError,
    ConnClosedError,
    ConnectionFailedError,
    ConnStateError,
    CorruptFrameError,
    InvalidURLError,
    MessagingError,
    NoLeaderError,
    NotABrokerError,
    PublishOutcomeUnknownError,
    TopicTruncatedError,
    error_for_status,
)
from messaging.files import read_json, write_json_atomic
from messaging.message import (
    FRAMES_CONTENT_TYPE,
    HEADER_SIZE,
    BatchDecoder,
    Message,
    decode,
    encode_batch,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_SIZE = 16 << 20
DEFAULT_RETRY_TIMEOUT = 15.0
_BACKOFF_START = 0.05
_BACKOFF_MAX = 1.0
_MAX_REDIRECTS = 5
_QUEUE_CHUNKS = 16
# Rounds over every URL, all refused, before a client that never reached a broker gives up.
_REFUSED_ROUNDS = 4
_CONNECT_TIMEOUT: tuple[type[BaseException], ...] = tuple(
    t for t in [getattr(aiohttp, "ConnectionTimeoutError", None)] if t is not None)
_NOT_SENT: tuple[type[BaseException], ...] = (aiohttp.ClientConnectorError,
                                                *_CONNECT_TIMEOUT)
_MAYBE_SENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)
_SCHEMES = ("http", "https")
_URL_SHAPE = "expected http://HOST:PORT or https://HOST:PORT"


def _base(url: str) -> str:
    """``scheme://host:port`` of a broker URL; :class:`InvalidURLError` if it cannot be one."""
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        raise InvalidURLError(f"invalid broker URL {url!r}: {_URL_SHAPE}")
    if parts.scheme not in _SCHEMES:
        raise InvalidURLError(f"invalid broker URL {url!r}: unsupported scheme "
                              f"{parts.scheme!r}, {_URL_SHAPE}")
    try:
        port = parts.port
    except ValueError as err:
        raise InvalidURLError(f"invalid broker URL {url!r}: the port must be a number from 1 "
                              "to 65535") from err
    if not parts.hostname or port == 0:
        raise InvalidURLError(f"invalid broker URL {url!r}: {_URL_SHAPE}")
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True, slots=True)
class Response:
    """A successful broker answer; ``url`` is the broker (``scheme://host:port``) that gave it."""

    status: int
    headers: dict[str, str]
    body: bytes
    url: str = ""

    def json(self) -> Any:
        """The body as JSON (:class:`NotABrokerError` if it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
            raise _not_a_broker(self.url, "its answer is not JSON") from err


class Client:
    """A connection pool to a broker or cluster; use as ``async with Client(urls) as c``."""

    def __init__(self, urls: Sequence[str] | str, config_path: Path | str | None = None, *,
                 timeout: float = 30.0, retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE) -> None:
        given = [urls] if isinstance(urls, str) else list(urls)
        self.config_path = Path(config_path) if config_path is not None else None
        # The config file is read by open(), on a thread: nothing here touches the disk.
        self.urls = _unique([_base(u) for u in given])
        if not self.urls and self.config_path is None:
            raise InvalidURLError("no broker URL given")
        self.leader: str | None = None
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.max_request_size = max_request_size
        self._current = 0
        self._session: aiohttp.ClientSession | None = None
        self._reached = False  # whether any broker URL ever answered

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Read the config file, create the HTTP session (``async with`` does this)."""
        if self.config_path is not None:
            saved = await asyncio.to_thread(_saved_urls, self.config_path)
            self.urls = _unique([*self.urls, *saved])
            if not self.urls:
                raise InvalidURLError(f"no broker URL given, and none in {self.config_path}")
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

    def _follow(self, target: str, location: str) -> str:
        leader = _base(urljoin(target + "/", location))
        self.leader = leader
        if leader not in self.urls:
            self.urls.append(leader)
        return leader

    def _gives_up_on_refusals(self, refused_rounds: int) -> bool:
        """Refused everywhere, and no broker ever answered: nothing is listening, say so."""
        return not self._reached and refused_rounds >= _REFUSED_ROUNDS

    async def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                      data: bytes | None = None, headers: dict[str, str] | None = None,
                      write: bool = False, idempotent: bool = True) -> Response:
        """One API call with failover, redirects and (for idempotent calls) retries."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_timeout
        backoff = _BACKOFF_START
        last_error: BaseException | None = None
        failures: dict[str, BaseException] = {}
        refused_rounds = 0
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        while True:
            refused_everywhere = True
            for base in self._candidates(write):
                redirects = 0
                target: str | None = base
                while target is not None:
                    try:
                        response = await self._once(method, target, path, query, data, headers)
                    except aiohttp.ClientResponseError as err:
                        raise _not_a_broker(target, "its answer is not valid HTTP") from err
                    except _NOT_SENT as err:
                        last_error = failures[target] = err
                        refused_everywhere = refused_everywhere and _refused(err)
                        self._rotate(base)
                        break
                    except _MAYBE_SENT as err:
                        if not idempotent:
                            raise PublishOutcomeUnknownError(
                                f"{method} {target}{path}: {_describe(err)} after the request "
                                "was sent; the publish may or may not have been applied",
                            ) from err
                        last_error = failures[target] = err
                        refused_everywhere = False
                        self._rotate(base)
                        break
                    self._reached = True
                    refused_everywhere = False
                    if response.status == 307 and redirects < _MAX_REDIRECTS:
                        target = self._follow(target, response.headers.get("Location", target))
                        redirects += 1
                        continue
                    if response.status == 503 and loop.time() < deadline:
                        last_error = _error(response)
                        target = None
                        break
                    if response.status >= 300:
                        raise _error(response)
                    return response
            refused_rounds = refused_rounds + 1 if refused_everywhere else 0
            if loop.time() >= deadline or self._gives_up_on_refusals(refused_rounds):
                if isinstance(last_error, MessagingError):
                    raise last_error
                raise ConnectionFailedError(_unreachable(failures)) from last_error
            await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
            backoff = min(backoff * 2, _BACKOFF_MAX)
            self.leader = None if isinstance(last_error, NoLeaderError) else self.leader

    async def _once(self, method: str, base: str, path: str, params: dict[str, str],
                    data: bytes | None, headers: dict[str, str] | None) -> Response:
        async with self.session.request(method, base + path, params=params, data=data,
                                        headers=headers, allow_redirects=False) as resp:
            body = await resp.read()
            return Response(resp.status, dict(resp.headers), body, base)

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
        return _broker_index(response)

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
            result = _json_object(response)
            first = first or _index_field(response, result, "first")
            last = _index_field(response, result, "last")
        return first, last

    async def ping(self) -> list[str]:
        """Ask the leader for the cluster's URLs; remember and persist them."""
        response = await self.request("POST", "/messaging/ping", write=True)
        urls = _url_list(response)
        if urls:
            self.urls = urls
            self._current = 0
            if self.config_path is not None:
                await _save_urls(self.config_path, urls)
        return urls

    async def topics(self) -> list[dict[str, Any]]:
        """Every topic with first/last index, size, segments and subscribers."""
        response = await self.request("GET", "/messaging/topics")
        result = response.json()
        if not isinstance(result, list) or not all(isinstance(t, dict) for t in result):
            raise _not_a_broker(response.url, "its topic list is not a JSON list of objects")
        return result

    async def topic(self, topic: int, after: int | None = None,
                    count: int | None = None) -> dict[str, Any]:
        """One topic; with ``after`` and ``count`` also the index of the count-th message."""
        response = await self.request("GET", f"/messaging/topics/{topic}",
                                      params={"after": after, "count": count})
        return _json_object(response)

    async def heartbeat(self, topic: int, index: int, url: str) -> None:
        """Tell the broker subscriber ``url`` has processed ``topic`` through ``index``."""
        await self.request("POST", "/messaging/heartbeat",
                           params={"topicID": topic, "index": index, "url": url}, write=True)

    async def read(self, topic: int, index: int = 0, end: int | None = None,
                   limit: int | None = None) -> list[Message]:
        """A non-streaming read of messages ``index`` ≤ i < ``end`` (up to ``limit``).

        ``index`` 0 means the first index retention kept.
        """
        params = {"topicID": topic, "index": index, "end": end, "limit": limit}
        try:
            response = await self.request("GET", "/messaging/messages", params=params)
        except TopicTruncatedError as err:
            if index != 0 or err.first_index <= 0:
                raise
            index = params["index"] = err.first_index
            response = await self.request("GET", "/messaging/messages", params=params)
        _check_frames(response.url, response.headers.get("Content-Type", ""))
        messages, used = decode(response.body, after=max(index - 1, 0))
        if used != len(response.body):
            raise CorruptFrameError("the broker's answer ended inside a frame")
        return messages

    def conn(self, topic: int, data_url: str | None = None,
             heartbeat_interval: float = 1.0) -> Conn:
        """A subscription to ``topic``; ``data_url`` names it for heartbeats."""
        return Conn(self, topic, data_url, heartbeat_interval)


# -- turning what came back (or did not) into MessagingErrors -------------------------------


def _saved_urls(path: Path) -> list[str]:
    """The URLs a config file holds; :class:`ClientConfigError` naming the file otherwise."""
    if not path.exists():
        return []
    try:
        config = read_json(path)
    except OSError as err:
        raise ClientConfigError(f"cannot read client config {path}: "
                                f"{(err.strerror or str(err)).lower()}") from err
    except ValueError as err:
        raise ClientConfigError(f"invalid client config {path}: not JSON ({err})") from err
    urls = config.get("urls") if isinstance(config, dict) else None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise ClientConfigError(f'invalid client config {path}: expected JSON '
                                f'{{"urls": ["http://HOST:PORT", ...]}}')
    try:
        return [_base(u) for u in urls]
    except InvalidURLError as err:
        raise ClientConfigError(f"invalid client config {path}: {err}") from err


async def _save_urls(path: Path, urls: list[str]) -> None:
    try:
        await asyncio.to_thread(write_json_atomic, path, {"urls": urls})
    except OSError as err:
        raise ClientConfigError(f"cannot write client config {path}: "
                                f"{(err.strerror or str(err)).lower()}") from err


def _not_a_broker(url: str, why: str) -> NotABrokerError:
    return NotABrokerError(f"{url or 'the URL'} does not look like a messaging broker: {why}")


def _error(response: Response) -> MessagingError:
    """The error an answer of status >= 300 stands for."""
    message = response.headers.get("X-Broker-Error")
    if message is None:  # a web server, a proxy's error page: never dump its body
        try:
            phrase = f" {HTTPStatus(response.status).phrase}"
        except ValueError:
            phrase = ""
        return _not_a_broker(response.url, f"it answered HTTP {response.status}{phrase}")
    first_index = response.headers.get("X-Broker-First-Index")
    if first_index is not None and not _is_index(first_index):
        return _not_a_broker(response.url, f"invalid X-Broker-First-Index {first_index!r}")
    return error_for_status(response.status, message.strip() or f"HTTP {response.status}",
                            first_index)


def _is_index(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _broker_index(response: Response) -> int:
    value = response.headers.get("X-Broker-Index")
    if value is None:
        raise _not_a_broker(response.url, "its answer has no X-Broker-Index")
    if not _is_index(value):
        raise _not_a_broker(response.url, f"invalid X-Broker-Index {value!r}")
    return int(value)


def _json_object(response: Response) -> dict[str, Any]:
    result = response.json()
    if not isinstance(result, dict):
        raise _not_a_broker(response.url, "its answer is not a JSON object")
    return result


def _index_field(response: Response, result: dict[str, Any], name: str) -> int:
    value = result.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _not_a_broker(response.url, f"its answer has no valid {name!r} index")
    return value


def _url_list(response: Response) -> list[str]:
    """The ``{"urls": [...]}`` of a ping (or cluster change) answer."""
    result = response.json()
    urls = result.get("urls") if isinstance(result, dict) else None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise _not_a_broker(response.url, 'its answer is not {"urls": [...]}')
    try:
        return _unique([_base(u) for u in urls])
    except InvalidURLError as err:
        raise _not_a_broker(response.url, f"it listed an {err}") from err


def _check_frames(url: str, content_type: str) -> None:
    if content_type.split(";")[0].strip().lower() != FRAMES_CONTENT_TYPE:
        raise _not_a_broker(url, f"it sent {content_type or 'no content type'}, not frames")


def _refused(err: BaseException) -> bool:
    """Whether a connection failed definitively: refused, or a host name that does not exist."""
    if not isinstance(err, aiohttp.ClientConnectorError):
        return False
    os_error = err.os_error
    if isinstance(os_error, socket.gaierror):
        return os_error.errno == socket.EAI_NONAME
    return isinstance(os_error, ConnectionRefusedError) or os_error.errno == errno.ECONNREFUSED


def _describe(err: BaseException) -> str:
    """What went wrong with a connection, in words (no library class names)."""
    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        return "the TLS certificate was not accepted"
    if isinstance(err, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(err, aiohttp.ClientConnectorError):
        return _describe_os_error(err.os_error)
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(err, aiohttp.ClientPayloadError):
        return "the answer was cut off"
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    if isinstance(err, OSError):
        return _describe_os_error(err)
    return "the connection failed"


def _describe_os_error(err: OSError) -> str:
    if isinstance(err, ConnectionRefusedError) or err.errno == errno.ECONNREFUSED:
        return "connection refused"
    if isinstance(err, socket.gaierror):
        if err.errno == socket.EAI_NONAME:
            return "unknown host"
        return f"host name lookup failed ({(err.strerror or 'no reason given').lower()})"
    if isinstance(err, TimeoutError):
        return "timed out"
    if err.strerror:
        return err.strerror[0].lower() + err.strerror[1:]
    return "the connection failed"


def _unreachable(failures: dict[str, BaseException]) -> str:
    """``cannot connect to URL: why``, for every URL that failed."""
    if len(failures) == 1:
        (url, err), = failures.items()
        return f"cannot connect to {url}: {_describe(err)}"
    reasons = "; ".join(f"{url}: {_describe(err)}" for url, err in failures.items())
    return f"cannot connect to any broker ({reasons or 'no URL tried'})"


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


class _ReadFailed(Exception):
    """One read attempt of a Conn failed for reasons worth retrying; never leaves this module."""

    def __init__(self, failures: dict[str, BaseException]) -> None:
        super().__init__(_unreachable(failures))
        self.failures = failures

    @property
    def refused(self) -> bool:
        """Whether every URL refused the connection (nothing listens there)."""
        return bool(self.failures) and all(_refused(e) for e in self.failures.values())


class Conn:
    """A subscription: ``await conn.open(index)``, then ``async for message in conn``.

    A background task reads the stream (reconnecting from ``index + 1`` with backoff after a
    break, so nothing is re-delivered or skipped) and another heartbeats :attr:`index`. When
    no broker answers for the client's ``retry_timeout`` (or, before any broker ever answered,
    every URL refuses the connection), iteration raises :class:`ConnectionFailedError`.
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
        self._from_first = False  # opened at index 0 and nothing received yet
        self._answered = False  # the last read attempt got a 200
        self.reconnects = 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._state == "closed"

    async def open(self, index: int = 0, streaming: bool = True) -> None:
        """Start reading from ``index`` (inclusive); non-streaming stops at the topic's end.

        ``index`` 0 starts at the first index retention kept; reading from a nonzero index
        that retention deleted raises :class:`TopicTruncatedError` while iterating.
        """
        if self._state == "closed":
            raise ConnClosedError("this Conn is closed; create a new one")
        if self._state == "open":
            raise ConnStateError("this Conn is already open")
        self._state = "open"
        self.streaming = streaming
        self.index = self._received = max(index - 1, 0)
        self._from_first = index == 0
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
        loop = asyncio.get_running_loop()
        backoff = _BACKOFF_START
        failures = 0
        refused_rounds = 0
        failing_since: float | None = None
        error: MessagingError | None
        while True:
            before = self._received
            self._answered = False
            try:
                finished = await self._read_once()
            except TopicTruncatedError as err:
                if not self._from_first or err.first_index - 1 <= self._received:
                    await self._queue.put(err)
                    return
                # Opened at 0 ("from the first kept"): start where retention left off.
                log.info("topic %d: starting at the first kept index %d", self.topic,
                         err.first_index)
                self._received = err.first_index - 1
                continue
            except _ReadFailed as err:
                finished, error, refused = False, ConnectionFailedError(str(err)), err.refused
            except MessagingError as err:  # a broken frame or a 503 may pass; others won't
                if not isinstance(err, CorruptFrameError) and err.status != 503:
                    await self._queue.put(err)
                    return
                finished, error, refused = False, err, False
            else:
                error, refused = None, False
            if finished:
                await self._queue.put(_End())
                return
            if self._received > before:  # it was making progress: reconnect at once
                backoff = _BACKOFF_START
                failures = 0
            if self._answered:
                failing_since = None
            if error is not None:
                now = loop.time()
                failing_since = now if failing_since is None else failing_since
                failures += 1
                refused_rounds = refused_rounds + 1 if refused else 0
                log.info("topic %d: read failed after index %d (%s); retrying", self.topic,
                         self._received, error)
                if (now - failing_since >= self.client.retry_timeout or failures > 1000
                        or self.client._gives_up_on_refusals(refused_rounds)):
                    await self._queue.put(error)
                    return
            self.reconnects += 1
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def _read_once(self) -> bool:
        """One GET; returns whether it reached the end of a non-streaming read."""
        client = self.client
        params = {"topicID": str(self.topic), "index": str(self._received + 1),
                  "streaming": "true" if self.streaming else "false"}
        failures: dict[str, BaseException] = {}
        for base in client._candidates(write=False):
            try:
                resp = await client.session.get(base + "/messaging/messages", params=params,
                                                allow_redirects=False)
            except aiohttp.ClientResponseError as err:
                raise _not_a_broker(base, "its answer is not valid HTTP") from err
            except _MAYBE_SENT as err:
                failures[base] = err
                client._rotate(base)
                continue
            client._reached = True
            try:
                async with resp:
                    if resp.status >= 300:
                        body = await resp.read()
                        raise _error(Response(resp.status, dict(resp.headers), body, base))
                    _check_frames(base, resp.headers.get("Content-Type", ""))
                    self._answered = True
                    return await self._consume(resp)
            except _MAYBE_SENT as err:  # the stream broke: resume from the same broker
                raise _ReadFailed({base: err}) from err
        raise _ReadFailed(failures)

    async def _consume(self, resp: aiohttp.ClientResponse) -> bool:
        decoder = BatchDecoder(after=self._received)
        async for data in resp.content.iter_any():
            for batch in decoder.feed(data):
                self._received = batch.last
                self._from_first = False
                await self._queue.put(MessageBatch(self.topic, batch.buffer, batch.count,
                                                   batch.first, batch.last))
        decoder.finish()
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
