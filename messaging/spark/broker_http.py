"""BrokerHTTP: the synchronous HTTP client of the Spark data source (driver and executors).

Spark's Python workers have no event loop, so this is :mod:`http.client`, not the async
:class:`~messaging.client.Client`; which broker to try, 307s and retries follow the same rules,
:mod:`messaging.failover`'s. Error answers become the :mod:`messaging.errors` classes.
"""

from __future__ import annotations

import functools
import http.client
import json
import ssl
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

from messaging.errors import (
    ConnectionFailedError,
    MessagingError,
    NoLeaderError,
    error_for_status,
)
from messaging.failover import Brokers, GroupMap, Retry, RetryPolicy, refused, topic_of
from messaging.frames import FRAMES_CONTENT_TYPE
from messaging.headers import PRODUCER_EPOCH_HEADER, PRODUCER_ID_HEADER, PRODUCER_SEQ_HEADER
from messaging.json_ids import parse_u64


@functools.lru_cache(maxsize=8)
def _tls_context(ca: str) -> ssl.SSLContext:
    """A context trusting ``ca`` (kept per process: Spark pickles BrokerHTTP, not this)."""
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as err:
        raise MessagingError(f"option ca: cannot use {ca}: {err}") from err


class BrokerHTTP:
    """Requests to a broker or cluster: failover across URLs, 307 following, retries.

    ``retry_timeout`` is the time budget for retrying failed rounds over the URLs (0, the
    default: one round, then fail; Spark retries the task).
    """

    def __init__(self, urls: Sequence[str], timeout: float = 60.0,
                 retry_timeout: float = 0.0, *, token: str | None = None,
                 ca: str | None = None) -> None:
        if not urls:
            raise MessagingError("no broker URL given (option url or urls)")
        self.brokers = Brokers(urls)
        self.timeout = timeout
        self.policy = RetryPolicy(budget=retry_timeout)
        self.token = token
        self.ca = ca
        self._groups_asked = False
        if ca:
            _tls_context(ca)  # a bad CA file fails here, on the driver

    def _connect(self, base: str) -> http.client.HTTPConnection:
        parts = urlsplit(base)
        assert parts.hostname is not None  # Brokers only holds scheme://host:port
        if parts.scheme == "https":
            return http.client.HTTPSConnection(
                parts.hostname, parts.port or 443, timeout=self.timeout,
                context=_tls_context(self.ca) if self.ca else None)
        return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=self.timeout)

    def open(self, method: str, path: str, params: dict[str, Any] | None = None,
             body: bytes | None = None, headers: dict[str, str] | None = None,
             ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request; returns the open connection and response (caller closes)."""
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
        target = path + ("?" + query if query else "")
        retry = Retry(self.policy, started=time.monotonic())
        errors: dict[str, str] = {}
        last_error: MessagingError | None = None
        topic = topic_of(params, path)
        if topic is not None:
            self._learn_groups()
        while True:
            refused_everywhere = True
            for base in self.brokers.order(write=method != "GET", topic=topic):
                url: str | None = base
                hops = 0
                while url is not None:
                    conn = self._connect(url)
                    sent = dict(headers or {})
                    if self.token:
                        sent["Authorization"] = f"Bearer {self.token}"
                    try:
                        conn.request(method, target, body=body, headers=sent)
                        response = conn.getresponse()
                    except OSError as err:
                        conn.close()
                        errors[url] = str(err)
                        refused_everywhere = refused_everywhere and refused(err)
                        self.brokers.failed(base)
                        break
                    self.brokers.answered(url)
                    refused_everywhere = False
                    if response.status < 300:
                        return conn, response
                    following = None
                    if response.status == 307:
                        following = self.brokers.redirected(
                            url, response.getheader("Location", url), hops)
                    response.read()
                    conn.close()
                    if following is not None:
                        url, hops = following, hops + 1
                        continue
                    error = error_for_status(response.status, dict(response.getheaders()), url)
                    if response.status != 503 or retry.exhausted(time.monotonic()):
                        raise error
                    last_error = error
                    break
            if not retry.failed(time.monotonic(), refused_everywhere=refused_everywhere,
                                reached=self.brokers.reached):
                if last_error is not None:
                    raise last_error
                reasons = "; ".join(f"{url}: {why}" for url, why in errors.items())
                raise ConnectionFailedError(f"no broker reachable: {reasons}",
                                            refused=refused_everywhere)
            time.sleep(retry.delay(time.monotonic()))
            if isinstance(last_error, NoLeaderError):
                self.brokers.forget_leader()

    def _learn_groups(self) -> None:
        """Ask once for the map of topic groups, so that a topic's requests go to its
        holders first (a cluster with one group, or a single node, answers 404)."""
        if self._groups_asked:
            return
        self._groups_asked = True
        for base in self.brokers.order(write=False):
            conn = self._connect(base)
            try:
                conn.request("GET", "/messaging/groups", headers=(
                    {"Authorization": f"Bearer {self.token}"} if self.token else {}))
                response = conn.getresponse()
                body = response.read()
            except OSError:
                continue
            finally:
                conn.close()
            if response.status == 404:
                return
            if response.status == 200:
                try:
                    self.brokers.groups = GroupMap.parse(json.loads(body))
                except ValueError:
                    continue
                return

    def json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET a JSON answer."""
        conn, response = self.open("GET", path, params)
        try:
            return json.loads(response.read())
        finally:
            conn.close()

    def topic(self, topic: int, after: int | None = None, count: int | None = None,
              at: int | None = None) -> dict[str, Any] | None:
        """A topic's description, or None if it has no messages yet; with ``after`` and
        ``count``, or ``at`` (ms since the epoch), its ``"index"`` answers them."""
        try:
            result: dict[str, Any] = self.json(f"/messaging/topics/{topic}",
                                               {"after": after, "count": count, "at": at})
        except MessagingError as err:
            if err.status == 404:
                return None
            raise
        return result

    def index_at(self, topic: int, time_ms: int) -> int | None:
        """The index of ``topic``'s first message appended at or after ``time_ms`` (ms since
        the epoch); None when it has none (yet)."""
        info = self.topic(topic, at=time_ms)
        index = info.get("index") if info else None
        return None if index is None else parse_u64(index, f"index of topic {topic}")

    def times(self, topic: int, start: int, end: int) -> tuple[int, list[tuple[int, int | None]]]:
        """When ``topic``'s messages ``start`` <= index < ``end`` were appended: the last
        index the answer covers and ``(first index, ms or None)`` runs, each holding until the
        next one starts (None: written before the broker kept times)."""
        answer = self.json("/messaging/times", {"topicID": topic, "index": start, "end": end})
        runs = [(parse_u64(first, f"index of topic {topic}"),
                 None if time_ms is None else int(time_ms))
                for first, time_ms in answer.get("runs") or []]
        return int(answer["through"]), runs  # a number, or a decimal string from 2^53

    def broker_index(self, topic: int) -> int:
        """The last index assigned in ``topic``'s index space (any topic of a single node or
        of one group; the topic's own group in a cluster of groups)."""
        return int(self.json("/messaging/diagnostics", {"topicID": topic})["index"])

    def publish_frames(self, body: bytes, producer: tuple[str, int, int] | None = None,
                       topic: int | None = None) -> None:
        """POST a body of frames (all or nothing; all of ``topic`` when given); with
        ``(id, epoch, seq)`` it is stored once however often it is sent."""
        headers = {"Content-Type": FRAMES_CONTENT_TYPE}
        if producer is not None:
            headers.update({PRODUCER_ID_HEADER: producer[0],
                            PRODUCER_EPOCH_HEADER: str(producer[1]),
                            PRODUCER_SEQ_HEADER: str(producer[2])})
        conn, response = self.open("POST", "/messaging/messages", {"topicID": topic},
                                   body=body, headers=headers)
        response.read()
        conn.close()
