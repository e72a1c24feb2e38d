"""The console in Chromium against a real broker process: every screen loads with data, the
browser finds a message by time, pages both ways, shows data as text, JSON or hex, the live
tail shows a new message within a second and keeps up with 1,000 messages a second, the
publish form publishes, an admin resets and deletes a consumer, and message data never runs
(XSS payloads are shown as text: no dialog, no request they name)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from playwright.async_api import FilePayload, expect

from tests.conftest import BrokerProcess
from tests.console.conftest import (
    ConsolePage,
    create_stream,
    heartbeat,
    publish,
    request,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOPIC = 3
JSON_TOPIC = 4
BINARY_TOPIC = 5
XSS_TOPIC = 6
#: Payloads that would run script if inserted as HTML.
XSS = ["<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>",
       "<svg onload=alert(3)>", '"><iframe src="javascript:alert(4)">']


@dataclass
class Seeded:
    """The module's broker and what it holds."""

    process: BrokerProcess
    #: (index, when it was appended: ms since the epoch) of the first messages of TOPIC.
    timed: list[tuple[int, int]]

    @property
    def url(self) -> str:
        return self.process.url


@pytest.fixture(scope="module")
def seeded(broker: BrokerProcess) -> Iterator[Seeded]:
    """Text, JSON, binary and XSS messages, a stream and a consumer."""
    indexes = []
    for i in range(5):  # five messages apart in time (its steps are 100 ms), to find by time
        indexes.append(publish(broker.url, TOPIC, f"timed message {i}"))
        time.sleep(0.25)
    # When the broker appended each (its clock, not this process's).
    status, _h, body = request(broker.url, "/messaging/times",
                               params={"topicID": TOPIC, "index": indexes[0]})
    runs = json.loads(body)["runs"]
    timed = [(index, [at for start, at in runs if start <= index][-1]) for index in indexes]
    assert len({at for _index, at in timed}) == 5, runs
    for i in range(120):
        publish(broker.url, TOPIC, f"message {i}")
    publish(broker.url, JSON_TOPIC, '{"user": "ada", "n": [1, 2, 3]}', type_=7)
    publish(broker.url, BINARY_TOPIC, bytes(range(0, 40)))
    for payload in XSS:
        publish(broker.url, XSS_TOPIC, payload)
    create_stream(broker.url, "chat")
    status, _h, text = request(broker.url, "/v1/stream/chat", method="POST",
                               data=b'{"said": "hi"}',
                               headers={"Content-Type": "application/json"})
    assert status in (200, 204), text
    heartbeat(broker.url, TOPIC, timed[2][0], "reporter")
    heartbeat(broker.url, JSON_TOPIC, 1, "auditor")
    yield Seeded(broker, timed)


async def rows_of(console: ConsolePage, selector: str) -> list[str]:
    return await console.page.locator(selector).all_inner_texts()


async def test_topics_screen_lists_sorts_and_filters(console: ConsolePage,
                                                     seeded: Seeded) -> None:
    await console.open(seeded.url, "topics")
    page = console.page
    await expect(page.locator("#topic-list .vrow[data-topic='3']")).to_be_visible()
    await expect(page.locator("#topic-list .vrow[data-topic='chat']")).to_be_visible()
    await expect(page.locator("#topic-count")).to_have_text("5 of 5")
    row = await page.locator("#topic-list .vrow[data-topic='3']").inner_text()
    assert "B" in row and "1" in row  # size, subscribers
    await page.fill("#topic-filter", "cha")
    await expect(page.locator("#topic-count")).to_have_text("1 of 5")
    await page.fill("#topic-filter", "")
    await page.click("button.sort[data-key='size']")  # largest first
    first = page.locator("#topic-list .vrow").first
    await expect(first).to_have_attribute("data-topic", "3")
    # A topic's row opens its messages.
    await page.click("#topic-list .vrow[data-topic='4']")
    await expect(page.locator("#browse-rows tr")).to_have_count(1)


