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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from messaging.broker.view import BrokerView
from messaging.errors import BindError
from messaging.kafka import protocol as p
from messaging.kafka.access import (
    EVERYONE,
    Authenticate,
    AuthenticationError,
    authenticate,
    plain_password,
    serve_as,
)
from messaging.kafka.face import Face
from messaging.kafka.forward import FORWARDED_CLIENT, Forwarder
from messaging.kafka.groups import Coordinator
from messaging.kafka.nodes import Nodes
from messaging.kafka.offsets import find_coordinator
from messaging.kafka.produce import init_producer_id
from messaging.kafka.routing import ROUTED, GroupRouter
from messaging.kafka.topics import KafkaTopics
from messaging.log.base import Log

log = logging.getLogger(__name__)

#: Threads that read segments for Fetch and ListOffsets.
READ_THREADS = 4
#: Requests of one connection read before their answers are sent (then it stops reading).
MAX_IN_FLIGHT = 64
#: The largest request read before a connection authenticated (with --tokens).
MAX_UNAUTHENTICATED = 512 << 10


class Holdings(Protocol):
    """What the listener of a node in a cluster of topic groups asks of the node."""

    #: How many groups the cluster has.
    groups: int

    def held(self, group: int) -> tuple[BrokerView, Log] | None:
        """The broker and log of a group this node holds and has caught up with."""

    def kafka_holder(self, group: int) -> str | None:
        """The Kafka address of another live node that holds ``group`` (None: none)."""


class _Connection:
    """What one connection's requests share: how far it got with SASL."""

    def __init__(self) -> None:
        self.handshaken = False
        self.password: str | None = None
        self.failed: str | None = None


