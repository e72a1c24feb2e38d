"""The async Python client: Client (publish, read, ping, topics, heartbeats).

Client owns the HTTP session and turns broker answers (or their absence) into results or
:class:`MessagingError` subclasses worded for users: what failed, where, and why. Which broker
to try, redirects and retry timing are :mod:`messaging.failover`'s decisions. Publishes are
idempotent by default (:mod:`~messaging.client.producer`): each carries producer headers, so
one whose answer was lost is sent again and the broker stores it once. With ``idempotent=False`` a
publish that may have reached a broker is never retried: the caller gets
:class:`PublishOutcomeUnknownError`. Subscriptions are :class:`Conn` (:mod:`messaging.client.conn`),
re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from messaging.client.conn import TIMES_ATTEMPTS, TIMES_RETRY_DELAY, Conn
from messaging.client.producer import Lanes
from messaging.client.times import TimeRuns, timed
from messaging.config import DEFAULT_MAX_REQUEST_SIZE
from messaging.errors import (
    ClientConfigError,
    ConnectionFailedError,
    ConnStateError,
    CorruptFrameError,
    InvalidURLError,
    MessagingError,
    NoLeaderError,
    NotABrokerError,
    ProducerSequenceGapError,
    PublishOutcomeUnknownError,
    TopicTruncatedError,
    error_for_status,
    is_unsigned,
)
from messaging.failover import (
    DEFAULT_RETRY_TIMEOUT,
    GROUPS_MAX_AGE,
    GROUPS_REFRESH,
    Brokers,
    GroupMap,
    Retry,
    RetryPolicy,
    base_url,
    refused,
    topic_of,
    unique,
)
from messaging.files import read_json, write_json_atomic
from messaging.frames import FRAMES_CONTENT_TYPE, HEADER_SIZE, Message, decode, encode_batch
from messaging.headers import (
    DUPLICATE_HEADER,
    INDEX_HEADER,
    NODE_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQ_HEADER,
)
from messaging.json_ids import parse_u64, with_integers

__all__ = ["DEFAULT_MAX_REQUEST_SIZE", "DEFAULT_RETRY_TIMEOUT", "Client", "Conn",
           "Published", "Response"]

_CONNECT_TIMEOUT: tuple[type[BaseException], ...] = tuple(
    t for t in [getattr(aiohttp, "ConnectionTimeoutError", None)] if t is not None)
# Failures of a request that never left this machine (safe to send elsewhere) ...
_NOT_SENT: tuple[type[BaseException], ...] = (aiohttp.ClientConnectorError,
                                                *_CONNECT_TIMEOUT)
# ... and of one that may have reached a broker.
_MAYBE_SENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


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
            raise NotABrokerError.at(self.url, "its answer is not JSON") from err


class Client:
    """A connection pool to a broker or cluster; use as ``async with Client(urls) as c``."""

    def __init__(self, urls: Sequence[str] | str, config_path: Path | str | None = None, *,
                 timeout: float = 30.0, retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 idempotent: bool = True, producer_id: str | None = None,
                 token: str | None = None, ca: Path | str | None = None) -> None:
        self.config_path = Path(config_path) if config_path is not None else None
        # The config file is read by open(), on a thread: nothing here touches the disk.
        self.brokers = Brokers([urls] if isinstance(urls, str) else urls)
        if not self.brokers.urls and self.config_path is None:
            raise InvalidURLError("no broker URL given")
        #: Seconds to connect, and for a broker to start answering a request (its status and
        #: headers): a node that accepts connections but never answers (stopped, hung) counts
        #: as failed after it and the request goes to the next node.
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.max_request_size = max_request_size
        #: Producer lanes of idempotent publishes (None: publishes are not idempotent).
        self.producers = Lanes(producer_id) if idempotent else None
        self.token = token  # sent as Authorization: Bearer on every request
        self.ca = Path(ca) if ca is not None else None  # verifies https brokers' certificates
        self._session: aiohttp.ClientSession | None = None
        # The map of topic groups: asked for on the first request on a topic, again when an
        # answer shows it stale (a node that does not hold the topic served it, or a holder
        # failed); never again once a broker said it has no groups (404).
        self._groups_asked: float | None = None
        self._groups_stale = False
        self._groups_absent = False

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Read the config file, create the HTTP session (``async with`` does this)."""
        if self.config_path is not None:
            self.brokers.add(await asyncio.to_thread(_saved_urls, self.config_path))
            if not self.brokers.urls:
                raise InvalidURLError(f"no broker URL given, and none in {self.config_path}")
        if self._session is None:
            context: ssl.SSLContext | bool = True
            if self.ca is not None:
                context = await asyncio.to_thread(_ssl_context, self.ca)
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout),
                connector=aiohttp.TCPConnector(limit=0, ssl=context),
                headers={"Authorization": f"Bearer {self.token}"} if self.token else None)

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

    @property
    def urls(self) -> list[str]:
        """The broker URLs this client knows (``scheme://host:port``)."""
        return self.brokers.urls

    @property
    def leader(self) -> str | None:
        """The broker a 307 last pointed at, tried first for writes."""
        return self.brokers.leader

    @property
    def reached(self) -> bool:
        """Whether any broker ever answered this client."""
        return self.brokers.reached

    @property
    def retry_policy(self) -> RetryPolicy:
        """Backoff and give-up rules, with ``retry_timeout`` as the time budget."""
        if math.isinf(self.retry_timeout):  # retry forever: no cap on failed rounds either
            return RetryPolicy(budget=math.inf, max_failures=sys.maxsize)
        return RetryPolicy(budget=self.retry_timeout)

    # -- requests with failover -------------------------------------------------------------

    async def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                      data: bytes | None = None, headers: dict[str, str] | None = None,
                      write: bool = False, idempotent: bool = True,
                      timeout: float | None = None) -> Response:
        """One API call with failover, redirects and (for idempotent calls) retries.

        Reads, pings and heartbeats retry with backoff for ``retry_timeout`` seconds (503s
        too); while no broker ever answered, a refused connection (or an unknown host) on
        every URL is definitive after a few quick rounds. Only :class:`MessagingError`
        subclasses leave it. ``timeout`` replaces the client's for how long each broker may
        take to start answering.
        """
        loop = asyncio.get_running_loop()
        retry = Retry(self.retry_policy, started=loop.time())
        last_error: BaseException | None = None
        failures: dict[str, BaseException] = {}
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        topic = topic_of(query, path)
        while True:
            refused_everywhere = True
            for base in await self._order(write, topic):
                try:
                    url, resp = await self._send(method, base, path, query, data, headers,
                                                 timeout=timeout)
                    async with resp:
                        response = Response(resp.status, dict(resp.headers),
                                            await _read(url, resp), url)
                    self._note_server(url, response.headers)
                except _Failed as failed:
                    self._groups_stale = True
                    if not idempotent and failed.sent:
                        raise PublishOutcomeUnknownError(
                            f"{method} {failed.url}{path}: {_describe(failed.err)} after the "
                            "request was sent; the publish may or may not have been applied",
                        ) from failed.err
                    last_error = failures[failed.url] = failed.err
                    refused_everywhere = refused_everywhere and _refused(failed.err)
                    self.brokers.failed(base)
                    continue
                refused_everywhere = False
                if (response.status == 503 or (response.status == 504 and idempotent)) and (
                        not retry.exhausted(loop.time())):
                    last_error = error_for_status(503, response.headers, response.url)
                    continue
                if response.status >= 300:
                    raise error_for_status(response.status, response.headers, response.url)
                return response
            if not retry.failed(loop.time(), refused_everywhere=refused_everywhere,
                                reached=self.brokers.reached):
                if isinstance(last_error, MessagingError):
                    raise last_error
                raise ConnectionFailedError(_unreachable(failures),
                                            refused=refused_everywhere) from last_error
            await asyncio.sleep(retry.delay(loop.time()))
            if isinstance(last_error, NoLeaderError):
                self.brokers.forget_leader()

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: dict[str, str],
                     content_type: str) -> AsyncIterator[AsyncIterator[bytes]]:
        """``GET path`` from the first broker that answers, its body as chunks while open.

        One round over the URLs (following 307s) and no retries: the caller resumes from
        where it got to. :class:`ConnectionFailedError` when no broker could be reached or
        the body broke off (``refused`` when every URL refused the connection); an error
        answer, or one that is not ``content_type``, raises its :class:`MessagingError`.
        """
        failures: dict[str, BaseException] = {}
        for base in await self._order(False, topic_of(params)):
            try:
                url, resp = await self._send("GET", base, path, params)
            except _Failed as failed:
                failures[failed.url] = failed.err
                self.brokers.failed(base)
                self._groups_stale = True
                continue
            self._note_server(url, resp.headers)
            async with resp:
                if resp.status >= 300:
                    raise error_for_status(resp.status, resp.headers, url)
                _check_content_type(url, resp.headers.get("Content-Type", ""), content_type)
                yield _Chunks(url, resp)
                return
        raise ConnectionFailedError(
            _unreachable(failures),
            refused=bool(failures) and all(_refused(e) for e in failures.values()))

    async def _order(self, write: bool, topic: int | str | None) -> list[str]:
        """The brokers to try for a request (on ``topic``: its group's holders first)."""
        if topic is not None:
            await self._learn_groups()
        return self.brokers.order(write, topic)

    def _note_server(self, url: str, headers: Mapping[str, str]) -> None:
        """A node other than the one asked served the request: the map is stale."""
        served = headers.get(NODE_HEADER)
        if served is not None and self.brokers.groups is not None and served != url:
            self._groups_stale = True

    async def _learn_groups(self) -> None:
        """Ask the cluster for its map of topic groups (one quick round, no retries)."""
        if self._groups_absent:
            return
        now = asyncio.get_running_loop().time()
        asked = self._groups_asked
        if asked is not None and now - asked < (GROUPS_REFRESH if self._groups_stale
                                                else GROUPS_MAX_AGE):
            return
        self._groups_asked, self._groups_stale = now, False
        for base in self.brokers.order(write=False):
            try:
                resp = await self.session.get(base + "/messaging/groups", allow_redirects=False)
            except _MAYBE_SENT:
                continue
            async with resp:
                if resp.status == 404:  # one group (or a single node): nothing to map
                    self._groups_absent = True
                    return
                if resp.status != 200:
                    continue
                try:
                    answer = await resp.json(content_type=None)
                except (ValueError, aiohttp.ClientError):
                    continue
            groups = GroupMap.parse(answer)
            if groups is not None:
                self.brokers.groups = groups
                self.brokers.add(u for urls in groups.holders.values() for u in urls)
                return

    async def _send(self, method: str, base: str, path: str, params: dict[str, str],
                    data: bytes | None = None, headers: dict[str, str] | None = None,
                    timeout: float | None = None) -> tuple[str, aiohttp.ClientResponse]:
        """Send to ``base``, following 307s: the broker that answered and its open answer.

        A failed connection, or no answer within ``timeout`` (default the client's), raises
        :class:`_Failed`; the caller reads and releases the answer.
        """
        url, hops = base, 0
        wait = self.timeout if timeout is None else timeout
        while True:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result
                # and drops a cancellation that arrives as the answer does, and a Conn that
                # is closing would then go on streaming forever.
                async with asyncio.timeout(wait):
                    resp = await self.session.request(method, url + path, params=params,
                                                      data=data, headers=headers,
                                                      allow_redirects=False)
            except aiohttp.ClientResponseError as err:
                raise NotABrokerError.at(url, "its answer is not valid HTTP") from err
            except _MAYBE_SENT as err:
                raise _Failed(url, err) from err
            self.brokers.answered(url)
            following = None
            if resp.status == 307:
                location = resp.headers.get("Location", url)
                following = self.brokers.redirected(url, location, hops)
            if following is None:
                return url, resp
            resp.release()
            url, hops = following, hops + 1

    # -- the API ----------------------------------------------------------------------------

    async def publish(self, topic: int, data: bytes, type: int = 1) -> int:
        """Publish one message; returns its index once the broker acknowledged it.

        Idempotent (unless the client was made with ``idempotent=False``): retried until the
        broker answers, and stored once however often it was sent.
        """
        response = await self._publish(topic, {"topicID": topic, "type": type}, data,
                                       "application/octet-stream")
        return _broker_index(response)

    async def _publish(self, topic: int, params: dict[str, Any], data: bytes,
                       content_type: str) -> Response:
        """POST one publish request, on a producer lane of ``topic`` when idempotent.

        A broker that answers a lane's request with "new here, start at seq 0" has forgotten
        the producer (its topic was deleted, or the producer went unused for a week): nothing
        of the request is stored, so it is sent once more as a new epoch from seq 0 (the
        old epoch fenced, should a copy of an earlier attempt still arrive).
        """
        lanes = self.producers
        lane = lanes.take(topic) if lanes is not None else None
        for attempt in range(2):
            try:
                response = await self.request(
                    "POST", "/messaging/messages", params=params, data=data,
                    headers={"Content-Type": content_type,
                             **(lane.headers() if lane is not None else {})},
                    write=True, idempotent=lane is not None)
            except ProducerSequenceGapError as err:
                if lane is not None and attempt == 0 and err.expected == 0 and lane.seq > 0:
                    lane.epoch, lane.seq = lane.epoch + 1, 0
                    continue
                if lane is not None and lanes is not None:
                    lanes.give_back(lane, err)
                raise
            except BaseException as err:
                if lane is not None and lanes is not None:
                    lanes.give_back(lane, err)
                raise
            break
        if lane is not None and lanes is not None:
            lanes.give_back(lane)
        return response

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
            response = await self._publish(topic, {"topicID": topic},
                                           encode_batch(topic, chunk, type),
                                           FRAMES_CONTENT_TYPE)
            result = _json_object(response)
            first = first or _index_field(response, result, "first")
            last = _index_field(response, result, "last")
        return first, last

    async def ping(self, timeout: float | None = None) -> list[str]:
        """Ask the leader for the cluster's URLs; remember and persist them. ``timeout``: how
        long each broker may take to answer (default the client's)."""
        response = await self.request("POST", "/messaging/ping", write=True, timeout=timeout)
        urls = _url_list(response)
        if urls:
            self.brokers.replace(urls, start=response.url)
            if self.config_path is not None:
                await _save_urls(self.config_path, urls)
        return urls

    async def topics(self) -> list[dict[str, Any]]:
        """Every topic with first/last index, size, segments and subscribers."""
        response = await self.request("GET", "/messaging/topics")
        result = response.json()
        if not isinstance(result, list) or not all(isinstance(t, dict) for t in result):
            raise NotABrokerError.at(response.url, "its topic list is not a JSON list of objects")
        return [_integers(response, row, _TOPIC_INTEGERS) for row in result]

    async def topic(self, topic: int | str, after: int | None = None,
                    count: int | None = None, last: int | None = None,
                    at: int | str | None = None) -> dict[str, Any]:
        """One topic (an id, or a stream's name); with ``after`` and ``count`` also the index
        of the count-th message, with ``last`` that of the last-th message from the end, with
        ``at`` (ms since the epoch, RFC 3339 text, or a duration back from now such as
        ``"15m"``) that of the first message appended at or after then (None: none yet)."""
        response = await self.request("GET", f"/messaging/topics/{quote(str(topic), safe='')}",
                                      params={"after": after, "count": count, "last": last,
                                              "at": at})
        return _integers(response, _json_object(response), _TOPIC_INTEGERS)

    async def times(self, topic: int | str, index: int = 0,
                    end: int | None = None) -> TimeRuns:
        """When ``topic``'s messages from ``index`` (to ``end``, exclusive) were appended."""
        response = await self.request("GET", "/messaging/times",
                                      params={"topicID": topic, "index": index, "end": end})
        return TimeRuns.parse(_json_object(response))  # ids as numbers or strings alike

    # -- topic management (PUT, GET, DELETE /messaging/topics/{id}) ---------------------------

    async def create_topic(self, topic: int | str, **settings: int | str | None,
                           ) -> dict[str, Any]:
        """Create ``topic`` (an id; or a stream's name, whose topic exists already) with
        ``settings``, or change those of a topic that exists: the same request. Settings are
        keywords: ``max_topic_size``, ``max_segment_size``, ``max_message_size``, each a byte
        count or a size text such as ``"10M"``, and ``retention_age`` (ms, or a duration
        text such as ``"7d"``; 0 turns age retention off for the topic); None resets one to
        the broker's value.
        Returns :meth:`describe_topic`'s answer."""
        return await self.configure_topic(topic, **settings)

    async def configure_topic(self, topic: int | str, **settings: int | str | None,
                              ) -> dict[str, Any]:
        """Change ``topic``'s settings (only those given; see :meth:`create_topic`)."""
        body = {key.replace("_", "-"): value for key, value in settings.items()}
        response = await self.request(
            "PUT", f"/messaging/topics/{quote(str(topic), safe='')}",
            data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
            write=True)
        return _integers(response, _json_object(response), _TOPIC_INTEGERS)

    async def describe_topic(self, topic: int | str) -> dict[str, Any]:
        """``topic`` as :meth:`topic` shows it, with ``settings``: each setting's ``value``
        and ``source`` (``topic``, ``broker`` or ``default``)."""
        return await self.topic(topic)

    async def delete_topic(self, topic: int | str) -> dict[str, Any]:
        """Delete a native topic (admin): its messages, settings and consumer positions, on
        every node. Not retried once sent (a second delete would answer 410)."""
        response = await self.request("DELETE", f"/messaging/topics/{quote(str(topic), safe='')}",
                                      write=True, idempotent=False)
        return _integers(response, _json_object(response), ("id", "deleted_at"))

    async def heartbeat(self, topic: int, index: int, url: str) -> None:
        """Tell the broker subscriber ``url`` has processed ``topic`` through ``index``."""
        await self.request("POST", "/messaging/heartbeat",
                           params={"topicID": topic, "index": index, "url": url}, write=True)

    async def read(self, topic: int, index: int = 0, end: int | None = None,
                   limit: int | None = None, *, since: int | str | None = None,
                   times: bool = False) -> list[Message]:
        """A non-streaming read of messages ``index`` ≤ i < ``end`` (up to ``limit``).

        ``index`` 0 means the first index retention kept. ``since`` (ms since the epoch,
        RFC 3339 text, or a duration back from now such as ``"15m"``) starts at the first
        message appended at or after then instead. ``times``: each message carries its
        append time (:attr:`Message.time`), at the cost of one more request.
        """
        params: dict[str, Any] = {"topicID": topic, "index": index, "end": end,
                                  "limit": limit}
        if since is not None:
            if index:
                raise ValueError("give index or since, not both")
            del params["index"]
            params["since"] = since
        try:
            response = await self.request("GET", "/messaging/messages", params=params)
        except TopicTruncatedError as err:
            if index != 0 or err.first_index <= 0:
                raise
            params.pop("since", None)  # retention passed the time's message: from the first
            index = params["index"] = err.first_index
            response = await self.request("GET", "/messaging/messages", params=params)
        _check_content_type(response.url, response.headers.get("Content-Type", ""),
                            FRAMES_CONTENT_TYPE)
        messages, used = decode(response.body, after=max(index - 1, 0))
        if used != len(response.body):
            raise CorruptFrameError("the broker's answer ended inside a frame")
        if times and messages:
            return await self._stamp_times(topic, messages)
        return messages

    async def _stamp_times(self, topic: int, messages: list[Message]) -> list[Message]:
        """``messages`` (in index order) with their append times, asking again while the
        node that answers is behind the one that served them (a cluster)."""
        stamped: list[Message] = []
        for attempt in range(TIMES_ATTEMPTS):
            if attempt:
                await asyncio.sleep(TIMES_RETRY_DELAY * attempt)
            runs = await self.times(topic, messages[len(stamped)].index,
                                    messages[-1].index + 1)
            while len(stamped) < len(messages):
                message = messages[len(stamped)]
                if message.index < runs.index:  # retention took it since: its time too
                    stamped.append(timed(message, None))
                elif runs.covers(message.index):
                    stamped.append(timed(message, runs.time_of(message.index)))
                else:
                    break
            if len(stamped) == len(messages):
                return stamped
        raise MessagingError(f"topic {topic}: no broker answered the append times of "
                             f"messages from index {messages[len(stamped)].index}")

    def conn(self, topic: int, data_url: str | None = None,
             heartbeat_interval: float = 1.0, *, consumer: str | None = None,
             times: bool = False) -> Conn:
        """A subscription to ``topic``; ``data_url`` names it for heartbeats.

        With ``consumer`` it starts right after that consumer's stored position and
        heartbeats as it; ``heartbeat_interval`` 0 leaves committing to :meth:`Conn.commit`.
        With ``times`` every message it hands out carries its append time
        (:attr:`Message.time`; fetched a stretch at a time, not per message).
        """
        return Conn(self, topic, data_url, heartbeat_interval, consumer, times=times)

    # -- stored consumer positions and explicit producers (messaging.client.consumer, .journal) ---

    async def consumers(self, topic: int | None = None,
                        name: str | None = None) -> list[dict[str, Any]]:
        """Stored consumer positions: topic, name, index, last_index, lag, last_seen, live."""
        response = await self.request("GET", "/messaging/consumers",
                                      params={"topicID": topic, "name": name})
        result = response.json()
        if not isinstance(result, list) or not all(isinstance(c, dict) for c in result):
            raise NotABrokerError.at(response.url, "its consumer list is not a JSON list")
        return [_integers(response, row, _CONSUMER_INTEGERS) for row in result]

    async def reset_consumer(self, name: str, topic: int, index: int) -> None:
        """Set consumer ``name``'s position in ``topic`` to ``index`` (also backwards)."""
        await self.request("PUT", f"/messaging/consumers/{quote(name, safe='')}",
                           params={"topicID": topic, "index": index}, write=True)

    async def delete_consumer(self, name: str, topic: int | None = None) -> list[int]:
        """Forget consumer ``name`` (in ``topic``, or everywhere); returns the topics."""
        response = await self.request("DELETE", f"/messaging/consumers/{quote(name, safe='')}",
                                      params={"topicID": topic}, write=True)
        topics = _json_object(response).get("topics")
        return [int(t) for t in topics] if isinstance(topics, list) else []

    async def publish_as(self, topic: int, datas: Sequence[bytes],
                         producer: tuple[str, int, int], type: int = 1) -> Published:
        """Publish ``datas`` as one all-or-nothing request with explicit producer headers.

        ``producer`` is ``(id, epoch, seq)``: sending the same one again (after a crash, by
        another process) is stored once; the answer says whether this one was a duplicate
        (then the indexes are the original's). Retried like any idempotent publish; a fenced
        epoch (403) or a sequence gap (409) raises.
        """
        if not datas:
            raise MessagingError("publish_as needs at least one message")
        pid, epoch, seq = producer
        response = await self.request(
            "POST", "/messaging/messages", params={"topicID": topic},
            data=encode_batch(topic, datas, type),
            headers={"Content-Type": FRAMES_CONTENT_TYPE, PRODUCER_ID_HEADER: pid,
                     PRODUCER_EPOCH_HEADER: str(epoch), PRODUCER_SEQ_HEADER: str(seq)},
            write=True)
        result = _json_object(response)
        return Published(_index_field(response, result, "first"),
                         _index_field(response, result, "last"),
                         response.headers.get(DUPLICATE_HEADER) == "true")