async def test_the_topics_screen_shows_each_topics_message_count(console: ConsolePage,
                                                                 seeded: Seeded) -> None:
    """Counted, not an index difference: broker indexes are shared by every topic."""
    await console.open(seeded.url, "topics")
    page = console.page
    await expect(page.locator("#topic-list .vrow[data-topic='3']")).to_be_visible()
    await expect(page.locator("button.sort[data-key='count']")).to_be_visible()
    await expect(page.locator("#topic-list .vrow[data-topic='3'] .messages-col")).to_have_text(
        "125")
    await expect(page.locator("#topic-list .vrow[data-topic='6'] .messages-col")).to_have_text(
        str(len(XSS)))


async def test_message_rate_comes_from_successive_polls(console: ConsolePage,
                                                        seeded: Seeded) -> None:
    await console.open(seeded.url, "topics")
    page = console.page
    await expect(page.locator("#topic-list .vrow[data-topic='9']")).to_have_count(0)
    publish(seeded.url, 9, "first")
    await expect(page.locator("#topic-list .vrow[data-topic='9']")).to_be_visible(timeout=5000)
    spark = page.locator("#topic-list .vrow[data-topic='9'] svg.spark polyline")
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not await spark.count():  # about 100 msg/s
            await asyncio.gather(*(_post(http, f"{seeded.url}/messaging/messages?topicID=9")
                                   for _ in range(10)))
            await asyncio.sleep(0.1)
    assert await spark.count() == 1  # two polls' rates drawn
    text = await page.locator("#topic-list .vrow[data-topic='9'] .rate").inner_text()
    assert float(text.lstrip("≤").replace(",", "")) > 0, text


async def _post(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(url, data=b"x") as resp:
        assert resp.status == 200


async def test_the_browser_finds_a_message_by_time(console: ConsolePage, seeded: Seeded) -> None:
    page = console.page
    await console.open(seeded.url, f"messages?topic={TOPIC}")
    for index, before in seeded.timed[1:4]:
        await page.select_option("#browse-mode", "since")
        await page.fill("#browse-from", str(before))
        await page.fill("#browse-limit", "2")
        await page.click("#browse-load")
        rows = page.locator("#browse-rows tr")
        await expect(rows.first).to_have_attribute("data-index", str(index))
        assert "timed message" in await rows.first.inner_text()
    # An RFC 3339 time works too.
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seeded.timed[0][1] / 1000 - 1)) + "Z"
    await page.fill("#browse-from", iso)
    await page.click("#browse-load")
    await expect(page.locator("#browse-rows tr").first).to_have_attribute(
        "data-index", str(seeded.timed[0][0]))


async def test_the_browser_pages_both_ways(console: ConsolePage, seeded: Seeded) -> None:
    page = console.page
    await console.open(seeded.url, f"messages?topic={TOPIC}")
    rows = page.locator("#browse-rows tr")
    await expect(rows).to_have_count(50)
    assert "message 119" in await rows.last.inner_text()
    last_page = await page.locator("#browse-rows tr td:first-child").all_inner_texts()
    await page.click("#browse-older")
    await expect(rows.last).to_contain_text("message 69")
    older = await page.locator("#browse-rows tr td:first-child").all_inner_texts()
    assert len(older) == 50 and int(older[-1]) < int(last_page[0])
    await page.click("#browse-older")
    await page.click("#browse-older")  # at the start: 25 messages, then nothing older
    await expect(rows.first).to_contain_text("timed message 0")
    await page.click("#browse-older")
    await expect(page.locator("#browse-status")).to_contain_text("oldest")
    await page.click("#browse-newer")
    await expect(rows.first).to_contain_text("message 20")
    # From an index, with a limit the user sets.
    await page.select_option("#browse-mode", "index")
    await page.fill("#browse-from", older[0])
    await page.fill("#browse-limit", "3")
    await page.click("#browse-load")
    await expect(rows).to_have_count(3)
    await expect(rows.first).to_have_attribute("data-index", older[0])


