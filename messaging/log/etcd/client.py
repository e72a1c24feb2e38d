"""The few etcd v3 calls the cluster log makes, over aetcd's gRPC stubs, with failure semantics.

aetcd's ``Client`` talks to one endpoint, without TLS, and hides why a call failed; the cluster
log needs several endpoints, TLS, per-call deadlines, the ``hasleader`` guard (a member that
has lost its leader refuses at once instead of holding a request for seconds) and, above
all, to know whether a failed put may have been committed. So this module uses aetcd's
generated stubs (:mod:`aetcd.rpc`) on ``grpc.aio`` channels of its own and sorts every
failure into one of: never sent (safe to resend elsewhere), outcome unknown, quota alarm,
too large.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
from aetcd import rpc

from messaging.config import EtcdSettings
from messaging.errors import (
    ClusterNoSpaceError,
    ClusterUnavailableError,
    CommitUnknownError,
    MessageTooLargeError,
    MessagingError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A put that has not answered within this many seconds has an unknown outcome. etcd holds
#: a put whose leader died until its own request timeout (about 7 s); a shorter deadline
#: frees the put's slot for the puts the new leader will take (elections take 1-3 s).
PUT_TIMEOUT = 2.0
#: Deadline of the reads that tell whether etcd has quorum (and of other small calls).
QUICK_TIMEOUT = 1.0
_REQUIRE_LEADER = ("hasleader", "true")
#: grpc shuts its asyncio runtime down when the last channel object is freed, joining its
#: poller thread: a blocking call, on the event loop. Closed channels are kept here so that
#: this happens at process exit instead (a few objects per broker process).
_RETIRED: list[grpc.aio.Channel] = []
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    # With fragment=True a watch response stays near etcd's request limit; keep headroom.
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    # Notice a dead connection to a frozen member while a call (the watch, a put) is on it.
    # etcd's server takes a ping at most every --grpc-keepalive-min-time (5 s by default) and
    # none at all on a connection without a call (its enforcement policy has
    # PermitWithoutStream false): pings on an idle channel earn strikes, and after three it
    # answers GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and drops the connection. So: every
    # 10 s, and only while a call is open.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # A restarted member is reachable again within a second, not after grpc's 2-minute cap.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


def load_credentials(settings: EtcdSettings) -> grpc.ChannelCredentials | None:
    """TLS credentials from the settings' files (blocking: call it on a thread)."""
    if not any(url.startswith("https:") for url in settings.endpoints):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=settings.ca.read_bytes() if settings.ca else None,
        private_key=settings.key.read_bytes() if settings.key else None,
        certificate_chain=settings.cert.read_bytes() if settings.cert else None)


