"""Kafka requests sent on to another node's listener (a cluster of topic groups).

A node that does not hold a Kafka topic's group asks a node that does, over the Kafka protocol
itself: the other listener answers as it answers any client, with the same token (the
client's SASL password) and so the same scopes. A forwarded request carries
:data:`FORWARDED_CLIENT` as its client id, and a listener never forwards such a request again:
a holder that moved meanwhile answers with an error code, which the client acts on as on any
Kafka broker's (it reads Metadata again).
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from typing import Any

from messaging.config import parse_host_port
from messaging.kafka import protocol as p

#: The client id of a forwarded request (it is not forwarded again).
FORWARDED_CLIENT = "messaging-forward"
#: How long one forwarded exchange may take (connect, authenticate, answer): well inside a
#: client's own request timeout (30 s by default), so it gets this node's error code first.
FORWARD_TIMEOUT = 10.0
_SIZE = struct.Struct(">i")
_REQUEST_HEADER = struct.Struct(">hhih")


class ForwardError(Exception):
    """The other node could not be asked (unreachable, refused the token, answered nothing)."""


class Forwarder:
    """Sends one request to another node's Kafka listener and returns its answer."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        #: The client side of TLS when the listeners speak it (None: plain TCP).
        self.tls = tls

    async def ask(self, address: str, api_key: int, version: int, body: dict[str, Any],
                  password: str | None) -> dict[str, Any]:
        """The answer of the listener at ``address`` to one request (ForwardError when there
        is none)."""
        try:
            async with asyncio.timeout(FORWARD_TIMEOUT):
                return await self._ask(address, api_key, version, body, password)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, p.ProtocolError) as err:
            raise ForwardError(f"{address}: {err or type(err).__name__}") from err

    async def _ask(self, address: str, api_key: int, version: int, body: dict[str, Any],
                   password: str | None) -> dict[str, Any]:
        host, port = parse_host_port(address)
        reader, writer = await asyncio.open_connection(
            host, port, ssl=self.tls, server_hostname=host if self.tls is not None else None)
        try:
            if password is not None:
                await _exchange(reader, writer, p.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
                answer = await _exchange(reader, writer, p.SASL_AUTHENTICATE, 1, {
                    "sasl_auth_bytes": b"\0" + FORWARDED_CLIENT.encode() + b"\0"
                    + password.encode()})
                if answer["error_code"] != p.NONE:
                    raise p.ProtocolError(f"the token was refused: {answer.get('error_message')}")
            return await _exchange(reader, writer, api_key, version, body)
        finally:
            writer.close()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: int,
                    version: int, body: dict[str, Any]) -> dict[str, Any]:
    api = p.APIS[api_key]
    request_class, response_class = api.structs(version)
    encoded = request_class.SCHEMA.encode(p.fields_of(request_class.SCHEMA, body))
    client = FORWARDED_CLIENT.encode()
    header = _REQUEST_HEADER.pack(api_key, version, 1, len(client)) + client
    writer.write(_SIZE.pack(len(header) + len(encoded)) + header + encoded)
    await writer.drain()
    size = p.frame_size(await reader.readexactly(4))
    data = await reader.readexactly(size)
    try:
        return p.dict_of(response_class.SCHEMA, response_class.decode(data[4:]))
    except Exception as err:  # the structs raise anything from struct.error to ValueError
        raise p.ProtocolError(f"{api.name} v{version} answer does not decode: {err}") from err
