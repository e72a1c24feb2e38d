"""Topic management end to end: a 3-node etcd cluster where topic create, config and delete
through one node are seen on all three and survive a node's kill -9 and restart (it replays
the log from its checkpoint), and ``messaging topic create|config|describe|delete`` as a
subprocess against a single broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from messaging.client.client import Client
from messaging.errors import MessagingError
from tests.conftest import cli, wait_until
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    EtcdCluster,
    Nodes,
    etcd,
    etcd_cluster,
    groups,
    with_groups,
)

CONFIGURED, DELETED, OTHER = 11, 12, 13


async def _view(url: str, topic: int) -> dict[str, Any] | int:
    """A node's description of ``topic``: its settings' values and last index, or the error
    status it answers."""
    async with Client(url, retry_timeout=5) as client:
        try:
            answer = await client.describe_topic(topic)
        except MessagingError as err:
            return err.status
    return {"last_index": answer["last_index"],
            **{key: shown["value"] for key, shown in answer["settings"].items()}}


@with_groups
async def test_topic_commands_reach_every_node_and_survive_a_restart(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:  # noqa: F811
    nodes = Nodes(broker_process, tmp_path, etcd)
    await nodes.start(0, 1, 2)
    a, b, c = nodes.urls
    async with Client(a) as client:
        await client.create_topic(CONFIGURED, max_segment_size="4K", max_message_size=100)
        await client.create_topic(DELETED, max_topic_size="1M")
        await client.publish(OTHER, b"other")
        try:
            await client.publish(CONFIGURED, b"x" * 101)
        except MessagingError as err:
            assert err.status == 413 and "max-message-size of 100" in str(err)
        else:
            raise AssertionError("a message over the topic's max-message-size was taken")
    kept = Client(b)  # idempotent: its producer lane on DELETED outlives the deletion
    async with kept as client:
        for n in range(3):
            await client.publish(CONFIGURED, b"m%d" % n)
            await client.publish(DELETED, b"d%d" % n)
        await client.heartbeat(DELETED, 2, "reader")
        await client.configure_topic(CONFIGURED, max_message_size=None, max_topic_size="2M")
        for seq in range(2):
            await client.publish_as(DELETED, [b"j%d" % seq], ("journal", 2, seq))
        assert (await client.publish_as(DELETED, [b"j1"], ("journal", 2, 1))).duplicate
    async with Client(c) as client:
        await client.delete_topic(DELETED)
    settings = {"max-topic-size": 2 << 20, "retention-age": None, "max-segment-size": 4096,
                "max-message-size": 1 << 20}

    async def agree() -> bool:
        views = [[await _view(url, topic) for topic in (CONFIGURED, DELETED, OTHER)]
                 for url in nodes.urls]
        configured = views[0][0]
        return (all(view == views[0] for view in views) and views[0][1] == 410
                and isinstance(configured, dict) and configured["last_index"] > 0
                and {k: v for k, v in configured.items() if k != "last_index"} == settings)

    await wait_until(agree, timeout=30, what="every node to hold the same topics")
    async with Client(a) as client:
        assert [r for r in await client.consumers() if r["topic"] == DELETED] == []
    nodes.kill(2)
    await nodes.start(2)  # replays the log from its checkpoint: the deletion included
    await wait_until(agree, timeout=60, what="the restarted node to hold the same topics")
    async with Client(nodes.url(2)) as client:
        index = await client.publish(DELETED, b"again")  # created again, on every node
        assert [m.data for m in await client.read(DELETED)] == [b"again"]
        # The deletion took the topic's producers with it, on every node and in the
        # restarted node's replay: the request taken before it is not a duplicate now, and
        # an older epoch than the forgotten one is not fenced.
        try:
            await client.publish_as(DELETED, [b"j1"], ("journal", 2, 1))
        except MessagingError as err:
            assert err.status == 409 and "new here" in str(err)
        else:
            raise AssertionError("a producer of the deleted topic was still known")
        restarted = await client.publish_as(DELETED, [b"j0"], ("journal", 1, 0))
        assert not restarted.duplicate and restarted.first > index
    async with kept as client:  # its lane was forgotten: it starts a new epoch by itself
        again = await client.publish(DELETED, b"kept")
    async with Client(nodes.url(0)) as client:
        assert [m.data for m in await client.read(DELETED)] == [b"again", b"j0", b"kept"]
        index = again
    for url in nodes.urls:
        async def recreated(url: str = url) -> bool:
            return await _view(url, DELETED) == {
                "last_index": index, "max-topic-size": 1 << 30, "retention-age": None,
                "max-segment-size": 10 << 20, "max-message-size": 1 << 20}

        await wait_until(recreated, timeout=30, what=f"{url} to hold topic {DELETED} again")


def test_the_topic_cli_against_one_broker(broker_process, tmp_path: Path) -> None:
    broker = broker_process(tmp_path / "data").start()
    url = broker.url

    def run(*args: str) -> tuple[int, str, str]:
        done = cli("topic", *args, timeout=30)
        return done.returncode, done.stdout, done.stderr

    code, out, err = run("create", url, "9", "--max-topic-size", "1G", "--max-message-size",
                         "1K")
    assert code == 0, err
    assert "max-topic-size" in out and "1G  topic" in out and "1K  topic" in out
    code, out, err = run("config", url, "10", "--max-topic-size", "1G")  # a typo
    assert (code, out) == (1, "") and "messaging topic create makes one" in err, err
    code, out, err = run("config", url, "9", "--reset", "max-topic-size", "--format", "json")
    assert code == 0, err
    settings = json.loads(out)["settings"]
    assert settings["max-topic-size"]["source"] == "default"
    assert settings["max-message-size"] == {"value": 1024, "source": "topic"}
    code, out, err = run("describe", url, "9")
    assert code == 0 and "10M  default" in out and "1K  topic" in out, (out, err)
    code, out, err = run("config", url, "9", "--max-topic-size", "lots")
    assert code == 2 and "invalid size" in err
    code, out, err = run("delete", url, "9")
    assert (code, out.strip()) == (0, "deleted topic 9"), err
    code, out, err = run("describe", url, "9")
    assert code == 1 and err.strip() == "messaging: topic 9 was deleted (at index 1)"
    code, out, err = run("delete", url, "10")
    assert code == 1 and err.strip() == "messaging: topic 10 not found"