class CompactedError(Exception):
    """The revision a watch wanted to start from was compacted away."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"etcd history was compacted through revision {compact_revision}")
        self.compact_revision = compact_revision


#: What etcd says when it will not let this node in, and what the operator should do.
_REFUSALS = (
    ("user name is empty", "authentication",
     "start with --etcd-user USER (its password in $MESSAGING_ETCD_PASSWORD)"),
    ("authentication failed, invalid user id or password", "authentication",
     "check --etcd-user and the password in $MESSAGING_ETCD_PASSWORD"),
    ("authentication is not enabled", "authentication",
     "this etcd has no authentication: start without --etcd-user"),
    ("permission denied", "access",
     "the etcd user (--etcd-user, or else the common name of the --etcd-cert certificate) "
     "needs a role that may read and write /messaging/"),
)


def refusal(err: BaseException) -> str | None:
    """The operator's message when ``err`` is etcd refusing this node's credentials (None
    when it is anything else): the one failure that waiting will not cure."""
    text = (err.details() or "") if isinstance(err, grpc.aio.AioRpcError) else str(err)
    lowered = text.lower()
    for words, what, advice in _REFUSALS:
        if f"etcdserver: {words}" in lowered:
            start = lowered.index(words)
            return f"etcd refused {what} ({text[start:start + len(words)]}): {advice}"
    return None


def describe(err: BaseException) -> str:
    """A one-line reason for logs and error messages."""
    refused = refusal(err)
    if refused is not None:
        return refused
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def never_sent(err: grpc.aio.AioRpcError) -> bool:
    """Whether a failed call certainly stored nothing, so resending it is safe: it did not
    reach etcd's log, or etcd refused the caller's credentials."""
    details = (err.details() or "").lower()
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        return ("failed to connect" in details or "connection refused" in details
                or "etcdserver: no leader" in details or "too many requests" in details)
    return err.code() == grpc.StatusCode.UNAUTHENTICATED or refusal(err) is not None


def unavailable(problem: str, failures: list[tuple[str, BaseException]],
                ) -> ClusterUnavailableError:
    """etcd took nothing: ``problem`` and why at each endpoint; or, when etcd refused this
    node's credentials, that and what to do first: no retry gets past it."""
    refused = {endpoint: r for endpoint, err in failures if (r := refusal(err)) is not None}
    others = "; ".join(f"{endpoint}: {describe(err)}" for endpoint, err in failures
                       if endpoint not in refused)
    if not refused:
        return ClusterUnavailableError(f"{problem}: {others}")
    first = next(iter(refused.values()))
    return ClusterUnavailableError(
        f"{first} (etcd at {', '.join(refused)}); nothing can be written until etcd admits "
        "this node"
        + (f"; {others}" if others else ""))


def put_error(err: grpc.aio.AioRpcError, endpoint: str) -> MessagingError:
    """The error a publisher gets for a put that failed after it may have been sent."""
    details = err.details() or ""
    if "database space exceeded" in details:
        return ClusterNoSpaceError(
            f"etcd alarm NOSPACE: etcd's backend quota is full and it refuses every write "
            f"({details}); compact and defragment etcd, then run `etcdctl alarm disarm`")
    if "request is too large" in details or (
            err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details):
        return MessageTooLargeError(f"etcd refused the put as too large: {details}")
    return CommitUnknownError(
        f"the write was sent to etcd at {endpoint} but its outcome is unknown "
        f"({describe(err)}); it may still be committed")


