"""One broker process: open the data directory, choose the log, serve HTTP, run retention."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from messaging.aio import cancel_and_wait
from messaging.config import BrokerConfig, EtcdSettings
from messaging.errors import BindError, ConfigError
from messaging.http.access_log import ACCESS_LOGGER, AccessLogger, DebugAccessLogger
from messaging.http.app import make_app
from messaging.http.auth import Tokens
from messaging.http.connections import ConnectionLimits, connection_factory
from messaging.http.snapshot import SnapshotSource
from messaging.http.token_watch import TokensWatch
from messaging.log.base import Log
from messaging.offload.service import ObjectStorage
from messaging.offload.uploader import Offloader
from messaging.stack.assemble import Broker, Stack, etcd_log, local_log, open_stack

if TYPE_CHECKING:
    from messaging.cluster.node import GroupNode
    from messaging.kafka.server import KafkaListener

log = logging.getLogger(__name__)

#: The logger of the one startup line (``messaging broker listening on URL (...)``): the CLI
#: writes it on standard output at every log level; tools wait for it.
READY_LOGGER = "messaging.ready"

#: Connections the kernel queues before the broker accepts them (a burst of clients).
LISTEN_BACKLOG = 1024


class BrokerServer:
    """A running broker: :meth:`start`, then :meth:`stop` (or ``async with``)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        #: The one broker stack of a single node (or of a one-group cluster node).
        self.stack: Stack[Log] | None = None
        #: With --groups above 1: the groups this node holds (``broker`` and ``log`` stay None).
        self.node: GroupNode | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.connections: ConnectionLimits | None = None
        self._retention: asyncio.Task[None] | None = None
        self.port = config.port
        self.tokens: Tokens | None = None
        self._tokens_watch: TokensWatch | None = None
        #: With --kafka-bind: the Kafka-protocol listener.
        self.kafka: KafkaListener | None = None

    @property
    def broker(self) -> Broker | None:
        """The broker of a single node (None with --groups above 1, or when stopped)."""
        return self.stack.broker if self.stack is not None else None

    @property
    def log(self) -> Log | None:
        """The command log of a single node's broker."""
        return self.stack.log if self.stack is not None else None

    @property
    def offloader(self) -> Offloader | None:
        """With --object-store: the uploader of a single node's broker."""
        return self.stack.offloader if self.stack is not None else None

    @property
    def url(self) -> str:
        """The URL this broker advertises."""
        scheme = "https" if self.config.tls_cert is not None else "http"
        return self.config.advertise or f"{scheme}://{self.config.host}:{self.port}"

    async def start(self) -> None:
        """Bind, recover the data directory, start the log and serve."""
        config = self.config
        loop = asyncio.get_running_loop()
        check_security(config)
        tls = await loop.run_in_executor(None, tls_context, config)
        if config.tokens is not None:
            self.tokens = await loop.run_in_executor(None, Tokens, config.tokens)
        storage = await ObjectStorage.open(config)
        sock = _bind(config.host, config.port)
        self.port = sock.getsockname()[1]
        etcd = config.etcd_settings()
        if etcd is not None and config.groups > 1:
            await self._start_groups(sock, tls, etcd, storage)
            return
        try:
            if etcd is not None:
                from messaging.cluster.node import check_single_group
                from messaging.log.etcd.intake import Intake

                await check_single_group(etcd)
                intake = Intake.for_config(config,
                                           storage.store if storage is not None else None)
            start_log = (etcd_log(config, self.url, etcd, intake=intake) if etcd is not None
                         else local_log(config, self.url))
            self.stack = await open_stack(config, self.url, start_log, storage=storage)
        except BaseException:
            sock.close()
            raise
        snapshots: SnapshotSource | None = None
        if etcd is not None:
            from messaging.log.etcd.log import EtcdLog

            assert isinstance(self.stack.log, EtcdLog)
            snapshots = self.stack.log  # peers catch up from this node's data
        app = make_app(self.stack, config, tokens=self.tokens, snapshots=snapshots)
        if config.kafka_bind is not None:
            await self._start_kafka(tls)
        await self._serve(app, sock, tls, self.stack.retention.run_now)

    async def _start_kafka(self, tls: ssl.SSLContext | None, node: GroupNode | None = None,
                           ) -> None:
        """--kafka-bind: the Kafka-protocol listener on the same broker and log, or on the
        groups this node holds (``node``: a cluster of topic groups)."""
        config = self.config
        assert config.kafka_bind is not None
        try:
            from messaging.kafka.server import KafkaListener
        except ImportError as err:
            raise ConfigError(f"--kafka-bind needs the kafka extra ({err.name} is missing): "
                              "pip install 'messaging[kafka]'") from err
        host, port = config.kafka_bind
        tokens = self.tokens
        log_ = self.stack.log if self.stack is not None else None
        peers = node if node is not None else log_
        listener = KafkaListener(
            self.stack.broker if self.stack is not None else None, log_, host, port,
            max_message_size=config.max_message_size,
            auto_create=config.kafka_auto_create == "on", tls=tls,
            advertise=config.kafka_advertise,
            # SASL/PLAIN: the password is a broker token, looked up as a bearer token is.
            tokens=None if tokens is None else (
                lambda password: tokens.principal(f"Bearer {password}")),
            peers=getattr(peers, "kafka_addresses", None),
            # One node's log applies commands in the order it gets them; a cluster's puts
            # to etcd may commit in another order.
            pipelined=config.etcd_settings() is None,
            holdings=node, forward_tls=_forward_tls(config) if tls is not None else None)
        await listener.start()
        announce = getattr(peers, "announce_kafka", None)
        if announce is not None:  # a cluster node: the others learn where its listener is
            announce(listener.nodes.address)
        self.kafka = listener

    async def _start_groups(self, sock: socket.socket, tls: ssl.SSLContext | None,
                            etcd: EtcdSettings, storage: ObjectStorage | None) -> None:
        """A node of a cluster of topic groups: the groups it holds, then serve."""
        from messaging.cluster.node import GroupNode  # grpc: only in cluster mode
        from messaging.http.groups import make_group_app

        node = GroupNode(self.config, self.url, etcd, storage)
        try:
            await node.start()
        except BaseException:
            sock.close()
            raise
        self.node = node
        app = make_group_app(node, self.config, tokens=self.tokens)
        if self.config.kafka_bind is not None:
            try:
                await self._start_kafka(tls, node)
            except BaseException:
                sock.close()
                raise
        await self._serve(app, sock, tls, node.enforce_retention)

    async def _serve(self, app: web.Application, sock: socket.socket,
                     tls: ssl.SSLContext | None, retention: Callable[[], Awaitable[int]]) -> None:
        config = self.config
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=5.0)
        await self._runner.setup()
        assert self._runner.server is not None
        # The runner's server is a protocol factory; serving it through our own factory
        # puts BrokerConnection (header timeout, connection cap) on every connection.
        self.connections = ConnectionLimits(config.header_timeout, config.max_connections)
        # --access-log: a line per request at INFO; without it the same line at DEBUG (so
        # --log-level debug shows every request), skipped at no cost above DEBUG.
        access = AccessLogger if config.access_log else DebugAccessLogger
        self._listener = await asyncio.get_running_loop().create_server(
            connection_factory(self._runner.server, self.connections,
                               logging.getLogger(ACCESS_LOGGER), access),
            sock=sock,
            backlog=LISTEN_BACKLOG, ssl=tls)
        self._retention = asyncio.create_task(self._retention_loop(retention),
                                              name="messaging-retention")
        if self.tokens is not None:
            self._tokens_watch = TokensWatch(self.tokens)
            self._tokens_watch.start()
        logging.getLogger(READY_LOGGER).info("%s", self.startup_line())

    def startup_line(self) -> str:
        """The one line a started broker logs: its URL first (tools read the word after
        ``listening on``), then where its data is and how it runs."""
        config = self.config
        parts = [f"data {config.data}", f"fsync {config.fsync}"]
        etcd = config.etcd_settings()
        if etcd is not None:
            parts.append(f"cluster {etcd.cluster} on etcd {','.join(etcd.endpoints)}")
            if config.groups > 1:
                parts.append(f"{config.groups} groups, {config.replicas} replicas")
        if config.tokens is not None:
            parts.append(f"tokens {config.tokens}")
        if config.tls_cert is not None:
            parts.append("tls")
        if config.object_store is not None:
            parts.append(f"object store {config.object_store}")
        if self.kafka is not None:
            parts.append(f"kafka {self.kafka.address}")
        return f"messaging broker listening on {self.url} ({', '.join(parts)})"

    async def _retention_loop(self, retention: Callable[[], Awaitable[int]]) -> None:
        while True:
            await asyncio.sleep(self.config.truncation_interval)
            try:
                await retention()
            except Exception:
                log.exception("retention failed")

    async def stop(self) -> None:
        """Stop accepting, finish in-flight publishes, fsync, end streams, close."""
        retention, self._retention = self._retention, None
        tokens_watch, self._tokens_watch = self._tokens_watch, None
        listener, self._listener = self._listener, None
        stack, self.stack = self.stack, None
        node, self.node = self.node, None
        runner, self._runner = self._runner, None
        kafka, self.kafka = self.kafka, None
        await cancel_and_wait(retention)
        if kafka is not None:
            await kafka.stop()
        if tokens_watch is not None:
            await tokens_watch.close()
        if listener is not None:
            listener.close()
        if stack is not None:
            await stack.close()  # the broker waits for a retention run still going
        if node is not None:
            await node.close()
        if runner is not None:
            await runner.cleanup()
        if self.connections is not None:
            self.connections.close()
        if stack is not None or node is not None:
            log.info("broker stopped")

    async def __aenter__(self) -> BrokerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_security(config: BrokerConfig) -> None:
    """Refuse to serve a non-loopback address to everyone by accident."""
    if config.tokens is None and not config.insecure and not is_loopback(config.host):
        raise ConfigError(
            f"refusing to serve {config.host}:{config.port} without authentication: give "
            "--tokens FILE (see messaging token create), or --insecure to let anyone who "
            "reaches the port read, write and delete")
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if config.tls_client_ca is not None and config.tls_cert is None:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    if config.kafka_bind is not None and config.tokens is None and not config.insecure and (
            not is_loopback(config.kafka_bind[0])):
        host, port = config.kafka_bind
        raise ConfigError(
            f"refusing to serve Kafka clients on {host}:{port} without authentication: give "
            "--tokens FILE (clients then use SASL/PLAIN with a token as the password), or "
            "--insecure")
    if config.kafka_advertise is not None and config.kafka_bind is None:
        raise ConfigError("--kafka-advertise needs --kafka-bind")
    if config.kafka_bind is not None and config.kafka_advertise is None and (
            config.kafka_bind[0] in ("0.0.0.0", "::", "")):
        raise ConfigError(f"--kafka-bind {config.kafka_bind[0]} listens on every address: give "
                          "--kafka-advertise HOST:PORT, the address Kafka clients connect to")


def tls_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The server's TLS context (None without --tls-cert); reads the files (blocking)."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
        if config.tls_client_ca is not None:
            context.load_verify_locations(cafile=config.tls_client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"cannot use the TLS files: {err}") from err
    return context


def _forward_tls(config: BrokerConfig) -> ssl.SSLContext:
    """The client side of TLS to another node's Kafka listener: its certificate checked
    against --peer-ca (or the system's authorities), and with --tls-client-ca, where every
    listener asks for a client certificate, this node's own certificate shown."""
    context = ssl.create_default_context(
        cafile=str(config.peer_ca) if config.peer_ca is not None else None)
    if config.tls_client_ca is not None and config.tls_cert is not None and (
            config.tls_key is not None):
        context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as err:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {err.strerror or err}") from err
    sock.setblocking(False)
    return sock