@dataclass(frozen=True, slots=True)
class Published:
    """The answer to :meth:`Client.publish_as`: the stored index range, and whether the
    request was a duplicate of one stored before."""

    first: int
    last: int
    duplicate: bool


# -- turning what came back (or did not) into MessagingErrors -------------------------------


def _ssl_context(ca: Path) -> ssl.SSLContext:
    """A TLS context that trusts the CA in ``ca`` (a PEM file)."""
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as err:
        raise ClientConfigError(f"cannot use CA file {ca}: {err}") from err


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
        return [base_url(u) for u in urls]
    except InvalidURLError as err:
        raise ClientConfigError(f"invalid client config {path}: {err}") from err


async def _save_urls(path: Path, urls: list[str]) -> None:
    try:
        await asyncio.to_thread(write_json_atomic, path, {"urls": urls})
    except OSError as err:
        raise ClientConfigError(f"cannot write client config {path}: "
                                f"{(err.strerror or str(err)).lower()}") from err


def _broker_index(response: Response) -> int:
    value = response.headers.get(INDEX_HEADER)
    if value is None:
        raise NotABrokerError.at(response.url, f"its answer has no {INDEX_HEADER}")
    if not is_unsigned(value):
        raise NotABrokerError.at(response.url, f"invalid {INDEX_HEADER} {value!r}")
    return int(value)