class EtcdClient:
    """Channels to every endpoint; calls go to the current one and move on when it fails."""

    def __init__(self, settings: EtcdSettings,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.settings = settings
        self.endpoints = list(settings.endpoints)
        self.current = 0
        self._credentials = credentials
        self._channels: dict[int, grpc.aio.Channel] = {}
        self._token: str | None = None
        self._auth_lock = asyncio.Lock()
        #: Why etcd refused this node's credentials on the last call (None: it did not).
        self.refused: str | None = None

    @property
    def endpoint(self) -> str:
        """The URL calls go to first."""
        return self.endpoints[self.current]

    def channel(self, i: int) -> grpc.aio.Channel:
        """The (lazily connecting) channel to endpoint ``i``."""
        channel = self._channels.get(i)
        if channel is None:
            parts = urlsplit(self.endpoints[i])
            target = f"{parts.hostname}:{parts.port}"
            if parts.scheme == "https":
                credentials = self._credentials or grpc.ssl_channel_credentials()
                channel = grpc.aio.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)
            else:
                channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
            self._channels[i] = channel
        return channel

    def failed(self, i: int) -> None:
        """Endpoint ``i`` failed: if it is the current one, move to the next."""
        if i == self.current and len(self.endpoints) > 1:
            self.current = (i + 1) % len(self.endpoints)
            log.info("etcd endpoint %s failed; using %s", self.endpoints[i], self.endpoint)

    async def metadata(self, i: int, *, require_leader: bool = True) -> tuple[tuple[str, str], ...]:
        """Call metadata: the leader guard and, with auth, the token."""
        items: list[tuple[str, str]] = [_REQUIRE_LEADER] if require_leader else []
        if self.settings.user is not None:
            if self._token is None:
                await self._authenticate(i)
            assert self._token is not None
            items.append(("token", self._token))
        return tuple(items)

    def forget_token(self) -> None:
        """Ask for a new auth token on the next call (etcd refused the one it had)."""
        self._token = None

    async def _authenticate(self, i: int) -> None:
        async with self._auth_lock:
            if self._token is not None:
                return
            stub = rpc.AuthStub(self.channel(i))
            response = await stub.Authenticate(
                rpc.AuthenticateRequest(name=self.settings.user, password=self.settings.password),
                timeout=QUICK_TIMEOUT * 3)
            self._token = str(response.token)

    async def call(self, make: Callable[[grpc.aio.Channel, tuple[tuple[str, str], ...]],
                                         Awaitable[T]], *, endpoint: int | None = None,
                   require_leader: bool = True) -> T:
        """Run one call on an endpoint (the current one by default), renewing an expired token.

        Raises :class:`grpc.aio.AioRpcError` as it comes.
        """
        i = self.current if endpoint is None else endpoint
        for attempt in (0, 1):
            try:
                result = await make(self.channel(i),
                                    await self.metadata(i, require_leader=require_leader))
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNAUTHENTICATED and attempt == 0 \
                        and self.settings.user is not None:
                    self._token = None  # expired: authenticate again, once
                    continue
                self._note_refusal(refusal(err))
                raise
            self._note_refusal(None)
            return result
        raise AssertionError("unreachable")

    def _note_refusal(self, refused: str | None) -> None:
        """Remember (and log, once) that etcd refuses this node's credentials, or no longer."""
        if refused != self.refused:
            if refused is not None:
                log.error("%s (etcd at %s)", refused, ", ".join(self.endpoints))
            elif self.refused is not None:
                log.info("etcd accepts this node's credentials again")
            self.refused = refused

    async def put(self, key: bytes, value: bytes, *, lease: int = 0,
                  timeout: float = PUT_TIMEOUT) -> int:
        """Put ``value``; returns the revision etcd committed it at.

        A put that certainly never left (connection refused, member without leader) is resent
        to the next endpoint; once every endpoint refused, :class:`ClusterUnavailableError`.
        A put that may have been sent and failed raises :class:`CommitUnknownError` (or the
        quota / size error etcd gave).
        """
        request = rpc.PutRequest(key=key, value=value, lease=lease)
        response = await self._write(
            lambda channel, md: rpc.KVStub(channel).Put(request, timeout=timeout, metadata=md))
        return int(response.header.revision)

    async def put_when(self, key: bytes, value: bytes, *, unchanged: bytes,
                       timeout: float = PUT_TIMEOUT) -> int | None:
        """:meth:`put` (the same failures), but only while the key ``unchanged`` exists as it
        was first written (version 1): returns the revision etcd committed the put at, or
        None when ``unchanged`` was changed or deleted, and nothing was written."""
        request = rpc.TxnRequest(
            compare=[rpc.Compare(key=unchanged, target=rpc.Compare.CompareTarget.VERSION,
                                 result=rpc.Compare.CompareResult.EQUAL, version=1)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))])
        response = await self._write(
            lambda channel, md: rpc.KVStub(channel).Txn(request, timeout=timeout, metadata=md))
        return int(response.header.revision) if response.succeeded else None

    async def _write(self, make: Callable[[grpc.aio.Channel, tuple[tuple[str, str], ...]],
                                          Awaitable[T]]) -> T:
        """One write request: resent to the next endpoint only when it certainly never
        left; see :meth:`put`."""
        failures: list[tuple[str, BaseException]] = []
        for _ in range(len(self.endpoints)):
            i = self.current
            try:
                return await self.call(make, endpoint=i)
            except grpc.aio.AioRpcError as err:
                if never_sent(err):
                    failures.append((self.endpoints[i], err))
                    self.failed(i)
                    continue
                if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self.failed(i)
                raise put_error(err, self.endpoints[i]) from err
        raise unavailable("etcd cannot take writes (no endpoint with a leader)", failures)

    async def get(self, key: bytes, *, keys_only: bool = False, prefix: bool = False,
                  timeout: float = QUICK_TIMEOUT, endpoint: int | None = None) -> Any:
        """A linearizable range read of ``key`` (or of every key under it with ``prefix``)."""
        request = rpc.RangeRequest(key=key, keys_only=keys_only)
        if prefix:
            request.range_end = prefix_end(key)
        return await self.call(
            lambda channel, md: rpc.KVStub(channel).Range(request, timeout=timeout, metadata=md),
            endpoint=endpoint)

    async def compacted_past(self, key: bytes, revision: int) -> bool:
        """Whether etcd's history is compacted past ``revision`` (a read of ``key`` as of
        then is refused): every node registered then had its log durable beyond it."""
        request = rpc.RangeRequest(key=key, revision=revision, keys_only=True)
        try:
            await self.call(lambda channel, md: rpc.KVStub(channel).Range(
                request, timeout=QUICK_TIMEOUT, metadata=md))
        except grpc.aio.AioRpcError as err:
            if "compacted" in (err.details() or ""):
                return True
            raise
        return False

    async def put_if_absent(self, key: bytes, value: bytes) -> bytes:
        """Store ``value`` at ``key`` unless the key exists; returns what the key holds."""
        request = rpc.TxnRequest(
            compare=[rpc.Compare(key=key, target=rpc.Compare.CompareTarget.CREATE,
                                 result=rpc.Compare.CompareResult.EQUAL, create_revision=0)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))])
        response = await self.call(
            lambda channel, md: rpc.KVStub(channel).Txn(request, timeout=PUT_TIMEOUT,
                                                         metadata=md))
        if response.succeeded:
            return value
        kvs = response.responses[0].response_range.kvs
        return bytes(kvs[0].value) if kvs else value

    async def check_quorum(self, key: bytes, timeout: float = QUICK_TIMEOUT) -> Any:
        """A quick linearizable read of ``key``: it succeeds only where etcd has quorum.

        Tries the current endpoint, then the others; the first that answers becomes current.
        Raises :class:`ClusterUnavailableError` when none does.
        """
        request = rpc.RangeRequest(key=key, keys_only=True)
        return await self._on_any_endpoint(
            lambda channel, md: rpc.KVStub(channel).Range(request, timeout=timeout,
                                                          metadata=md))

    async def check_quorum_of(self, ranges: list[tuple[bytes, bool]],
                              timeout: float = QUICK_TIMEOUT) -> list[Any]:
        """:meth:`check_quorum` of several keys in one request (a read-only transaction:
        linearizable, every key at one revision): for each ``(key, prefix)``, the range
        response (with the transaction's header) of ``key`` alone, keys only, or of every key
        under it with their values (``prefix``), in order."""
        requests = [rpc.RangeRequest(key=key, range_end=prefix_end(key) if prefix else b"",
                                     keys_only=not prefix) for key, prefix in ranges]
        if len(requests) == 1:
            alone = requests[0]
            return [await self._on_any_endpoint(
                lambda channel, md: rpc.KVStub(channel).Range(alone, timeout=timeout,
                                                              metadata=md))]
        request = rpc.TxnRequest(success=[rpc.RequestOp(request_range=r) for r in requests])
        response = await self._on_any_endpoint(
            lambda channel, md: rpc.KVStub(channel).Txn(request, timeout=timeout,
                                                        metadata=md))
        answers = []
        for op in response.responses:
            answers.append(op.response_range)
            answers[-1].header.CopyFrom(response.header)
        return answers

    async def _on_any_endpoint(self, make: Callable[[grpc.aio.Channel, tuple[tuple[str, str], ...]],
                                              Awaitable[T]]) -> T:
        """A read on the current endpoint, else on the next ones; the first that answers
        becomes current. Raises :class:`ClusterUnavailableError` when none does."""
        failures: list[tuple[str, BaseException]] = []
        for step in range(len(self.endpoints)):
            i = (self.current + step) % len(self.endpoints)
            try:
                response = await self.call(make, endpoint=i)
            except grpc.aio.AioRpcError as err:
                failures.append((self.endpoints[i], err))
                continue
            self.current = i
            return response
        raise unavailable("etcd has no quorum or cannot be reached, so no write can commit",
                          failures)

    async def delete(self, key: bytes) -> None:
        """Delete ``key`` (gone already is fine), on the first endpoint that answers; raises
        :class:`ClusterUnavailableError` when none does."""
        request = rpc.DeleteRangeRequest(key=key)
        await self._on_any_endpoint(lambda channel, md: rpc.KVStub(channel).DeleteRange(
            request, timeout=QUICK_TIMEOUT, metadata=md))

    async def compact(self, revision: int) -> None:
        """Compact etcd's history below ``revision`` (an already compacted one is fine)."""
        request = rpc.CompactionRequest(revision=revision, physical=False)
        try:
            await self.call(lambda channel, md: rpc.KVStub(channel).Compact(
                request, timeout=QUICK_TIMEOUT * 5, metadata=md))
        except grpc.aio.AioRpcError as err:
            if "compacted" not in (err.details() or ""):
                raise

    async def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its id."""
        request = rpc.LeaseGrantRequest(TTL=ttl, ID=0)
        response = await self.call(lambda channel, md: rpc.LeaseStub(channel).LeaseGrant(
            request, timeout=QUICK_TIMEOUT * 2, metadata=md))
        return int(response.ID)

    async def keep_alive(self, lease: int) -> int:
        """Refresh a lease once; returns its remaining TTL (0: it has expired)."""
        async def once(channel: grpc.aio.Channel, md: tuple[tuple[str, str], ...]) -> int:
            stream = rpc.LeaseStub(channel).LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=QUICK_TIMEOUT * 2,
                metadata=md)
            try:
                async for reply in stream:
                    return int(reply.TTL)
            finally:
                stream.cancel()
            return 0

        return await self.call(once)

    async def revoke_lease(self, lease: int) -> None:
        """Revoke a lease (its keys vanish at once)."""
        request = rpc.LeaseRevokeRequest(ID=lease)
        await self.call(lambda channel, md: rpc.LeaseStub(channel).LeaseRevoke(
            request, timeout=QUICK_TIMEOUT, metadata=md))

    async def watch(self, key: bytes, start_revision: int, endpoint: int,
                    ) -> grpc.aio.StreamStreamCall:
        """Open a watch stream of ``key`` from ``start_revision`` on one endpoint (a stream
        of its own; a node's logs share one: :mod:`messaging.log.etcd.watch_stream`)."""
        call = await self.watch_stream(endpoint)
        try:
            await call.write(self.watch_create(key, start_revision))
        except BaseException:
            call.cancel()
            raise
        return call

    async def watch_stream(self, endpoint: int) -> grpc.aio.StreamStreamCall:
        """A watch stream on one endpoint, with no watch yet (write :meth:`watch_create`
        requests on it). etcd cancels it if its member loses the leader (``hasleader``)."""
        md = await self.metadata(endpoint)
        # No request iterator: requests are written on the call, so cancelling the call
        # leaves no generator or consumer task of ours behind.
        return rpc.WatchStub(self.channel(endpoint)).Watch(metadata=md)

    @staticmethod
    def watch_create(key: bytes, start_revision: int, watch_id: int = 0) -> Any:
        """The request that watches ``key`` from ``start_revision`` as ``watch_id`` (0: etcd
        picks it). Responses are fragmented by etcd (each one stays near its request
        limit)."""
        return rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
            key=key, start_revision=start_revision, progress_notify=True, fragment=True,
            watch_id=watch_id))

    @staticmethod
    def watch_cancel(watch_id: int) -> Any:
        """The request that ends watch ``watch_id`` on its stream."""
        return rpc.WatchRequest(cancel_request=rpc.WatchCancelRequest(watch_id=watch_id))

    async def close(self) -> None:
        """Close every channel (cancelling calls still running on them)."""
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
        _RETIRED.extend(channels)


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range holding every key that starts with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"
