"""SASL/PLAIN with broker tokens and TLS on the Kafka listener: a token's scopes apply per
topic and group as over HTTP, nothing but ApiVersions is served before authenticating, a bad
or revoked token ends the connection, and the listener speaks TLS with the broker's
certificate."""

from __future__ import annotations

import asyncio
import ssl
import struct
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
)
from aiokafka.protocol.admin import (
    DeleteTopicsRequest_v1,
    DeleteTopicsResponse_v1,
    SaslAuthenticateRequest_v0,
    SaslAuthenticateResponse_v0,
    SaslHandShakeRequest_v1,
    SaslHandShakeResponse_v1,
)
from aiokafka.protocol.commit import OffsetCommitRequest_v2, OffsetCommitResponse_v2
from aiokafka.protocol.fetch import FetchRequest_v4, FetchResponse_v4
from aiokafka.protocol.metadata import MetadataRequest_v4
from aiokafka.protocol.offset import OffsetRequest_v1, OffsetResponse_v1

from messaging.http.auth import new_token, parse_scope, token_line
from messaging.http.server import BrokerServer
from messaging.kafka import protocol as p
from messaging.kafka.access import AuthenticationError, plain_password
from tests.conftest import StartServer
from tests.tls import make_certificates

ROLES = {"admin": ["admin"], "writer": ["write=orders", "read=orders"],
         "reader": ["read=orders", "consume=readers"], "stranger": ["read=other"]}