async def test_data_is_shown_as_text_json_or_hex(console: ConsolePage, seeded: Seeded) -> None:
    page = console.page
    await console.open(seeded.url, f"messages?topic={JSON_TOPIC}")
    row = page.locator("#browse-rows tr").first
    await expect(row.locator("select.format")).to_have_value("json")
    assert '"user": "ada"' in await row.locator("pre").inner_text()
    assert (await row.locator("td").nth(2).inner_text()) == "7"  # the type
    await row.locator("select.format").select_option("hex")
    await expect(row.locator("pre")).to_contain_text("7b 22 75 73")
    await page.fill("#browse-topic", str(BINARY_TOPIC))
    await page.click("#browse-load")
    await expect(row.locator("select.format")).to_have_value("hex")
    await expect(row.locator("pre")).to_contain_text("00 01 02 03")
    await page.fill("#browse-topic", "chat")  # a stream, by its name
    await page.click("#browse-load")
    await expect(row.locator("pre")).to_contain_text('"said": "hi"')


async def open_tail(console: ConsolePage, url: str, topic: int) -> None:
    """Open the live tail of ``topic`` and wait until its stream is answered: its start
    ("now") is fixed at the broker then, so what is published after it is shown (the page
    says "Following" as the request leaves, before that)."""
    async with console.page.expect_response(lambda answer: "format=sse" in answer.url):
        await console.open(url, f"tail?topic={topic}")
    await expect(console.page.locator("#tail-status")).to_contain_text("Following")


async def test_xss_payloads_run_nothing(console: ConsolePage, seeded: Seeded) -> None:
    """Payloads are shown as the characters they are, on every screen that shows data."""
    page = console.page
    await console.open(seeded.url, f"messages?topic={XSS_TOPIC}")
    shown = page.locator("#browse-rows pre")
    await expect(shown).to_have_count(len(XSS))
    assert await shown.all_inner_texts() == XSS
    await open_tail(console, seeded.url, XSS_TOPIC)
    for payload in XSS:
        publish(seeded.url, XSS_TOPIC, payload)
    await expect(page.locator("#tail-rows pre")).to_have_count(len(XSS))
    assert sorted(await page.locator("#tail-rows pre").all_inner_texts()) == sorted(XSS)
    await page.wait_for_timeout(300)  # give an injected handler time to fire
    assert console.dialogs == []
    assert not [r.url for r in console.requests if r.url.rstrip("/").endswith("/x")
                or "javascript:" in r.url]
    assert await page.locator("main img, main iframe, main svg[onload]").count() == 0


async def test_live_tail_shows_a_new_message_within_a_second(console: ConsolePage,
                                                             seeded: Seeded) -> None:
    page = console.page
    await open_tail(console, seeded.url, TOPIC)
    started = time.monotonic()
    index = publish(seeded.url, TOPIC, "fresh from the tail test")
    await expect(page.locator(f"#tail-rows tr[data-index='{index}']")).to_contain_text(
        "fresh from the tail test", timeout=1000)
    assert time.monotonic() - started < 1.0
    # Paused, nothing is drawn; resumed, it reads on from where it paused.
    await page.click("#tail-pause")
    await expect(page.locator("#tail-status")).to_contain_text("Paused")
    during = publish(seeded.url, TOPIC, "published during the pause")
    await page.wait_for_timeout(200)
    assert await page.locator(f"#tail-rows tr[data-index='{during}']").count() == 0
    await page.click("#tail-pause")
    await expect(page.locator(f"#tail-rows tr[data-index='{during}']")).to_be_visible()


