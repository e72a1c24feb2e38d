"""The Kafka-protocol listener: one asyncio server beside HTTP, on the same broker and log.

Each connection reads size-prefixed requests and answers them one at a time, in order, as a
Kafka broker does (a client pipelines; the broker serves a connection's requests in turn). A
request that does not parse, is too big, or names an API or version this listener does not
offer ends its connection, with a line in the log saying why; a client reconnects and
negotiates again. Bad input inside a valid request (a corrupt batch, an unknown topic, a bad
config) is an error code in the answer, never a closed connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from messaging.broker.view import BrokerView
from messaging.errors import BindError
from messaging.kafka import protocol as p
from messaging.kafka.admin import Admin
from messaging.kafka.fetch import Fetching
from messaging.kafka.groups import Coordinator
from messaging.kafka.offsets import Offsets
from messaging.kafka.produce import Producing
from messaging.kafka.topics import KafkaTopics
from messaging.log.base import Log

log = logging.getLogger(__name__)

#: Threads that read segments for Fetch and ListOffsets.
READ_THREADS = 4


class KafkaListener:
    """Serves the Kafka protocol on ``host:port`` for one broker: :meth:`start`, :meth:`stop`."""

    def __init__(self, broker: BrokerView, log_: Log, host: str, port: int, *,
                 max_message_size: int, auto_create: bool = True,
                 tls: ssl.SSLContext | None = None,
                 advertise: tuple[str, int] | None = None) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        #: What Metadata tells clients to connect to (None: the bound address).
        self.advertise = advertise
        self.topics = KafkaTopics(broker, log_, max_message_size)
        self._reads = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="kafka-read")
        self.producing = Producing(broker, log_, self.topics, max_message_size, auto_create)
        self.fetching = Fetching(broker, self.topics, self._reads)
        self.admin = Admin(self.topics, host, port, auto_create)
        self.coordinator = Coordinator()
        self.offsets = Offsets(broker, log_, self.topics, self.coordinator, (0, host, port))
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        """``HOST:PORT`` the listener serves (the port it got when given 0)."""
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve (BindError when the address is taken)."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                             socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as err:
            sock.close()
            raise BindError(f"cannot listen for Kafka clients on {self.host}:{self.port}: "
                            f"{err.strerror or err}") from err
        self.port = sock.getsockname()[1]
        self.admin.host, self.admin.port = self.advertise or (self.host, self.port)
        self.offsets.node = (0, self.admin.host, self.admin.port)
        self._server = await asyncio.start_server(self._accepted, sock=sock, ssl=self.tls,
                                                  backlog=1024)

    async def stop(self) -> None:
        """Stop accepting, close every connection, wait for their handlers."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections))
        await self.coordinator.close()
        # A read in flight finishes on its thread (its handler is gone): wait off the loop.
        await asyncio.get_running_loop().run_in_executor(None, self._reads.shutdown, True)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except p.ProtocolError as err:
            log.warning("Kafka client %s: %s; closing its connection", peer, err)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("Kafka client %s: request failed; closing its connection", peer)
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            size = p.frame_size(await reader.readexactly(4))
            data = await reader.readexactly(size)
            header = p.read_header(data)
            answer = await self._answer(header, data)
            if answer is not None:
                writer.write(answer)
                await writer.drain()

    async def _answer(self, header: p.RequestHeader, data: bytes) -> bytes | None:
        """The whole response to one request (None: the request gets none, acks=0)."""
        api = p.offered(header.api_key, header.api_version)
        if api is None:
            answer = p.unsupported(header.api_key, header.api_version, header.correlation_id)
            if answer is not None:
                if header.api_key != p.API_VERSIONS:
                    log.info("Kafka client %s asked for API %d v%d, which is not offered: "
                             "answered UNSUPPORTED_VERSION", header.client_id,
                             header.api_key, header.api_version)
                return answer
            raise p.ProtocolError(f"API {header.api_key} v{header.api_version} is not offered "
                                  "here (see ApiVersions)")
        request = p.read_request(api, header, data)
        body = await self._dispatch(api.key, header.api_version, request, header.client_id)
        if body is None:
            return None
        return p.encode_response(api, header.api_version, header.correlation_id, body)

    async def _dispatch(self, key: int, version: int, request: dict[str, Any],
                        client_id: str | None) -> dict[str, Any] | None:
        if key == p.PRODUCE:
            return await self.producing.produce(request)
        if key == p.FETCH:
            return await self.fetching.fetch(request)
        if key == p.LIST_OFFSETS:
            return await self.fetching.list_offsets(request)
        if key == p.METADATA:
            return await self.admin.metadata(version, request)
        if key == p.API_VERSIONS:
            return p.api_versions_body()
        if key == p.CREATE_TOPICS:
            return await self.admin.create_topics(request)
        if key == p.DELETE_TOPICS:
            return await self.admin.delete_topics(request)
        if key == p.DESCRIBE_CONFIGS:
            return await self.admin.describe_configs(request)
        if key == p.INIT_PRODUCER_ID:
            return self.producing.init_producer_id(request)
        return await self._groups(key, request, client_id)

    async def _groups(self, key: int, request: dict[str, Any], client_id: str | None,
                      ) -> dict[str, Any]:
        """The consumer group APIs and committed offsets."""
        if key == p.FIND_COORDINATOR:
            return self.offsets.find_coordinator(request)
        if key == p.OFFSET_COMMIT:
            return await self.offsets.commit(request)
        if key == p.OFFSET_FETCH:
            return await self.offsets.fetch(request)
        if key == p.JOIN_GROUP:
            return await self.coordinator.join_group(request, client_id)
        if key == p.SYNC_GROUP:
            return await self.coordinator.sync_group(request)
        if key == p.HEARTBEAT:
            return self.coordinator.heartbeat(request)
        assert key == p.LEAVE_GROUP
        return self.coordinator.leave_group(request)
