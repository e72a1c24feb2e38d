"""The client's transport: requests to a broker or cluster, with failover.

:class:`Transport` owns the HTTP session and the brokers it knows; it sends a request to one
broker after another (following 307s, retrying idempotent calls with backoff) until one
answers, and learns the cluster's map of topic groups so that a request on a topic goes to the
topic's holders first. Which broker to try, where a 307 leads and how long to retry are
:mod:`messaging.failover`'s decisions; what a failed connection means is
:mod:`messaging.client.failures`'. The API (:class:`~messaging.client.Client`) is built on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import ssl
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from messaging.client.answers import Response, check_content_type
from messaging.client.exchange import Exchanges, NotHttp
from messaging.client.failures import MAYBE_SENT, NOT_SENT, definitive, describe, unreachable
from messaging.errors import (
    ClientConfigError,
    ConnectionFailedError,
    ConnStateError,
    MessagingError,
    NoLeaderError,
    NotABrokerError,
    PublishOutcomeUnknownError,
    error_for_status,
)
from messaging.failover import (
    DEFAULT_RETRY_TIMEOUT,
    GROUPS_MAX_AGE,
    GROUPS_REFRESH,
    Brokers,
    GroupMap,
    Retry,
    RetryPolicy,
    topic_of,
)
from messaging.headers import (
    AUTHORIZATION_HEADER,
    CONTENT_TYPE_HEADER,
    LOCATION_HEADER,
    NODE_HEADER,
)

__all__ = ["Transport"]

#: Paths a POST takes the plain exchange for (nothing in them needs quoting).
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9/._~-]*")


class Transport:
    """Requests with failover over one HTTP session; :meth:`open` before, :meth:`close` after."""

    def __init__(self, urls: Sequence[str] | str, *, timeout: float = 30.0,
                 retry_timeout: float = DEFAULT_RETRY_TIMEOUT, token: str | None = None,
                 ca: Path | str | None = None) -> None:
        self.brokers = Brokers([urls] if isinstance(urls, str) else urls)
        #: Seconds to connect, and for a broker to start answering a request (its status and
        #: headers): a node that accepts connections but never answers (stopped, hung) counts
        #: as failed after it and the request goes to the next node.
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.token = token  # sent as Authorization: Bearer on every request
        self.ca = Path(ca) if ca is not None else None  # verifies https brokers' certificates
        self._session: aiohttp.ClientSession | None = None
        # POSTs to http:// brokers (publishes, heartbeats): plain exchanges, not aiohttp's
        # request machinery (see messaging.client.exchange).
        self._exchanges: Exchanges | None = None
        # The map of topic groups: asked for on the first request on a topic, again when an
        # answer shows it stale (a node that does not hold the topic served it, or a holder
        # failed); never again once a broker said it has no groups (404).
        self._groups_asked: float | None = None
        self._groups_stale = False
        self._groups_absent = False

    async def open(self) -> None:
        """Create the HTTP session (the CA file, if any, is read on a thread)."""
        if self._session is None:
            context: ssl.SSLContext | bool = True
            if self.ca is not None:
                context = await asyncio.to_thread(_ssl_context, self.ca)
            headers = {AUTHORIZATION_HEADER: f"Bearer {self.token}"} if self.token else None
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout),
                connector=aiohttp.TCPConnector(limit=0, ssl=context), headers=headers)
            self._exchanges = Exchanges(self.timeout, headers)

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._exchanges is not None:
            self._exchanges.close()
            self._exchanges = None
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
                    if method == "POST" and base.startswith("http://") \
                            and _PLAIN_PATH.fullmatch(path):
                        url, response = await self._exchange(method, base, path, query, data,
                                                             headers, timeout)
                    else:
                        url, response = await self._send_read(method, base, path, query, data,
                                                              headers, timeout)
                    self._note_server(url, response.headers)
                except _Failed as failed:
                    self._groups_stale = True
                    if not idempotent and failed.sent:
                        raise PublishOutcomeUnknownError(
                            f"{method} {failed.url}{path}: {describe(failed.err)} after the "
                            "request was sent; the publish may or may not have been applied",
                        ) from failed.err
                    last_error = failures[failed.url] = failed.err
                    refused_everywhere = refused_everywhere and definitive(failed.err)
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
                raise ConnectionFailedError(unreachable(failures),
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
                check_content_type(url, resp.headers.get(CONTENT_TYPE_HEADER, ""), content_type)
                yield _Chunks(url, resp)
                return
        raise ConnectionFailedError(
            unreachable(failures),
            refused=bool(failures) and all(definitive(e) for e in failures.values()))

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
            except MAYBE_SENT:
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

    async def _send_read(self, method: str, base: str, path: str, params: dict[str, str],
                         data: bytes | None, headers: dict[str, str] | None,
                         timeout: float | None) -> tuple[str, Response]:
        """:meth:`_send`, and the whole answer read."""
        url, resp = await self._send(method, base, path, params, data, headers, timeout=timeout)
        async with resp:
            return url, Response(resp.status, dict(resp.headers), await _read(url, resp), url)

    async def _exchange(self, method: str, base: str, path: str, params: dict[str, str],
                        data: bytes | None, headers: dict[str, str] | None,
                        timeout: float | None) -> tuple[str, Response]:
        """:meth:`_send_read` over a plain exchange (an http:// broker), following 307s; the
        whole answer must come within ``timeout`` (default the client's)."""
        exchanges = self._exchanges
        if exchanges is None:
            raise ConnStateError("the client is not open: use 'async with Client(...)'")
        url, hops = base, 0
        wait = self.timeout if timeout is None else timeout
        while True:
            try:
                async with asyncio.timeout(wait):
                    answer = await exchanges.request(method, url, path, params, data, headers)
            except NotHttp as err:
                raise NotABrokerError.at(url, "its answer is not valid HTTP") from err
            except MAYBE_SENT as err:
                raise _Failed(url, err) from err
            self.brokers.answered(url)
            if answer.status == 307:
                location = answer.headers.get(LOCATION_HEADER, url)
                following = self.brokers.redirected(url, location, hops)
                if following is not None:
                    if not following.startswith("http://"):
                        return await self._send_read(method, following, path, params, data,
                                                     headers, timeout)
                    url, hops = following, hops + 1
                    continue
            return url, Response(answer.status, answer.headers, answer.body, url)

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
            except MAYBE_SENT as err:
                raise _Failed(url, err) from err
            self.brokers.answered(url)
            following = None
            if resp.status == 307:
                location = resp.headers.get(LOCATION_HEADER, url)
                following = self.brokers.redirected(url, location, hops)
            if following is None:
                return url, resp
            resp.release()
            url, hops = following, hops + 1


def _ssl_context(ca: Path) -> ssl.SSLContext:
    """A TLS context that trusts the CA in ``ca`` (a PEM file)."""
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as err:
        raise ClientConfigError(f"cannot use CA file {ca}: {err}") from err


class _Failed(Exception):
    """A connection to ``url`` failed with ``err``; never leaves this module."""

    def __init__(self, url: str, err: BaseException) -> None:
        super().__init__(url, err)
        self.url = url
        self.err = err

    @property
    def sent(self) -> bool:
        """Whether the request may have reached the broker."""
        return not isinstance(self.err, NOT_SENT)


async def _read(url: str, resp: aiohttp.ClientResponse) -> bytes:
    """The whole body of an answer; :class:`_Failed` if it breaks off."""
    try:
        return await resp.read()
    except MAYBE_SENT as err:
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
        except MAYBE_SENT as err:
            raise ConnectionFailedError(unreachable({self.url: err}),
                                        refused=definitive(err)) from err
        if not data:
            raise StopAsyncIteration
        return data
