"""The application around the handlers, over real sockets: the error middleware (unknown paths,
wrong methods, control characters echoed into X-Broker-Error, request bodies that do not
decode) and the content decoding aiohttp does for every route."""

from __future__ import annotations

import gzip

import aiohttp
import pytest

from messaging.frames import decode
from messaging.http.server import BrokerServer
from tests.http.test_messages import expect_error
from tests.raw_http import body_of, exchange, parse_head


async def test_wrong_method_and_unknown_path(server: BrokerServer,
                                             http: aiohttp.ClientSession) -> None:
    async with http.delete(f"{server.url}/messaging/messages") as resp:
        await expect_error(resp, 405, "not allowed")
    async with http.get(f"{server.url}/messaging/heartbeat") as resp:
        await expect_error(resp, 405, "not allowed")
    async with http.get(f"{server.url}/nowhere") as resp:
        await expect_error(resp, 404, "not found")
    async with http.get(f"{server.url}/messaging/topics/12") as resp:
        await expect_error(resp, 404, "topic 12 not found")


# -- 7: control characters echoed into X-Broker-Error ------------------------------------------


@pytest.mark.parametrize("escape", ["%00", "%01", "%7F", "%0A", "%0D%0A", "%1B", "%C3%A9"])
async def test_control_characters_in_the_path_get_a_sanitised_404(server: BrokerServer,
                                                                  escape: str) -> None:
    raw = await exchange(server.port, f"GET /nowhere{escape}x HTTP/1.1\r\nHost: t\r\n"
                                      f"Connection: close\r\n\r\n".encode())
    status, headers = parse_head(raw)
    assert status == 404
    message = headers["x-broker-error"]
    assert message.startswith("not found: GET /nowhere") and message.endswith("x")
    assert body_of(raw).decode("ascii") == message + "\n"


async def test_control_characters_in_a_parameter_get_a_sanitised_400(server: BrokerServer,
                                                                     ) -> None:
    raw = await exchange(server.port, b"GET /messaging/topics/1%00%7F HTTP/1.1\r\nHost: t\r\n"
                                      b"Connection: close\r\n\r\n")
    status, headers = parse_head(raw)
    assert status == 400
    assert headers["x-broker-error"] == (
        r"invalid topic id '1\x00\x7f': expected a topic id (an unsigned integer below 2^64) "
        "or a stream's name (the NAME of /v1/stream/NAME)")
    raw = await exchange(server.port, b"GET /messaging/messages?topicID=%01 HTTP/1.1\r\n"
                                      b"Host: t\r\nConnection: close\r\n\r\n")
    assert parse_head(raw)[0] == 400


# -- 8: bodies that do not decode -----------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_body_that_does_not_match_its_content_encoding_is_400(
        server: BrokerServer, http: aiohttp.ClientSession, encoding: str) -> None:
    for content_type in ("application/octet-stream", "application/x-messaging-frames"):
        async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                             data=b"this is not compressed",
                             headers={"Content-Encoding": encoding,
                                      "Content-Type": content_type}) as resp:
            assert resp.status == 400, await resp.text()
            assert f"not valid {encoding} data" in resp.headers["X-Broker-Error"]
    assert server.broker is not None and server.broker.index == 0


async def test_gzip_body_is_decoded(server: BrokerServer, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{server.url}/messaging/messages", params={"topicID": "1"},
                         data=gzip.compress(b"squeezed"),
                         headers={"Content-Encoding": "gzip"}) as resp:
        assert resp.status == 200, await resp.text()
    async with http.get(f"{server.url}/messaging/messages", params={"topicID": "1"}) as resp:
        assert [m.data for m in decode(await resp.read(), after=0)[0]] == [b"squeezed"]