def _json_object(response: Response) -> dict[str, Any]:
    result = response.json()
    if not isinstance(result, dict):
        raise NotABrokerError.at(response.url, "its answer is not a JSON object")
    return result


#: The fields of a topic's and of a consumer's row that hold ids and indexes: ints here,
#: whether the broker wrote them as numbers or (from 2^53 up) as strings.
_TOPIC_INTEGERS = ("id", "first_index", "last_index", "index", "subscribers")
_CONSUMER_INTEGERS = ("topic", "index", "last_index", "lag")


def _integers(response: Response, row: dict[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """``row`` with its id and index ``fields`` as ints (:func:`json_ids.with_integers`)."""
    try:
        return with_integers(row, fields)
    except ValueError as err:
        raise NotABrokerError.at(response.url, f"its answer holds an {err}") from err


def _index_field(response: Response, result: dict[str, Any], name: str) -> int:
    """An index of a JSON answer: a number, or a decimal string from 2^53 up (json_ids)."""
    try:
        return parse_u64(result.get(name), name)
    except ValueError as err:
        raise NotABrokerError.at(response.url, f"its answer has no valid {name!r} index") from err


def _url_list(response: Response) -> list[str]:
    """The ``{"urls": [...]}`` of a ping (or cluster change) answer."""
    result = response.json()
    urls = result.get("urls") if isinstance(result, dict) else None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise NotABrokerError.at(response.url, 'its answer is not {"urls": [...]}')
    try:
        return unique(base_url(u) for u in urls)
    except InvalidURLError as err:
        raise NotABrokerError.at(response.url, f"it listed an {err}") from err


def _check_content_type(url: str, content_type: str, wanted: str) -> None:
    if content_type.split(";")[0].strip().lower() != wanted:
        what = "frames" if wanted == FRAMES_CONTENT_TYPE else wanted
        raise NotABrokerError.at(url, f"it sent {content_type or 'no content type'}, not {what}")


def _refused(err: BaseException) -> bool:
    """Whether a connection failed definitively (see :func:`messaging.failover.refused`): also
    a TLS handshake or certificate that failed, which no retry mends (https to an http port,
    the wrong CA), and a connection closed without an answer (an HTTPS port given an http://
    URL): while no broker ever answered, a few rounds of these end the request."""
    if isinstance(err, aiohttp.ClientSSLError | aiohttp.ClientConnectorCertificateError
                  | aiohttp.ServerDisconnectedError):
        return True
    return isinstance(err, aiohttp.ClientConnectorError) and refused(err.os_error)


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
    if isinstance(err, socket.gaierror):
        if err.errno == socket.EAI_NONAME:
            return "unknown host"
        return f"host name lookup failed ({(err.strerror or 'no reason given').lower()})"
    if refused(err):
        return "connection refused"
    if isinstance(err, TimeoutError):
        return "timed out"
    if err.strerror:
        return err.strerror[0].lower() + err.strerror[1:]
    return "the connection failed"


def _why(url: str, err: BaseException) -> str:
    """:func:`_describe`, with what a connection closed before any answer usually means."""
    if isinstance(err, aiohttp.ServerDisconnectedError) and url.startswith("http://"):
        return ("the server closed the connection without an answer (an HTTPS port given an "
                "http:// URL does this)")
    return _describe(err)


def _unreachable(failures: dict[str, BaseException]) -> str:
    """``cannot connect to URL: why``, for every URL that failed."""
    if len(failures) == 1:
        (url, err), = failures.items()
        return f"cannot connect to {url}: {_why(url, err)}"
    reasons = "; ".join(f"{url}: {_why(url, err)}" for url, err in failures.items())
    return f"cannot connect to any broker ({reasons or 'no URL tried'})"


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


class _Failed(Exception):
    """A connection to ``url`` failed with ``err``; never leaves this module."""

    def __init__(self, url: str, err: BaseException) -> None:
        super().__init__(url, err)
        self.url = url
        self.err = err

    @property
    def sent(self) -> bool:
        """Whether the request may have reached the broker."""
        return not isinstance(self.err, _NOT_SENT)


async def _read(url: str, resp: aiohttp.ClientResponse) -> bytes:
    """The whole body of an answer; :class:`_Failed` if it breaks off."""
    try:
        return await resp.read()
    except _MAYBE_SENT as err:
        raise _Failed(url, err) from err


class _Chunks:
    """A streaming answer's body as chunks; a break becomes :class:`ConnectionFailedError`."""

    def __init__(self, url: str, response: aiohttp.ClientResponse) -> None:
        self.url = url
        self._response = response

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            data = await self._response.content.readany()
        except _MAYBE_SENT as err:
            raise ConnectionFailedError(_unreachable({self.url: err}),
                                        refused=_refused(err)) from err
        if not data:
            raise StopAsyncIteration
        return data
