"""Quorum reads gathered into one etcd request, against real etcd members: the reads asked
for in one turn of the loop go as one read-only transaction and each gets its key's answer;
an etcd that cannot be reached fails every read that waited."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from messaging.config import EtcdSettings
from messaging.errors import ClusterUnavailableError
from messaging.log.etcd.client import EtcdClient
from messaging.log.etcd.quorum_reads import QuorumReads, aligned_sleep
from tests.conftest import free_port
from tests.e2e.test_etcd_log import EtcdCluster, serving


@pytest.fixture(scope="module")
def one_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member of its own for the module."""
    yield from serving(EtcdCluster(tmp_path_factory.mktemp("etcd-quorum"), size=1))


async def test_reads_asked_together_go_as_one_request(one_member: EtcdCluster) -> None:
    url = one_member.members[0].client_url
    client = EtcdClient(EtcdSettings(endpoints=(url,), cluster="quorum"))
    reads = QuorumReads(client)
    keys = [f"/quorum/{uuid.uuid4().hex}/{k}".encode() for k in range(5)]
    try:
        written = {key: await client.put(key, b"x") for key in keys[:4]}  # the 5th: absent
        responses = await asyncio.gather(*(reads.read(key) for key in [*keys, keys[0]]))
        assert (reads.requests, reads.keys_read) == (1, 5)  # keys[0] asked twice, read once
        head = responses[0].header.revision
        assert head >= max(written.values())
        for key, response in zip([*keys, keys[0]], responses, strict=True):
            assert response.header.revision == head  # one read, at one revision
            assert [kv.mod_revision for kv in response.kvs] == (
                [written[key]] if key in written else [])
            assert all(kv.value == b"" for kv in response.kvs)  # keys only
        alone = await reads.read(keys[1])  # asked alone: a plain range read
        assert (reads.requests, alone.kvs[0].mod_revision) == (2, written[keys[1]])
    finally:
        await reads.close()
        await client.close()


async def test_an_unreachable_etcd_fails_every_read_that_waited() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient(EtcdSettings(endpoints=(url,), cluster="quorum"))
    reads = QuorumReads(client)
    try:
        results = await asyncio.wait_for(asyncio.gather(
            *(reads.read(b"/quorum/%d" % k) for k in range(3)), return_exceptions=True), 10)
        assert reads.requests == 1
        assert all(isinstance(r, ClusterUnavailableError) for r in results), results
    finally:
        await reads.close()
        await client.close()


async def test_aligned_sleeps_end_in_one_turn_of_the_loop() -> None:
    loop = asyncio.get_running_loop()
    ends: list[float] = []

    async def step(offset: float) -> None:
        await asyncio.sleep(offset)
        await aligned_sleep(0.2)
        ends.append(loop.time())

    await aligned_sleep(0.2)  # then each starts at another moment before the next multiple
    await asyncio.wait_for(asyncio.gather(*(step(k * 0.03) for k in range(4))), 5)
    assert max(ends) - min(ends) < 0.02
    assert all(abs(t - round(t / 0.2) * 0.2) < 0.02 for t in ends)
