"""Screenshots of the console's screens for the README (docs/console-*.png).

Starts a broker on a free port on 127.0.0.1 with some data, opens each screen in Debian's
chromium through playwright and saves a PNG of it::

    PYTHONPATH=. .venv/bin/python docs/screenshots.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import BrokerProcess
from tests.console.conftest import (
    CHROMIUM,
    create_stream,
    heartbeat,
    publish,
    request,
)

HERE = Path(__file__).parent
SCREENS = {"topics": "topics", "messages": "messages?topic=3", "tail": "tail?topic=3",
           "publish": "publish", "consumers": "consumers", "cluster": "cluster"}


def seed(url: str) -> None:
    """Topics, a stream and consumers worth looking at."""
    for i in range(40):
        publish(url, 3, json.dumps({"order": i, "item": "tea", "qty": i % 4 + 1}))
    for topic in range(4, 12):
        for i in range(topic):
            publish(url, topic, f"event {i} of topic {topic}")
    publish(url, 12, bytes(range(64)))
    create_stream(url, "chat/room-1")
    request(url, "/v1/stream/chat/room-1", method="POST", data=b'{"said": "hello"}',
            headers={"Content-Type": "application/json"})
    heartbeat(url, 3, 20, "billing")
    heartbeat(url, 3, 40, "shipping")
    heartbeat(url, 5, 1, "audit")


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        broker = BrokerProcess(Path(folder) / "data").start()
        try:
            seed(broker.url)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                                     args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 640})
                for name, screen in SCREENS.items():
                    page.goto(f"{broker.url}/console/#/{screen}")
                    page.wait_for_selector("main section")
                    if name == "tail":
                        page.wait_for_selector("#tail-status:has-text('Following')")
                        for i in range(5):
                            publish(broker.url, 3, json.dumps({"order": 40 + i, "live": True}))
                            time.sleep(0.05)
                        page.wait_for_selector("#tail-rows tr >> nth=4")
                    if name == "publish":
                        page.fill("#publish-topic", "3")
                        page.fill("#publish-data", '{"order": 99}')
                        page.select_option("#publish-kind", "json")
                    page.wait_for_timeout(2500 if name == "topics" else 600)
                    page.screenshot(path=str(HERE / f"console-{name}.png"))
                    print(f"docs/console-{name}.png")
                browser.close()
        finally:
            broker.kill()


if __name__ == "__main__":
    main()