async def test_live_tail_keeps_up_with_a_thousand_messages_a_second(
        console: ConsolePage, seeded: Seeded) -> None:
    """Three seconds at 1,000 msg/s: every message is counted, the rows kept stay capped,
    and the page answers promptly all along (its event loop is never frozen)."""
    page = console.page
    await open_tail(console, seeded.url, 20)
    seconds, rate = 3, 1000
    slowest = 0.0

    async def load(http: aiohttp.ClientSession) -> None:
        start = time.monotonic()
        for tick in range(seconds * 20):  # 50 messages every 50 ms, as one batch of frames
            from messaging.frames import FRAMES_CONTENT_TYPE, Message, encode_many
            body = encode_many(Message(0, 1, 20, f"load {tick}:{i}".encode())
                               for i in range(rate // 20))
            async with http.post(f"{seeded.url}/messaging/messages", data=body,
                                 headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
                assert resp.status == 200
            await asyncio.sleep(max(0.0, start + (tick + 1) * 0.05 - time.monotonic()))

    async def probe() -> None:
        nonlocal slowest
        for _ in range(seconds * 10):
            before = time.monotonic()
            await page.evaluate("() => new Promise(r => requestAnimationFrame(() => r(1)))")
            slowest = max(slowest, time.monotonic() - before)
            await asyncio.sleep(0.1)

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(load(http), probe())
    total = seconds * rate
    await expect(page.locator("#tail-count")).to_contain_text(f"{total:,} received",
                                                              timeout=5000)
    assert await page.locator("#tail-rows tr").count() <= 500
    assert slowest < 1.0, f"a frame took {slowest:.3f} s under load"
    print(f"\nlive tail at {rate} msg/s: slowest frame round trip {slowest * 1000:.0f} ms")


async def test_publish_form_publishes_text_and_json(console: ConsolePage,
                                                    seeded: Seeded) -> None:
    page = console.page
    await console.open(seeded.url, "publish")
    await page.fill("#publish-topic", "30")
    await page.fill("#publish-data", "typed in the console")
    await page.click("#publish-send")
    await expect(page.locator("#publish-status")).to_contain_text("Published to topic 30")
    status, _h, body = request(seeded.url, "/messaging/messages", params={"topicID": 30})
    assert status == 200 and body.endswith(b"typed in the console")
    await page.fill("#publish-topic", "chat")
    await page.select_option("#publish-kind", "json")
    await page.fill("#publish-data", "{not json")
    await page.click("#publish-send")
    await expect(page.locator("#publish-status")).to_contain_text("not JSON")
    await page.fill("#publish-data", '{"from": "console"}')
    await page.click("#publish-send")
    await expect(page.locator("#publish-status")).to_contain_text("Appended to stream chat")
    await page.select_option("#publish-kind", "file")
    await page.fill("#publish-topic", "31")
    blob: FilePayload = {"name": "blob.bin", "mimeType": "application/octet-stream",
                         "buffer": b"\x00\x01file"}
    await page.set_input_files("#publish-file", files=[blob])
    await page.click("#publish-send")
    await expect(page.locator("#publish-status")).to_contain_text("Published to topic 31")
    status, _h, body = request(seeded.url, "/messaging/messages", params={"topicID": 31})
    assert body.endswith(b"\x00\x01file")


async def test_consumers_sorted_by_lag_reset_and_deleted(console: ConsolePage,
                                                         seeded: Seeded) -> None:
    page = console.page
    publish(seeded.url, 41, "one")
    heartbeat(seeded.url, 41, 1, "to-delete")
    await console.open(seeded.url, "consumers")
    rows = page.locator("#consumer-rows tr")
    await expect(rows.first).to_have_attribute("data-consumer", "reporter")  # most behind
    reporter = await page.locator("#consumer-rows tr[data-consumer='reporter']").inner_text()
    assert "yes" in reporter
    target = page.locator("#consumer-rows tr[data-consumer='reporter']")
    await target.locator("input").fill(str(seeded.timed[4][0]))
    await target.locator("button", has_text="Reset").click()
    await expect(page.locator("#consumers-status")).to_contain_text("Reset reporter")
    doomed = page.locator("#consumer-rows tr[data-consumer='to-delete']")
    await doomed.locator("button.danger").click()
    await doomed.locator("button.danger", has_text="Confirm delete").click()
    await expect(page.locator("#consumer-rows tr[data-consumer='to-delete']")).to_have_count(0)
    _status, _h, body = request(seeded.url, "/messaging/consumers", params={"name": "reporter"})
    assert f'"index": {seeded.timed[4][0]}' in body.decode()


async def test_cluster_screen_shows_the_node(console: ConsolePage, seeded: Seeded) -> None:
    page = console.page
    await console.open(seeded.url, "cluster")
    await expect(page.locator("#readiness")).to_have_text("ready: writable")  # no quorum
    text = await page.locator("#cluster").inner_text()
    for expected in ("version", "fsync", "always", "disk free", "standalone", seeded.url):
        assert expected in text, expected
