"""The failover policy of every client: which broker to try, where a 307 leads, how to retry.

Pure decisions, no I/O: callers (the async :class:`~messaging.client.client.Client` and
:class:`~messaging.client.conn.Conn`, the CLI through them, and the Spark source's synchronous
``BrokerHTTP``) report what happened and this module says what to do next.

- :func:`base_url` validates a broker URL and reduces it to ``scheme://host:port``.
- :class:`Brokers` holds the known URLs and orders them: the remembered leader first for
  writes, then the others starting past the last one that failed. A 307 is followed by
  resending the same path and query to the ``Location``'s broker, which becomes the leader;
  at most :data:`MAX_REDIRECTS` hops per request.
- :class:`GroupMap`: in a cluster of topic groups, the holders of each group; a request on a
  topic is sent to its holders first (any node forwards it, one hop more).
- :class:`RetryPolicy` / :class:`Retry`: exponential backoff within a total time budget.
  While no broker has ever answered, a refused connection on every URL for
  ``refused_rounds`` rounds in a row means nothing is listening: give up at once rather than
  wait out the budget. Once a broker answered, refusals are a restart and are retried.
"""

from __future__ import annotations

import errno
import math
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from messaging.errors import InvalidURLError
from messaging.placement import group_of_name, group_of_topic

#: Redirects followed for one request before its 307 is treated as an error.
MAX_REDIRECTS = 5
DEFAULT_RETRY_TIMEOUT = 15.0

_SCHEMES = ("http", "https")
_URL_SHAPE = "expected http://HOST:PORT or https://HOST:PORT"


def base_url(url: str) -> str:
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


def refused(err: BaseException) -> bool:
    """Whether a connection failure is definitive: refused, or a host name that does not exist.

    Only these count toward giving up fast; a timeout or a reset may pass.
    """
    if isinstance(err, socket.gaierror):
        return err.errno == socket.EAI_NONAME
    return isinstance(err, ConnectionRefusedError) or (
        isinstance(err, OSError) and err.errno == errno.ECONNREFUSED)


def unique(urls: Iterable[str]) -> list[str]:
    """``urls`` without repeats, in their first order."""
    return list(dict.fromkeys(urls))


#: How often a client asks for the map of topic groups again while it looks stale (an answer
#: came from a node that does not hold the topic, or a holder failed), and at the latest.
GROUPS_REFRESH = 2.0
GROUPS_MAX_AGE = 10.0


@dataclass
class GroupMap:
    """A cluster of topic groups as ``GET /messaging/groups`` describes it: each group's
    holders, best first. A client sends a topic's requests to its holders first; any node
    would forward them, at the cost of one more hop."""

    groups: int
    holders: dict[int, list[str]]

    @classmethod
    def parse(cls, answer: object) -> GroupMap | None:
        """The map in a ``/messaging/groups`` answer (None if it is not one)."""
        try:
            assert isinstance(answer, dict)
            rows = answer["groups"]
            holders = {int(row["group"]): [base_url(u) for u in row["holders"]] for row in rows}
        except (AssertionError, KeyError, TypeError, ValueError, InvalidURLError):
            return None
        return cls(len(holders), holders) if holders else None

    def holders_of(self, topic: int | str) -> list[str]:
        """The nodes that hold the group of ``topic`` (an id, or a stream's name), best
        first."""
        group = (group_of_name(topic, self.groups) if isinstance(topic, str)
                 else group_of_topic(topic, self.groups))
        return self.holders.get(group, [])


#: The path of one topic's description: the topic is its last part.
_TOPIC_PATH = "/messaging/topics/"


def topic_of(params: dict[str, Any] | None, path: str = "") -> int | str | None:
    """The topic a request names (``topicID``, or the path of one topic), if any and valid:
    what a client routes to the topic's holders by. A topic id is an int; other text is a
    stream's name (reads take one where they take an id)."""
    value = (params or {}).get("topicID")
    text = str(value) if value is not None else None
    if text is None and path.startswith(_TOPIC_PATH):
        text = path[len(_TOPIC_PATH):]
    if not text or not text.isprintable():
        return None
    return int(text) if text.isascii() and text.isdigit() else text