@pytest.fixture
def tokens(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    by_role = {role: new_token() for role in ROLES}
    path = tmp_path / "tokens"
    path.write_text("".join(token_line(role, by_role[role], [parse_scope(s) for s in scopes])
                            + "\n" for role, scopes in ROLES.items()))
    return path, by_role


class _Session:
    """A raw connection that authenticated with SASL/PLAIN (v1 handshake)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.correlation = reader, writer, 0

    @classmethod
    async def open(cls, server: BrokerServer, token: str) -> _Session:
        host, port = _address(server).rsplit(":", 1)
        session = cls(*await asyncio.open_connection(host, int(port)))
        shake = SaslHandShakeResponse_v1.decode(await session.ask(
            SaslHandShakeRequest_v1("PLAIN")))
        assert shake.error_code == p.NONE
        done = SaslAuthenticateResponse_v0.decode(await session.ask(
            SaslAuthenticateRequest_v0(b"\x00user\x00" + token.encode())))
        assert done.error_code == p.NONE, done.error_message
        return session

    async def ask(self, request: Any) -> bytes:
        self.correlation += 1
        data = struct.pack(">hhih", request.API_KEY, request.API_VERSION, self.correlation,
                           -1) + request.encode()
        self.writer.write(struct.pack(">i", len(data)) + data)
        await self.writer.drain()
        size = struct.unpack(">i", await self.reader.readexactly(4))[0]
        body = await self.reader.readexactly(size)
        assert struct.unpack_from(">i", body)[0] == self.correlation
        return body[4:]

    def close(self) -> None:
        self.writer.close()


def _address(server: BrokerServer) -> str:
    assert server.kafka is not None
    return server.kafka.address


def _sasl(token: str) -> dict[str, object]:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "anyone", "sasl_plain_password": token}


async def test_scopes_apply_per_topic_and_group(start_server: StartServer,
                                                tokens: tuple[Path, dict[str, str]]) -> None:
    path, by_role = tokens
    server = await start_server(kafka_bind=("127.0.0.1", 0), tokens=path)
    writer = AIOKafkaProducer(bootstrap_servers=_address(server), **_sasl(by_role["writer"]))
    await writer.start()
    try:
        await writer.send_and_wait("orders", b"allowed")
        with pytest.raises(TopicAuthorizationFailedError):
            await writer.send_and_wait("secret", b"refused")
    finally:
        await writer.stop()
    reader = AIOKafkaConsumer("orders", bootstrap_servers=_address(server), group_id="readers",
                              auto_offset_reset="earliest", **_sasl(by_role["reader"]))
    await reader.start()
    try:
        record = await asyncio.wait_for(reader.getone(), 30)
        assert record.value == b"allowed"
        await reader.commit()
    finally:
        await reader.stop()
    stranger = AIOKafkaConsumer(bootstrap_servers=_address(server),
                                **_sasl(by_role["stranger"]))
    await stranger.start()
    try:
        assert "orders" not in await stranger.topics()  # listings show what it may read
    finally:
        await stranger.stop()
    session = await _Session.open(server, by_role["stranger"])
    try:
        fetched = FetchResponse_v4.decode(await session.ask(FetchRequest_v4(
            -1, 0, 1, 1 << 20, 0, [("orders", [(0, 0, 1 << 20)])])))
        assert fetched.topics[0][1][0][1] == p.TOPIC_AUTHORIZATION_FAILED
        listed = OffsetResponse_v1.decode(await session.ask(OffsetRequest_v1(
            -1, [("orders", [(0, -1)])])))
        assert listed.topics[0][1][0][1] == p.TOPIC_AUTHORIZATION_FAILED
        committed = OffsetCommitResponse_v2.decode(await session.ask(OffsetCommitRequest_v2(
            "readers", -1, "", -1, [("orders", [(0, 5, "")])])))
        assert committed.topics[0][1][0][1] == p.GROUP_AUTHORIZATION_FAILED
        deleted = DeleteTopicsResponse_v1.decode(await session.ask(DeleteTopicsRequest_v1(
            ["orders"], 1000)))
        assert deleted.topic_error_codes[0][1] == p.TOPIC_AUTHORIZATION_FAILED
    finally:
        session.close()
    grouped = AIOKafkaConsumer("orders", bootstrap_servers=_address(server),
                               group_id="not-mine", **_sasl(by_role["writer"]))
    with pytest.raises(GroupAuthorizationFailedError):
        await grouped.start()
        await asyncio.wait_for(grouped.getone(), 30)
    await grouped.stop()


async def test_a_wrong_token_and_requests_before_sasl_end_the_connection(
        start_server: StartServer, tokens: tuple[Path, dict[str, str]]) -> None:
    path, _ = tokens
    server = await start_server(kafka_bind=("127.0.0.1", 0), tokens=path)
    producer = AIOKafkaProducer(bootstrap_servers=_address(server), **_sasl("not-a-token"),
                                request_timeout_ms=5000)
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    host, port = _address(server).rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    request = MetadataRequest_v4(None, True)
    data = struct.pack(">hhih", request.API_KEY, request.API_VERSION, 1, -1) + request.encode()
    writer.write(struct.pack(">i", len(data)) + data)
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, nothing answered
    writer.close()


async def test_a_revoked_token_ends_its_connections(start_server: StartServer,
                                                   tokens: tuple[Path, dict[str, str]]) -> None:
    path, by_role = tokens
    server = await start_server(kafka_bind=("127.0.0.1", 0), tokens=path)
    producer = AIOKafkaProducer(bootstrap_servers=_address(server), **_sasl(by_role["writer"]),
                                request_timeout_ms=3000, retry_backoff_ms=100)
    await producer.start()
    try:
        await producer.send_and_wait("orders", b"before")
        path.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                                if not line.startswith("writer ")))
        assert server.tokens is not None
        await asyncio.get_running_loop().run_in_executor(None, server.tokens.reload)
        with pytest.raises(Exception):  # noqa: B017 - whichever error the client surfaces
            await asyncio.wait_for(producer.send_and_wait("orders", b"after"), 10)
    finally:
        await producer.stop()


async def test_the_listener_speaks_tls_with_the_brokers_certificate(
        start_server: StartServer, tmp_path: Path) -> None:
    await asyncio.get_running_loop().run_in_executor(None, make_certificates, tmp_path)
    server = await start_server(kafka_bind=("127.0.0.1", 0), tls_cert=tmp_path / "server.pem",
                                tls_key=tmp_path / "server-key.pem")
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    producer = AIOKafkaProducer(bootstrap_servers=_address(server), security_protocol="SSL",
                                ssl_context=context)
    await producer.start()
    try:
        sent = await producer.send_and_wait("secure", b"over tls")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=_address(server), security_protocol="SSL",
                                ssl_context=context, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition("secure", 0)
        consumer.assign([tp])
        consumer.seek(tp, sent.offset)
        assert (await asyncio.wait_for(consumer.getone(), 30)).value == b"over tls"
    finally:
        await consumer.stop()


@pytest.mark.parametrize(("message", "password"), [(b"\x00user\x00secret", "secret"),
                                                   (b"authz\x00user\x00p\xc3\xa9", "p\xe9")])
def test_a_plain_message_gives_its_password(message: bytes, password: str) -> None:
    assert plain_password(message) == password


@pytest.mark.parametrize("message", [b"", b"user\x00secret", b"\x00user\x00", b"\x00u\x00\xff"])
def test_a_malformed_plain_message_is_refused(message: bytes) -> None:
    with pytest.raises(AuthenticationError):
        plain_password(message)


def test_the_sasl_apis_are_offered() -> None:
    assert p.offered(p.SASL_HANDSHAKE, 1) is not None and p.offered(p.SASL_HANDSHAKE, 0) is None
    assert p.offered(p.SASL_AUTHENTICATE, 1) is not None
