"""One broker process: open the data directory, choose the log, serve HTTP, run retention."""

from __future__ import annotations

import asyncio
import logging
import socket

from aiohttp import web

from messaging.broker import Broker
from messaging.config import BrokerConfig
from messaging.errors import DataDirectoryError
from messaging.http import (
    ConnectionLimits,
    connection_factory,
    make_app,
)
from messaging.local_log import LocalLog
from messaging.log import Log
from messaging.streams import StreamHandlers
from messaging.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Connections the kernel queues before the broker accepts them (a burst of clients).
LISTEN_BACKLOG = 1024


class BrokerServer:
    """A running broker: :meth:`start`, then :meth:`stop` (or ``async with``)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker: Broker | None = None
        self.log: Log | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.connections: ConnectionLimits | None = None
        self._retention: asyncio.Task[None] | None = None
        self.port = config.port

    @property
    def url(self) -> str:
        """The URL this broker advertises."""
        return self.config.advertise or f"http://{self.config.host}:{self.port}"

    async def start(self) -> None:
        """Bind, recover the data directory, start the log and serve."""
        config = self.config
        loop = asyncio.get_running_loop()
        sock = _bind(config.host, config.port)
        self.port = sock.getsockname()[1]
        try:
            self.broker = await loop.run_in_executor(None, lambda: Broker.open(
                config.data, max_segment_size=config.max_segment_size,
                max_topic_size=config.max_topic_size,
                subscriber_timeout=config.subscriber_timeout))
            self.log = await self._start_log(self.broker)
        except BaseException:
            sock.close()
            if self.broker is not None:
                await loop.run_in_executor(None, self.broker.close)
            raise
        app = make_app(self.broker, self.log, max_message_size=config.max_message_size,
                       max_request_size=config.max_request_size)
        StreamHandlers(self.broker, self.log, config.max_message_size,
                       long_poll_timeout=config.long_poll_timeout).install(app)
        if config.etcd_settings() is not None:
            from messaging.etcd_log import EtcdLog
            from messaging.snapshot_http import add_snapshot_route

            assert isinstance(self.log, EtcdLog)
            add_snapshot_route(app, self.log)  # peers catch up from this node's data
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=5.0)
        await self._runner.setup()
        assert self._runner.server is not None
        # The runner's server is a protocol factory; serving it through our own factory
        # puts BrokerConnection (header timeout, connection cap) on every connection.
        self.connections = ConnectionLimits(config.header_timeout, config.max_connections)
        self._listener = await loop.create_server(
            connection_factory(self._runner.server, self.connections), sock=sock,
            backlog=LISTEN_BACKLOG)
        self._retention = asyncio.create_task(self._retention_loop(), name="messaging-retention")
        log.info("broker listening on %s (data %s, fsync %s)", self.url, config.data,
                 config.fsync)

    async def _start_log(self, broker: Broker) -> Log:
        config = self.config
        etcd = config.etcd_settings()
        if etcd is not None:
            from messaging.etcd_log import EtcdLog  # grpc: only in cluster mode

            cluster = EtcdLog(broker, self.url, etcd, config.fsync)
            await cluster.start()
            return cluster
        local = LocalLog(broker, self.url, config.fsync)
        await local.start()
        return local

    async def _retention_loop(self) -> None:
        assert self.broker is not None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.truncation_interval)
            try:
                await loop.run_in_executor(None, self.broker.enforce_retention)
            except Exception:
                log.exception("retention failed")

    async def stop(self) -> None:
        """Stop accepting, finish in-flight publishes, fsync, end streams, close."""
        loop = asyncio.get_running_loop()
        retention, self._retention = self._retention, None
        listener, self._listener = self._listener, None
        log_, self.log = self.log, None
        broker, self.broker = self.broker, None
        runner, self._runner = self._runner, None
        await cancel_and_wait(retention)
        if listener is not None:
            listener.close()
        if log_ is not None:
            await log_.close()
        if broker is not None:
            # Waits for a retention run still going on a thread.
            await loop.run_in_executor(None, broker.close)
        if runner is not None:
            await runner.cleanup()
        if self.connections is not None:
            self.connections.close()
        if broker is not None:
            log.info("broker stopped")

    async def __aenter__(self) -> BrokerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as err:
        sock.close()
        raise DataDirectoryError(f"cannot listen on {host}:{port}: "
                                 f"{err.strerror or err}") from err
    sock.setblocking(False)
    return sock
