"""etcd is the write-ahead log of a cluster: a node's files are its applied copy, fsynced in
groups off the publish path, so a power loss of every broker at once loses nothing that was
acknowledged.

Three real broker processes run under ``tests/faultpoint.py`` with ``FAULT_SYNCED``: each
records the size at which every file of its data directory is durable. While publishers keep
them busy, all three are killed at once (SIGKILL), and each data directory is cut back to its
durable sizes (:func:`tests.faultpoint.lose_unsynced`: the unfsynced tails a power loss
takes). Restarted, every node replays etcd's log from its checkpoint; every acknowledged
message is then served by every node, once, in order, and the three nodes' segment files are
byte-identical.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from messaging.client.client import Client
from messaging.errors import MessagingError
from tests.conftest import wait_until
from tests.e2e.test_etcd_log import (  # noqa: F401  (fixtures used by name)
    FAULTPOINT,
    EtcdCluster,
    Nodes,
    etcd,
    etcd_cluster,
)
from tests.faultpoint import lose_unsynced

TOPIC = 41
#: How long the publishers run before the power goes (seconds).
LOAD = 4.0


async def _publish(url: str, sender: int, acknowledged: list[bytes], stop: asyncio.Event,
                   ) -> None:
    """Batches of 20 to one node until ``stop``; every acknowledged message is recorded."""
    async with Client(url, retry_timeout=2) as client:
        for n in range(100_000):
            if stop.is_set():
                return
            batch = [b"s%d-b%d-m%d" % (sender, n, m) for m in range(20)]
            try:
                await client.publish_batch(TOPIC, batch)
            except MessagingError:
                return  # the node is gone: its outcome is unknown, nothing is recorded
            acknowledged.extend(batch)


async def _read_all(url: str) -> list[bytes]:
    """Every message of TOPIC a node serves, in index order."""
    out: list[bytes] = []
    async with Client(url, retry_timeout=10) as client:
        index = 0
        for _ in range(10_000):
            messages = await client.read(TOPIC, index, limit=5000)
            if not messages:
                return out
            out.extend(bytes(m.data) for m in messages)
            index = messages[-1].index + 1
    return out


def _segments(data: Path) -> dict[str, bytes]:
    """The topic's segment files and their time indexes on one node, by name."""
    topic = data / "topics" / str(TOPIC)
    return {p.name: p.read_bytes() for p in sorted(topic.iterdir())
            if p.suffix in (".seg", ".time")}


async def test_a_power_loss_of_every_node_loses_nothing_acknowledged(
        etcd: EtcdCluster, broker_process, tmp_path: Path) -> None:  # noqa: F811
    # Files fsynced only by checkpoints (the periodic sync far away): a power loss then takes
    # everything after the last checkpoint, and what the checkpoint says must be on disk.
    nodes = Nodes(broker_process, tmp_path, etcd, "--cluster-sync-interval", "1h")
    records = [tmp_path / f"synced-{i}" for i in range(3)]
    for i in range(3):
        nodes.data(i).mkdir(parents=True)
        await nodes.start(i, launcher=FAULTPOINT, env={
            "FAULT_ROOT": str(nodes.data(i)), "FAULT_SYNCED": str(records[i])})
    acknowledged: list[bytes] = []
    stop = asyncio.Event()
    senders = [asyncio.create_task(_publish(nodes.url(k % 3), k, acknowledged, stop))
               for k in range(6)]
    await asyncio.sleep(LOAD)
    for pid in [nodes.procs[i].pid for i in range(3)]:  # the power goes: all at once
        os.kill(pid, signal.SIGKILL)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*senders), 30)
    for i in range(3):
        nodes.kill(i)  # reaps the killed process
    assert len(acknowledged) >= 200, "the publishers did not get going"
    lost = [lose_unsynced(nodes.data(i), records[i]) for i in range(3)]
    # A node that had just checkpointed when the power went (or was starved of CPU since its
    # last one) has nothing unfsynced: that is a power loss too. The test proves something
    # as long as one node must replay what it lost.
    assert any(lost), f"nothing was left unfsynced ({lost} bytes): the test proves nothing"
    await nodes.start(0, 1, 2)

    async def caught_up() -> bool:
        for url in nodes.urls:
            async with Client(url, retry_timeout=2) as client:
                try:
                    described = await client.describe_topic(TOPIC)
                except MessagingError:
                    return False
            if described["last_index"] < len(set(acknowledged)):
                return False
        return True

    await wait_until(caught_up, timeout=60, what="every node to replay etcd's log")
    served = [await _read_all(url) for url in nodes.urls]
    assert served[0] == served[1] == served[2]
    assert len(served[0]) == len(set(served[0])), "a message is stored twice"
    position = {data: k for k, data in enumerate(served[0])}
    missing = [m for m in acknowledged if m not in position]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
    for sender in range(6):  # each sender's acknowledged messages in the order it sent them
        mine = [position[m] for m in acknowledged if m.startswith(b"s%d-" % sender)]
        assert mine == sorted(mine)
    for i in range(3):  # stop them cleanly: every node fsyncs and checkpoints
        assert nodes.procs[i].terminate() == 0
    files = [_segments(nodes.data(i)) for i in range(3)]
    assert files[0] and files[0] == files[1] == files[2], "the nodes' segment or time files differ"
