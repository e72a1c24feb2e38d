"""What a node's logs in one etcd cluster share, against a real etcd member: quorum reads
gathered into one request (the reads asked for in one turn of the loop go as one read-only
transaction and each gets its key's answer; an etcd that cannot be reached fails every read
that waited), and one lease for their registrations (kept alive once, left one by one,
replaced for all when it expired)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from messaging.config import EtcdSettings
from messaging.errors import ClusterUnavailableError
from messaging.log.etcd.client import EtcdClient
from messaging.log.etcd.membership import KEEP_EVERY, Membership, nodes_prefix
from messaging.log.etcd.quorum_reads import MAX_READS, QuorumReads, aligned_sleep
from messaging.log.etcd.share import EtcdShare
from tests.conftest import free_port
from tests.e2e.test_etcd_log import EtcdCluster, serving


@pytest.fixture(scope="module")
def one_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member of its own for the module."""
    yield from serving(EtcdCluster(tmp_path_factory.mktemp("etcd-share"), size=1))


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


async def test_more_reads_than_a_transaction_takes_go_in_several(
        one_member: EtcdCluster) -> None:
    """etcd refuses a transaction of more than --max-txn-ops (128) operations: 150 reads
    asked together go as three requests of at most MAX_READS, and each gets its answer."""
    url = one_member.members[0].client_url
    client = EtcdClient(EtcdSettings(endpoints=(url,), cluster="quorum"))
    reads = QuorumReads(client)
    keys = [f"/quorum/{uuid.uuid4().hex}/{k:03d}".encode() for k in range(150)]
    try:
        written = await client.put(keys[77], b"x")
        responses = await asyncio.gather(*(reads.read(key) for key in keys))
        assert (reads.requests, reads.keys_read) == (-(-150 // MAX_READS), 150)
        assert [r.kvs[0].mod_revision for r in responses if r.kvs] == [written]
        assert responses[77].kvs and responses[77].kvs[0].key == keys[77]
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
    assert all(abs(t - round(t / 0.2) * 0.2) < 0.1 for t in ends)  # a loaded loop is late


async def test_logs_sharing_a_lease_keep_it_alive_once_and_leave_alone(
        one_member: EtcdCluster) -> None:
    """Two logs' memberships on one shared lease: both registrations are under it, it is kept
    alive once however many step together, one leaving deletes only its own registration, and
    revoking the lease takes the rest."""
    share, clusters, members = _two_logs(one_member)
    client = share.client
    try:
        await asyncio.gather(*(m.register() for m in members))
        assert (share.lease.grants, share.lease.keep_alives) == (1, 0)
        for _ in range(3):
            await asyncio.sleep(KEEP_EVERY)
            await asyncio.gather(*(m.register() for m in members))
        assert share.lease.grants == 1 and share.lease.keep_alives == 3
        leases = [await _lease_of(client, nodes_prefix(c) + b"http://node") for c in clusters]
        assert leases == [share.lease.id] * 2
        await asyncio.gather(*(m.refresh() for m in members))  # the node lists: one read
        assert share.quorum.requests == 1 and all(m.nodes for m in members)
        await members[0].leave()
        assert await _lease_of(client, nodes_prefix(clusters[0]) + b"http://node") is None
        assert await _lease_of(client, nodes_prefix(clusters[1]) + b"http://node") == leases[1]
        await share.close()
        assert await _lease_of(client, nodes_prefix(clusters[1]) + b"http://node") is None
    finally:
        await share.close()
        await client.close()


async def test_an_expired_shared_lease_is_replaced_and_every_log_registers_again(
        one_member: EtcdCluster) -> None:
    share, clusters, members = _two_logs(one_member)
    client = share.client
    try:
        await asyncio.gather(*(m.register() for m in members))
        old = share.lease.id
        await client.revoke_lease(old)  # as etcd does once a lease's TTL passed unrenewed
        await asyncio.sleep(KEEP_EVERY)
        await asyncio.gather(*(m.register() for m in members))
        assert share.lease.id not in (0, old) and share.lease.grants == 2
        for cluster in clusters:
            assert await _lease_of(client, nodes_prefix(cluster) + b"http://node") == (
                share.lease.id)
    finally:
        await share.close()
        await client.close()


async def test_a_registration_that_could_not_be_deleted_goes_at_the_next_renewal(
        one_member: EtcdCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log leaving while etcd refuses its delete: its registration is deleted again at the
    shared lease's next renewal (else the node's other logs would keep it, and its durable
    revision would pin compaction, for as long as the node runs)."""
    async with _one_left_behind(one_member, monkeypatch) as (share, clusters, members):
        client = share.client
        gone = nodes_prefix(clusters[0]) + b"http://node"
        assert await _lease_of(client, gone) == share.lease.id  # still there
        await asyncio.sleep(KEEP_EVERY)
        await members[1].register()  # the other log's step renews the lease
        assert await _lease_of(client, gone) is None
        assert await _lease_of(client, nodes_prefix(clusters[1]) + b"http://node") == (
            share.lease.id)


async def test_a_group_back_on_its_node_keeps_a_registration_once_left_behind(
        one_member: EtcdCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group whose delete failed when it left, and which came back to the node before the
    lease's next renewal: its new registration is not the one deleted then."""
    async with _one_left_behind(one_member, monkeypatch) as (share, clusters, members):
        client = share.client
        key = nodes_prefix(clusters[0]) + b"http://node"
        back = Membership(client, clusters[0], "http://node", lambda: 0, 1 << 62,
                          lease=share.lease, reads=share.quorum)
        await back.register()  # within KEEP_EVERY of the last renewal: put at once
        assert await _lease_of(client, key) == share.lease.id
        await asyncio.sleep(KEEP_EVERY)
        await members[1].register()  # renews the lease: what was left behind goes
        assert await _lease_of(client, key) == share.lease.id  # but not the group back


async def _leave_while_deletes_fail(member: Membership,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``member`` leaves while etcd refuses every delete (then deletes work again)."""
    async def refused(key: bytes) -> None:
        raise ClusterUnavailableError("etcd has no quorum (the test's)")

    with monkeypatch.context() as patch:
        patch.setattr(member.client, "delete", refused)
        with pytest.raises(ClusterUnavailableError):
            await member.leave()


@contextlib.asynccontextmanager
async def _one_left_behind(member: EtcdCluster, monkeypatch: pytest.MonkeyPatch,
                           ) -> AsyncIterator[tuple[EtcdShare, list[str], list[Membership]]]:
    """:func:`_two_logs`, both registered, then the first one left while etcd refused its
    delete (its registration stays, on the shared lease); closed afterwards."""
    share, clusters, members = _two_logs(member)
    try:
        await asyncio.gather(*(m.register() for m in members))
        await _leave_while_deletes_fail(members[0], monkeypatch)
        yield share, clusters, members
    finally:
        await share.close()
        await share.client.close()


def _two_logs(member: EtcdCluster) -> tuple[EtcdShare, list[str], list[Membership]]:
    """A share on the member and the memberships of one node in two clusters' logs on it
    (the caller closes the share and its client)."""
    url = member.members[0].client_url
    client = EtcdClient(EtcdSettings(endpoints=(url,), cluster="lease"))
    share = EtcdShare.over(client, [url])
    clusters = [f"lease{uuid.uuid4().hex[:8]}x{k}" for k in range(2)]
    members = [Membership(client, cluster, "http://node", lambda: 0, 1 << 62,
                          lease=share.lease, reads=share.quorum) for cluster in clusters]
    return share, clusters, members


async def _lease_of(client: EtcdClient, key: bytes) -> int | None:
    """The lease ``key`` is bound to (None: no such key)."""
    response = await client.get(key)
    return int(response.kvs[0].lease) if response.kvs else None


async def test_a_renewal_cancelled_before_it_ran_leaves_the_lease_usable(
        one_member: EtcdCluster) -> None:
    """A renewal revoked before it ran: the next one starts afresh (it had kept answering
    CancelledError), and one that failed with nobody waiting is not left unretrieved."""
    share, _clusters, _members = _two_logs(one_member)
    client = share.client
    try:
        first = asyncio.create_task(share.lease.current())
        await asyncio.sleep(0)  # the renewal task exists, not yet run
        await share.lease.revoke()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await share.lease.current() > 0
    finally:
        await share.close()
        await client.close()
