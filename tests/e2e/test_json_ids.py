"""Stream ids through the readers that parse JSON numbers as doubles: a broker process with a
named stream, its ``/messaging/topics`` parsed by JavaScript (``node -e``, JSON.parse) and by
``jq``, the id read back through ``GET /messaging/messages?topicID=<that id>``: the stream's
data comes back, not a rounded id's 404. The Python client reads the same answer as ints."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from messaging.client import Client
from messaging.frames import decode
from messaging.placement import NAMED_TOPIC_BASE
from tests.conftest import BrokerProcess

pytestmark = pytest.mark.e2e

#: Fetch the topics, find the stream by name, read it back by the id JSON.parse gave, decode
#: the first frame's header by hand; print what it found as JSON.
NODE_SCRIPT = r"""
const url = process.argv[1];
(async () => {
  const topics = JSON.parse(await (await fetch(`${url}/messaging/topics`)).text());
  const row = topics.find((t) => t.name === "orders");
  const read = await fetch(`${url}/messaging/messages?topicID=${encodeURIComponent(row.id)}`);
  const body = new DataView(await read.arrayBuffer());
  const length = body.getUint32(22);
  const data = new TextDecoder().decode(new Uint8Array(body.buffer, 26, length));
  console.log(JSON.stringify({id: row.id, idType: typeof row.id, status: read.status,
                              frameTopic: body.getBigUint64(14).toString(), data,
                              native: topics.find((t) => t.id === 1) !== undefined}));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def _request(url: str, method: str = "GET", data: bytes | None = None,
             headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as answer:
        body: bytes = answer.read()
        return body


@pytest.fixture
def broker(broker_process: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    """A broker holding the stream ``orders`` (with one append) and native topic 1."""
    broker = broker_process(tmp_path / "data").start()
    text = {"Content-Type": "text/plain"}
    _request(f"{broker.url}/v1/stream/orders", "PUT", b"", text)
    _request(f"{broker.url}/v1/stream/orders", "POST", b"first order", text)
    _request(f"{broker.url}/messaging/messages?topicID=1", "POST", b"native")
    return broker


def test_javascript_reads_a_stream_id_back_exactly(broker: BrokerProcess) -> None:
    node = shutil.which("node")
    assert node is not None, "Node is on PATH where these tests run"
    done = subprocess.run([node, "-e", NODE_SCRIPT, broker.url], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found == {"id": str(NAMED_TOPIC_BASE), "idType": "string", "status": 200,
                     "frameTopic": str(NAMED_TOPIC_BASE), "data": "first order",
                     "native": True}
    # What the issue saw: the same id as a JSON number comes back rounded.
    script = f"console.log(String(JSON.parse('{NAMED_TOPIC_BASE + 811}')))"
    rounded = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60,
                             check=True)
    assert rounded.stdout.strip() != str(NAMED_TOPIC_BASE + 811)


def test_jq_reads_a_stream_id_back_exactly(broker: BrokerProcess) -> None:
    jq = shutil.which("jq")
    assert jq is not None, "jq is installed where these tests run"
    topics = _request(f"{broker.url}/messaging/topics")
    done = subprocess.run([jq, "-r", '.[] | select(.name == "orders") | .id'], input=topics,
                          capture_output=True, timeout=60, check=True)
    stream_id = done.stdout.decode().strip()
    assert stream_id == str(NAMED_TOPIC_BASE)
    query = urllib.parse.urlencode({"topicID": stream_id})
    messages, _ = decode(_request(f"{broker.url}/messaging/messages?{query}"))
    assert [(m.topic, m.data) for m in messages] == [(NAMED_TOPIC_BASE, b"first order")]


def test_the_python_client_reads_ids_as_ints(broker: BrokerProcess) -> None:
    async def topics() -> list[dict[str, object]]:
        async with Client(broker.url) as client:
            return await client.topics()

    rows = {row["id"]: row for row in asyncio.run(topics())}
    assert set(rows) == {1, NAMED_TOPIC_BASE}
    assert rows[NAMED_TOPIC_BASE]["name"] == "orders"
