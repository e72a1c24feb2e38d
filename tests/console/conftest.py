"""The console's fixtures: one Chromium for the whole session (Debian's, driven by playwright;
never a downloaded browser), a fresh page per test that records console errors, dialogs and
requests, and broker processes on 127.0.0.1 with data to show.

The browser tests are end to end (marked ``e2e``): they run in ``make test``, not in ``make
test-unit``. They share the session's event loop with the browser (``loop_scope="session"``).
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, ConsoleMessage, Dialog, Page, Request, async_playwright

from messaging.http.auth import new_token, parse_scope, token_line
from tests.conftest import BrokerProcess

HERE = Path(__file__).parent
#: Debian's chromium (make chromium installs it).
CHROMIUM = "/usr/bin/chromium"
#: Modules whose tests drive the browser.
BROWSER_MODULES = ("test_browser", "test_cluster", "test_many_topics", "test_security_browser")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every browser test is end to end (``make test-unit`` leaves it out)."""
    for item in items:
        if item.path.is_relative_to(HERE) and item.path.stem.startswith(BROWSER_MODULES):
            item.add_marker(pytest.mark.e2e)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One Chromium for the session."""
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if executable is None:
        pytest.fail("the console's tests need Debian's chromium: apt-get install chromium "
                    "(make chromium); playwright's own browser download is not used")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable,
                                                    args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class ConsolePage:
    """A page and what it did: console errors, dialogs opened, URLs requested."""

    page: Page
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    #: Console errors a test expects (substrings), e.g. the 401 of a refused token.
    allowed: list[str] = field(default_factory=list)

    def unexpected_errors(self) -> list[str]:
        return [e for e in self.errors if not any(a in e for a in self.allowed)]

    async def open(self, base: str, screen: str = "topics") -> None:
        """Open the console of the broker at ``base`` on ``screen``."""
        await self.page.goto(f"{base}/console/#/{screen}")


@pytest_asyncio.fixture(loop_scope="session")
async def console(browser: Browser) -> AsyncIterator[ConsolePage]:
    """A new browser context and page; the test fails on any console error it did not
    expect."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    page.set_default_timeout(10_000)
    found = ConsolePage(page)

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            found.errors.append(message.text)

    async def on_dialog(dialog: Dialog) -> None:
        found.dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("console", on_console)
    page.on("pageerror", lambda error: found.errors.append(f"page error: {error}"))
    page.on("dialog", on_dialog)
    page.on("request", lambda sent: found.requests.append(sent))
    try:
        yield found
    finally:
        await context.close()
    assert found.unexpected_errors() == [], found.errors
    assert found.dialogs == []


# -- brokers and their data -------------------------------------------------------------------


def request(url: str, path: str, *, method: str = "GET", data: bytes | None = None,
            params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
            timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP request (status, headers, body); errors are answers too."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    req = urllib.request.Request(url + path + query, data=data, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def publish(url: str, topic: int, data: bytes | str, *, type_: int = 1,
            token: str | None = None) -> int:
    """Publish one message; its index."""
    body = data.encode() if isinstance(data, str) else data
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, answer, text = request(url, "/messaging/messages", method="POST", data=body,
                                   params={"topicID": topic, "type": type_}, headers=headers)
    assert status == 200, text
    return int(answer["X-Broker-Index"])


def create_stream(url: str, name: str, content_type: str = "application/json") -> None:
    status, _headers, text = request(url, f"/v1/stream/{name}", method="PUT",
                                     headers={"Content-Type": content_type})
    assert status in (200, 201), text


def heartbeat(url: str, topic: int, index: int, name: str) -> None:
    status, _headers, text = request(url, "/messaging/heartbeat", method="POST", data=b"",
                                     params={"topicID": topic, "index": index, "url": name})
    assert status == 200, text


def topics(url: str, token: str | None = None) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, _headers, body = request(url, "/messaging/topics", headers=headers)
    assert status == 200, body
    listed: list[dict[str, Any]] = json.loads(body)
    return listed


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker process for the module's tests."""
    process = BrokerProcess(tmp_path_factory.mktemp("console") / "data").start()
    try:
        yield process
    finally:
        process.kill()


@dataclass
class TokenBroker:
    """A broker that takes tokens, and a token per role."""

    process: BrokerProcess
    tokens: dict[str, str]

    @property
    def url(self) -> str:
        return self.process.url


#: The roles of the token broker and their scopes.
ROLES = {"admin": ["admin"], "reader": ["read"], "writer": ["read", "write"],
         "publisher": ["write"]}


@pytest.fixture(scope="module")
def token_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenBroker]:
    """A broker started with ``--tokens``: one token per role of :data:`ROLES`."""
    folder = tmp_path_factory.mktemp("tokens")
    tokens = {role: new_token() for role in ROLES}
    path = folder / "tokens"
    path.write_text("".join(token_line(role, tokens[role], [parse_scope(s) for s in scopes])
                            + "\n" for role, scopes in ROLES.items()))
    process = BrokerProcess(folder / "data", "--tokens", str(path)).start()
    try:
        yield TokenBroker(process, tokens)
    finally:
        process.kill()