class Brokers:
    """The broker URLs a client knows, the order to try them in, and the remembered leader.

    Feed it what happened: :meth:`answered` when a broker answered (any HTTP status),
    :meth:`failed` when a connection to one failed, :meth:`redirected` for a 307.
    """

    def __init__(self, urls: Iterable[str] = ()) -> None:
        self.urls: list[str] = unique(base_url(u) for u in urls)
        #: The broker a 307 pointed at: tried first for writes until it fails.
        self.leader: str | None = None
        #: Whether any broker ever answered (refusals then mean a restart, not a wrong URL).
        self.reached = False
        #: The holders of each topic group (None: one group, or not known yet).
        self.groups: GroupMap | None = None
        self._next = 0

    def add(self, urls: Iterable[str]) -> None:
        """Learn more URLs (for example from a saved config), after the known ones."""
        self.urls = unique([*self.urls, *(base_url(u) for u in urls)])

    def replace(self, urls: Iterable[str], start: str | None = None) -> None:
        """Use exactly ``urls`` (the cluster's own list), starting from ``start`` (the node
        that gave the list: it answers) when it is one of them, else from the first."""
        self.urls = unique(base_url(u) for u in urls)
        self._next = self.urls.index(start) if start in self.urls else 0

    def order(self, write: bool, topic: int | str | None = None) -> list[str]:
        """Every URL once, in the order to try them; writes go to the leader first, and a
        request on ``topic`` goes to its group's holders first when the map is known."""
        if not self.urls:
            return [self.leader] if write and self.leader else []
        start = self._next % len(self.urls)
        ordered = self.urls[start:] + self.urls[:start]
        if write and self.leader:
            ordered = [self.leader, *[u for u in ordered if u != self.leader]]
        if topic is not None and self.groups is not None:
            ordered = unique([*self.groups.holders_of(topic), *ordered])
        return ordered

    def answered(self, url: str) -> None:
        """A broker at ``url`` answered."""
        self.reached = True

    def failed(self, url: str) -> None:
        """A connection to ``url`` failed: later requests start with the URL after it."""
        if url == self.leader:
            self.leader = None
        if url in self.urls:
            self._next = (self.urls.index(url) + 1) % len(self.urls)

    def forget_leader(self) -> None:
        """The remembered leader said it has none (503): ask any broker again."""
        self.leader = None

    def redirected(self, url: str, location: str, hops: int) -> str | None:
        """The broker to resend a request to after ``url`` answered 307 ``location``.

        The request keeps its own path and query; only its broker changes, and that broker
        is remembered as the leader. ``hops`` is how many redirects this request already
        followed; None once that reaches :data:`MAX_REDIRECTS` (the 307 is then an error).
        A ``Location`` that is no broker URL raises :class:`InvalidURLError`.
        """
        if hops >= MAX_REDIRECTS:
            return None
        leader = base_url(urljoin(url + "/", location))
        self.leader = leader
        if leader not in self.urls:
            self.urls.append(leader)
        return leader


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long and how often to retry (seconds)."""

    #: Total time an operation keeps failing before it gives up (0: one round, no retry).
    budget: float = DEFAULT_RETRY_TIMEOUT
    #: First wait between rounds, multiplied by ``factor`` after each, up to ``cap``.
    start: float = 0.05
    factor: float = 2.0
    cap: float = 1.0
    #: Rounds in a row where every URL refused, before a client that never reached a broker
    #: gives up.
    refused_rounds: int = 4
    #: Failed rounds in a row (without progress) after which to give up whatever the budget.
    max_failures: int = 1000


class Retry:
    """The retry state of one operation (a request, or a subscription's reads).

    Report each failed round with :meth:`failed` (it says whether to try again) and wait
    :meth:`delay` before the next. The budget is measured from ``started`` if given (a
    request: from when it began), else from the first failure after the last
    :meth:`succeeded` (a subscription: each outage gets the whole budget).
    """

    def __init__(self, policy: RetryPolicy, started: float | None = None) -> None:
        self.policy = policy
        self._since = started
        self._backoff = policy.start
        self._failures = 0
        self._refused_rounds = 0

    def succeeded(self) -> None:
        """A broker answered as hoped: the current outage, if any, is over."""
        self._since = None

    def progressed(self) -> None:
        """Work got done (a stream delivered messages): retry at once, count afresh."""
        self._backoff = self.policy.start
        self._failures = 0

    def exhausted(self, now: float) -> bool:
        """Whether the time budget is spent."""
        return self._since is not None and now - self._since >= self.policy.budget

    def failed(self, now: float, *, refused_everywhere: bool, reached: bool) -> bool:
        """Record a failed round; whether to try again.

        ``refused_everywhere``: every URL refused the connection (or its host name does not
        exist). ``reached``: some broker ever answered this client.
        """
        if self._since is None:
            self._since = now
        self._failures += 1
        self._refused_rounds = self._refused_rounds + 1 if refused_everywhere else 0
        if self.exhausted(now) or self._failures > self.policy.max_failures:
            return False
        return reached or self._refused_rounds < self.policy.refused_rounds

    def delay(self, now: float, jitter: float = 1.0) -> float:
        """Seconds to wait before the next round (never past the budget); backs off."""
        remaining = (self._since + self.policy.budget - now if self._since is not None
                     else math.inf)
        wait = min(self._backoff * jitter, max(remaining, 0.0))
        self._backoff = min(self._backoff * self.policy.factor, self.policy.cap)
        return wait
