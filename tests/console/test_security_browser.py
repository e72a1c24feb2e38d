"""The console against a broker that takes tokens: the page loads without one and asks for
it, a wrong token gets a clear message, a read token sees no publish form, an admin token
publishes; the token stays in the tab (sessionStorage), in headers only, never in a URL or
the broker's log."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from tests.console.conftest import ConsolePage, TokenBroker, publish, request

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def log_in(console: ConsolePage, token: str) -> None:
    await console.page.fill("#token", token)
    await console.page.click("#login button[type=submit]")


async def test_a_wrong_token_gets_a_clear_message(console: ConsolePage,
                                                  token_broker: TokenBroker) -> None:
    console.allowed.append("status of 401")  # the refused whoami
    await console.open(token_broker.url)
    await expect(console.page.locator("#login")).to_be_visible()
    await log_in(console, "msg_not-a-token")
    await expect(console.page.locator("#login-status")).to_have_text(
        "The broker refused this token: invalid token")
    assert await console.page.evaluate("() => sessionStorage.length") == 0


async def test_a_token_without_read_is_told_so(console: ConsolePage,
                                               token_broker: TokenBroker) -> None:
    console.allowed.append("status of 403")
    await console.open(token_broker.url)
    await log_in(console, token_broker.tokens["publisher"])
    await expect(console.page.locator("#login-status")).to_contain_text("may not read")


async def test_a_read_token_sees_no_publish_form(console: ConsolePage,
                                                 token_broker: TokenBroker) -> None:
    publish(token_broker.url, 1, "for readers", token=token_broker.tokens["admin"])
    page = console.page
    await console.open(token_broker.url)
    await log_in(console, token_broker.tokens["reader"])
    await expect(page.locator("#topic-list .vrow[data-topic='1']")).to_be_visible()
    await expect(page.locator("#who")).to_have_text("reader: read")
    await expect(page.locator("#nav-publish")).to_be_hidden()
    await page.goto(f"{token_broker.url}/console/#/publish")
    await expect(page.locator("main")).to_contain_text("This token may not publish.")
    assert await page.locator("#publish-form").count() == 0
    await page.goto(f"{token_broker.url}/console/#/messages?topic=1")
    await expect(page.locator("#browse-rows pre")).to_have_text("for readers")
    await page.goto(f"{token_broker.url}/console/#/consumers")
    await expect(page.locator("#consumers-status")).to_contain_text("No consumers")
    assert await page.locator("th", has_text="Admin").count() == 0


async def test_an_admin_token_publishes_and_stays_out_of_urls_and_logs(
        console: ConsolePage, token_broker: TokenBroker) -> None:
    token = token_broker.tokens["admin"]
    page = console.page
    await console.open(token_broker.url, "publish")
    await log_in(console, token)
    await expect(page.locator("#publish-form")).to_be_visible()
    await page.fill("#publish-topic", "2")
    await page.fill("#publish-data", "from an admin")
    await page.click("#publish-send")
    await expect(page.locator("#publish-status")).to_contain_text("Published to topic 2")
    for screen in ("topics", "messages?topic=2", "tail?topic=2", "consumers", "cluster"):
        await page.goto(f"{token_broker.url}/console/#/{screen}")
        await expect(page.locator("main section")).to_be_visible()
    await page.wait_for_timeout(300)
    assert await page.evaluate("() => Object.keys(localStorage).length") == 0
    assert await page.evaluate("() => Object.values(sessionStorage)") == [token]
    sent = console.requests
    assert any(r.url.endswith("/messaging/whoami") for r in sent)
    assert not [r.url for r in sent if token in r.url]
    api = [r for r in sent if "/messaging/" in r.url]
    assert api
    for sent_request in api:
        headers = await sent_request.all_headers()
        assert headers.get("authorization") == f"Bearer {token}", sent_request.url
    assert token not in token_broker.process.log.read_text()
    # The token goes when the tab forgets it.
    await page.click("#logout")
    await expect(page.locator("#login")).to_be_visible()
    assert await page.evaluate("() => sessionStorage.length") == 0


async def test_the_page_itself_needs_no_token(token_broker: TokenBroker) -> None:
    status, headers, body = request(token_broker.url, "/console/")
    assert status == 200 and b'src="app.js"' in body
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    status, _headers, _body = request(token_broker.url, "/messaging/topics")
    assert status == 401
