"""The console's routes over real sockets: its files (open to anyone, with a strict
Content-Security-Policy), ``/messaging/whoami`` and ``/messaging/disk``."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp

from messaging.http.auth import new_token, parse_scope, token_line
from messaging.http.console import CONTENT_SECURITY_POLICY, STATIC, STATIC_DIR
from tests.conftest import StartServer


def test_every_file_of_the_console_is_served_and_nothing_else() -> None:
    assert sorted(p.name for p in STATIC_DIR.iterdir()) == sorted(STATIC)


def test_no_inline_script_or_style_and_no_other_origin() -> None:
    page = (STATIC_DIR / "index.html").read_text()
    assert re.findall(r"<script[^>]*>", page) == ['<script type="module" src="app.js">']
    assert "style=" not in page and "<style" not in page
    for name in STATIC:
        text = (STATIC_DIR / name).read_text()
        assert ".innerHTML" not in text and ".outerHTML" not in text, name
        assert "insertAdjacentHTML" not in text and "document.write" not in text, name
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), name
        assert "localStorage" not in text and "new EventSource" not in text, name


async def test_files_are_open_and_carry_the_security_headers(
        start_server: StartServer, tmp_path: Path) -> None:
    """With tokens, the page loads without one; every answer has the CSP and nosniff."""
    tokens = tmp_path / "tokens"
    tokens.write_text(token_line("r", new_token(), [parse_scope("read")]) + "\n")
    server = await start_server(tokens=tokens)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/console", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/console/"
        for path, kind in [("/console/", "text/html"), *(
                (f"/console/{name}", STATIC[name].split(";")[0]) for name in STATIC)]:
            async with http.get(server.url + path) as resp:
                assert resp.status == 200, path
                assert resp.content_type == kind, path
                assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
                await resp.read()
        assert "default-src 'self'" in CONTENT_SECURITY_POLICY
        assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
        assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
        async with http.get(f"{server.url}/console/config.json") as resp:
            assert await resp.json() == {"auth": True}
            assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        async with http.get(f"{server.url}/console/../messaging/topics") as resp:
            assert resp.status == 401  # not a file: the API, which needs a token
        async with http.get(f"{server.url}/console/nothing.js") as resp:
            assert resp.status == 401  # unknown paths tell nothing without a token


async def test_whoami_names_the_token_and_its_scopes(start_server: StartServer,
                                                     tmp_path: Path) -> None:
    reader, writer = new_token(), new_token()
    tokens = tmp_path / "tokens"
    tokens.write_text(
        token_line("reader", reader, [parse_scope("read=1,chat/*")]) + "\n"
        + token_line("writer", writer, [parse_scope("write=2")]) + "\n")
    server = await start_server(tokens=tokens)
    async with aiohttp.ClientSession() as http:
        url = f"{server.url}/messaging/whoami"
        async with http.get(url, headers={"Authorization": f"Bearer {reader}"}) as resp:
            assert resp.status == 200
            assert await resp.json() == {"name": "reader", "auth": True,
                                         "scopes": ["read=1,chat/*"]}
        async with http.get(url) as resp:
            assert resp.status == 401
        async with http.get(url, headers={"Authorization": "Bearer msg_wrong"}) as resp:
            assert resp.status == 401 and resp.headers["X-Broker-Error"] == "invalid token"
        async with http.get(url, headers={"Authorization": f"Bearer {writer}"}) as resp:
            assert resp.status == 403  # the console needs a read scope


async def test_whoami_without_tokens_and_disk(start_server: StartServer) -> None:
    server = await start_server()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/messaging/whoami") as resp:
            assert await resp.json() == {"name": "anonymous", "auth": False,
                                         "scopes": ["admin"]}
        async with http.get(f"{server.url}/messaging/disk") as resp:
            disk = await resp.json()
        async with http.get(f"{server.url}/console/config.json") as resp:
            assert await resp.json() == {"auth": False}
    assert disk["total"] > 0 and 0 <= disk["free"] <= disk["total"]
    assert 0 <= disk["used"] <= disk["total"]