class KafkaListener:
    """Serves the Kafka protocol on ``host:port`` for one broker: :meth:`start`, :meth:`stop`."""

    def __init__(self, broker: BrokerView | None, log_: Log | None, host: str, port: int, *,
                 max_message_size: int, auto_create: bool = True,
                 tls: ssl.SSLContext | None = None,
                 advertise: tuple[str, int] | None = None,
                 tokens: Authenticate | None = None,
                 peers: Callable[[], list[str]] | None = None,
                 pipelined: bool = True,
                 holdings: Holdings | None = None,
                 forward_tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        #: What Metadata tells clients to connect to (None: the bound address).
        self.advertise = advertise
        #: With --tokens: a token's principal (connections must authenticate with SASL/PLAIN).
        self.tokens = tokens
        #: Whether the log applies commands in the order they are handed in (see _serve).
        self.pipelined = pipelined
        self.max_message_size = max_message_size
        self.auto_create = auto_create
        self._reads = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="kafka-read")
        #: This node and, in a cluster, the other nodes' Kafka listeners (``peers``).
        self.nodes = Nodes(*(advertise or (host, port)), peers)
        self.coordinator = Coordinator(self.nodes)
        #: The one log's handlers (None on a node of a cluster of topic groups: see router).
        self.face: Face | None = None
        #: A node of a cluster of topic groups: each topic's requests go to its group.
        self.router: GroupRouter | None = None
        self._faces: dict[int, tuple[BrokerView, Face]] = {}
        if holdings is None:
            assert broker is not None and log_ is not None
            self.face = self._face(broker, log_, (0, 1))
        else:
            self.holdings = holdings
            self.router = GroupRouter(holdings.groups, self._face_of, holdings.kafka_holder,
                                      self.nodes, self.coordinator, Forwarder(forward_tls))
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def _face(self, broker: BrokerView, log_: Log, home: tuple[int, int]) -> Face:
        return Face(broker, log_, nodes=self.nodes, coordinator=self.coordinator,
                    reads=self._reads, max_message_size=self.max_message_size,
                    auto_create=self.auto_create, home=home)

    def _face_of(self, group: int) -> Face | None:
        """The face of a group this node holds and has caught up with (made at first use,
        again when the group's broker changed)."""
        held = self.holdings.held(group)
        if held is None:
            self._faces.pop(group, None)
            return None
        broker, log_ = held
        known = self._faces.get(group)
        if known is None or known[0] is not broker:
            known = self._faces[group] = (broker, self._face(broker, log_,
                                                             (group, self.holdings.groups)))
        return known[1]

    @property
    def topics(self) -> KafkaTopics:
        """The one log's Kafka topics (a single node or a cluster of one group)."""
        assert self.face is not None
        return self.face.topics

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
        if self.advertise is None:
            self.nodes.port = self.port
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
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client went away (a reset, a broken TLS session)
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
        """Read requests and answer them in order. Each request runs as a task of its own as
        soon as it is read, so a client's pipelined produces share the log's group commits
        instead of waiting for each other's fsync; a request's work up to the log (where its
        order is decided) runs before the next request's starts. At most MAX_IN_FLIGHT wait
        for their answers; the SASL exchange runs alone. Where the log does not keep the order
        its commands were handed in (a cluster's concurrent etcd puts), each request is
        answered before the next is read, as a Kafka broker does."""
        connection = _Connection()
        serve_as(EVERYONE if self.tokens is None else None)
        answers: asyncio.Queue[asyncio.Future[bytes | None]] = asyncio.Queue(
            MAX_IN_FLIGHT if self.pipelined else 1)
        sending = asyncio.ensure_future(self._send(answers, writer, connection))
        reading = asyncio.current_task()
        assert reading is not None

        def stop_reading(_: object) -> None:
            reading.cancel()  # the answers ended (the client went away, SASL failed)

        sending.add_done_callback(stop_reading)
        try:
            while True:
                size = p.frame_size(await reader.readexactly(4))
                if connection.password is None and self.tokens is not None and (
                        size > MAX_UNAUTHENTICATED):
                    raise p.ProtocolError(f"a request of {size} bytes before authenticating "
                                          f"(at most {MAX_UNAUTHENTICATED})")
                data = await reader.readexactly(size)
                header = p.read_header(data)
                if header.api_key in (p.SASL_HANDSHAKE, p.SASL_AUTHENTICATE):
                    await answers.join()  # nothing else in flight
                    answer = asyncio.get_running_loop().create_future()
                    answer.set_result(await self._answer(connection, header, data))
                else:
                    answer = asyncio.ensure_future(self._answer(connection, header, data))
                await answers.put(answer)
                if self.pipelined:
                    await asyncio.sleep(0)  # the request's own start, before the next is read
                else:
                    await answers.join()  # answered before the next is read
        except asyncio.CancelledError:
            failure = (sending.exception() if sending.done() and not sending.cancelled()
                       else None)
            if failure is not None:
                raise failure from None  # why the answers ended
            raise
        finally:
            sending.remove_done_callback(stop_reading)  # the reading's own error stands
            sending.cancel()
            while not answers.empty():
                answers.get_nowait().cancel()
            await asyncio.gather(sending, return_exceptions=True)

    @staticmethod
    async def _send(answers: asyncio.Queue[asyncio.Future[bytes | None]],
                    writer: asyncio.StreamWriter, connection: _Connection) -> None:
        """Write the answers in the order the requests came."""
        while True:
            answer = await answers.get()
            try:
                data = await answer
            finally:
                answers.task_done()
            if data is not None:
                writer.write(data)
                await writer.drain()
            if connection.failed is not None:
                raise p.ProtocolError(f"authentication failed: {connection.failed}")

    async def _answer(self, connection: _Connection, header: p.RequestHeader,
                      data: bytes) -> bytes | None:
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
        body: dict[str, Any] | None
        if api.key in (p.SASL_HANDSHAKE, p.SASL_AUTHENTICATE):
            body = self._sasl(connection, api.key, request)
        else:
            self._check_authenticated(connection, api)
            body = await self._dispatch(api.key, header.api_version, request, header.client_id,
                                        connection.password)
        if body is None:
            return None
        return p.encode_response(api, header.api_version, header.correlation_id, body)

    def _sasl(self, connection: _Connection, key: int, request: dict[str, Any],
              ) -> dict[str, Any]:
        """SaslHandshake (PLAIN only) and SaslAuthenticate (a broker token as password)."""
        if key == p.SASL_HANDSHAKE:
            if self.tokens is None:
                return {"error_code": p.ILLEGAL_SASL_STATE, "enabled_mechanisms": []}
            if request["mechanism"] != "PLAIN":
                return {"error_code": p.UNSUPPORTED_SASL_MECHANISM,
                        "enabled_mechanisms": ["PLAIN"]}
            connection.handshaken = True
            return {"error_code": p.NONE, "enabled_mechanisms": ["PLAIN"]}
        if self.tokens is None or not connection.handshaken:
            return {"error_code": p.ILLEGAL_SASL_STATE,
                    "error_message": "send SaslHandshake with PLAIN first"}
        try:
            password = plain_password(request["sasl_auth_bytes"] or b"")
            principal = authenticate(self.tokens, password)
        except AuthenticationError as err:
            connection.failed = str(err)
            return {"error_code": p.SASL_AUTHENTICATION_FAILED, "error_message": str(err),
                    "sasl_auth_bytes": b""}
        connection.password = password
        log.debug("Kafka connection authenticated as %s", principal.name)
        serve_as(principal)
        return {"error_code": p.NONE, "sasl_auth_bytes": b""}

    def _check_authenticated(self, connection: _Connection, api: p.Api) -> None:
        """With tokens: nothing but ApiVersions before SASL, and the token still valid."""
        if self.tokens is None or api.key == p.API_VERSIONS:
            return
        if connection.password is None:
            raise p.ProtocolError(f"{api.name} before authenticating: this broker takes "
                                  "SASL/PLAIN with a token as the password")
        try:
            serve_as(authenticate(self.tokens, connection.password))
        except AuthenticationError as err:
            raise p.ProtocolError(f"the connection's token is no longer valid: {err}") from err

    async def _dispatch(self, key: int, version: int, request: dict[str, Any],
                        client_id: str | None, password: str | None,
                        ) -> dict[str, Any] | None:
        if key == p.API_VERSIONS:
            return p.api_versions_body()
        if key == p.INIT_PRODUCER_ID:
            return init_producer_id(request)
        if key not in ROUTED:
            return await self._groups(key, request, client_id)
        if self.router is not None:
            return await self.router.dispatch(key, version, request, password,
                                              forwarded=client_id == FORWARDED_CLIENT)
        face = self.face
        assert face is not None
        if key == p.PRODUCE:
            return await face.producing.produce(request)
        if key == p.FETCH:
            return await face.fetching.fetch(request)
        if key == p.LIST_OFFSETS:
            return await face.fetching.list_offsets(request)
        if key == p.METADATA:
            return await face.admin.metadata(version, request)
        if key == p.CREATE_TOPICS:
            return await face.admin.create_topics(request)
        if key == p.DELETE_TOPICS:
            return await face.admin.delete_topics(request)
        if key == p.DESCRIBE_CONFIGS:
            return await face.admin.describe_configs(request)
        if key == p.OFFSET_COMMIT:
            return await face.offsets.commit(request)
        assert key == p.OFFSET_FETCH
        return await face.offsets.fetch(request)

    async def _groups(self, key: int, request: dict[str, Any], client_id: str | None,
                      ) -> dict[str, Any]:
        """The consumer group APIs."""
        if key == p.FIND_COORDINATOR:
            return find_coordinator(self.nodes, request)
        if key == p.JOIN_GROUP:
            return await self.coordinator.join_group(request, client_id)
        if key == p.SYNC_GROUP:
            return await self.coordinator.sync_group(request)
        if key == p.HEARTBEAT:
            return self.coordinator.heartbeat(request)
        assert key == p.LEAVE_GROUP
        return self.coordinator.leave_group(request)
