"""Faults of the object store with real processes: a broker killed -9 between upload, record
and local delete; the store stopped mid-upload and mid-read, corrupted, emptied, refusing
the credentials; a broker started while the store is down.

Each test runs broker subprocesses (some under tests/faultpoint.py) against a real SeaweedFS
(tests/objects/conftest.py) on 127.0.0.1, with small segments, a small local retention and a
short truncation interval, and checks that nothing acknowledged is lost, that readers never
see a gap or a repeat, and that what cannot be read is refused with the right status and a
message naming the store and the object.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import obstore
import pytest
from obstore.store import S3Store as ObstoreS3Store

from messaging.frames import decode
from tests.conftest import BrokerProcess, wait_until
from tests.objects.conftest import ACCESS_KEY, BUCKET, SECRET_KEY, SOCKETS, SeaweedFS

pytestmark = pytest.mark.e2e

FAULTPOINT = Path(__file__).resolve().parents[1] / "faultpoint.py"
TOPIC = 7
SEGMENT = 4096
#: Options of every broker here: small segments, a small local retention, fast truncation.
OPTIONS = ("--max-segment-size", str(SEGMENT), "--local-retention-size", str(2 * SEGMENT),
           "--truncation-interval", "200ms", "--object-sweep-grace", "1s")
MakeBroker = Callable[..., BrokerProcess]


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def s3_broker(broker_process: MakeBroker, server: SeaweedFS, prefix: str, data: Path,
              *extra: str, secret: str = SECRET_KEY,
              faults: dict[str, str] | None = None) -> BrokerProcess:
    """A broker process (not started) keeping its segments in ``server`` under ``prefix``
    (``extra``: more options); under tests/faultpoint.py when ``faults`` are given."""
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": secret,
           "AWS_REGION": "us-east-1", **(faults or {})}
    launcher = [sys.executable, str(FAULTPOINT)] if faults else None
    return broker_process(data, "--object-store", f"s3://{BUCKET}/{prefix}",
                          "--s3-endpoint", server.endpoint, *OPTIONS, *extra, env=env,
                          launcher=launcher)


def raw_store(server: SeaweedFS, prefix: str) -> ObstoreS3Store:
    """A plain obstore client on the broker's prefix, to act behind its back."""
    return ObstoreS3Store(BUCKET, prefix=prefix, endpoint=server.endpoint,
                          access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                          region="us-east-1",
                          client_options={"allow_http": True, "timeout": "10s"})


async def listed(store: ObstoreS3Store) -> dict[str, int]:
    """Every object under the prefix: name → size."""
    found: dict[str, int] = {}
    async for page in obstore.list(store, None):
        for meta in page:
            found[meta["path"]] = int(meta["size"])
    return found


def payload(k: int) -> bytes:
    return f"message {k:06d} ".encode() * 8


async def publish(http: aiohttp.ClientSession, url: str, k: int) -> int:
    """Publish message ``k``; its index (acknowledged)."""
    async with http.post(f"{url}/messaging/messages", params={"topicID": str(TOPIC)},
                         data=payload(k)) as resp:
        assert resp.status == 200, (resp.status, await resp.text())
        return int(resp.headers["X-Broker-Index"])


async def publish_many(http: aiohttp.ClientSession, url: str, ks: range,
                       acked: dict[int, bytes]) -> None:
    for k in ks:
        acked[await publish(http, url, k)] = payload(k)


async def read(http: aiohttp.ClientSession, url: str, index: int = 0,
               end: int | None = None) -> tuple[int, dict[str, str], list[tuple[int, bytes]]]:
    """One read from ``index``: status, headers, and the messages of a 200."""
    params = {"topicID": str(TOPIC), "index": str(index)}
    if end is not None:
        params["end"] = str(end)
    async with http.get(f"{url}/messaging/messages", params=params) as resp:
        body = await resp.read()
        headers = dict(resp.headers)
        if resp.status != 200:
            return resp.status, headers, []
    messages, used = decode(body)
    assert used == len(body)
    return 200, headers, [(m.index, bytes(m.data)) for m in messages]


async def read_all(http: aiohttp.ClientSession, url: str, last: int,
                   index: int = 0) -> list[tuple[int, bytes]]:
    """Every message from ``index`` through ``last`` (each read going on after the one
    before), checked to have no repeat."""
    got: list[tuple[int, bytes]] = []
    while not got or got[-1][0] < last:
        status, headers, messages = await read(http, url, index)
        assert status == 200, (status, headers.get("X-Broker-Error"))
        assert messages, f"nothing read from {index} though {last} was acknowledged"
        got.extend(messages)
        index = messages[-1][0] + 1
    indexes = [i for i, _d in got]
    assert indexes == sorted(set(indexes)), "a repeat or a step back"
    return got


async def assert_all_acked(http: aiohttp.ClientSession, url: str,
                           acked: dict[int, bytes]) -> None:
    """Everything acknowledged reads back from index 0, in order, exactly once, no gap."""
    got = await read_all(http, url, max(acked))
    assert [i for i, _d in got] == sorted(acked), "a message lost, repeated or out of order"
    assert [d for _i, d in got] == [acked[i] for i in sorted(acked)]


async def diagnostics(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/messaging/diagnostics") as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


async def topic_info(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    for topic in (await diagnostics(http, url))["topics"]:
        if topic["id"] == TOPIC:
            return dict(topic)
    raise AssertionError(f"topic {TOPIC} not in diagnostics")


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 when absent)."""
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == 200, await resp.text()
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+)(\{[^}]*\})? (\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


async def wait_offloaded(http: aiohttp.ClientSession, url: str, segments: int,
                         timeout: float = 30.0) -> dict[str, Any]:
    """Wait until ``segments`` segments are recorded, none waits, and local retention
    deleted what it will (so that the local first index stays where it is)."""
    async def done() -> bool:
        described = await diagnostics(http, url)
        info = next(t for t in described["topics"] if t["id"] == TOPIC)
        return bool(info["offloaded_segments"] >= segments
                    and info["local_first_index"] > info["first_index"]
                    and described["object_store"]["backlog"]["segments"] == 0
                    and info["size"] <= 3 * SEGMENT)

    await wait_until(done, timeout, f"{segments} segments offloaded and deleted locally")
    return await topic_info(http, url)


async def settled(http: aiohttp.ClientSession, url: str, timeout: float = 10.0,
                  ) -> dict[str, Any]:
    """The topic once local retention has stopped deleting (its first local index the same
    over several truncation passes): a restarted broker was seen to delete, after its
    first offload pass, a recorded segment it had kept before the kill."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    info = await topic_info(http, url)
    while True:
        await asyncio.sleep(1.0)  # five truncation passes
        again = await topic_info(http, url)
        if again["local_first_index"] == info["local_first_index"]:
            return again
        assert loop.time() < deadline, "local retention never settled"
        info = again


async def wait_for_trace(path: Path, what: str, timeout: float = 30.0) -> None:
    """Wait until the fault points recorded a call (a broker holding it)."""
    async def seen() -> bool:
        text = await asyncio.to_thread(lambda: path.read_text() if path.exists() else "")
        return what in text

    await wait_until(seen, timeout, f"{what!r} in {path}")


def restart_seaweedfs(server: SeaweedFS) -> None:
    """Start ``server`` again after it was killed, on the same ports and data directory
    (the fixture's ``start`` picks new ones): its objects are there again."""
    assert server.process is not None and server.process.poll() is not None
    for port in server.ports:  # its Unix sockets, named by its ports (as the fixture does)
        for socket_file in Path(SOCKETS).glob(f"seaweedfs-*-{port}.sock"):
            socket_file.unlink(missing_ok=True)
    args = _WEED_ARGS[id(server)]
    with server.log.open("ab") as log:
        server.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL,
                                          env={**os.environ, "TMPDIR": str(server.scratch)})
    assert server._wait_ready(), server.log.read_text(errors="replace")[-3000:]


_WEED_ARGS: dict[int, list[str]] = {}


def remember_args(server: SeaweedFS) -> None:
    """Note the command line ``server`` runs with (from /proc), to start it again."""
    assert server.process is not None
    raw = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
    _WEED_ARGS[id(server)] = [a.decode() for a in raw.split(b"\0") if a]


def kill_seaweedfs(server: SeaweedFS) -> None:
    """SIGKILL the store (keeping its data directory), by its PID."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


def unique_prefix() -> str:
    return f"faults-{uuid.uuid4().hex[:12]}"


# -- kill -9 at the boundaries of an offload ------------------------------------------------


async def test_kill_between_upload_and_record(broker_process: MakeBroker, seaweedfs: SeaweedFS,
                                              tmp_path: Path, http: aiohttp.ClientSession,
                                              ) -> None:
    """Killed while the journal line recording an uploaded segment waits: after the restart
    the same object is recorded (its conditional PUT finds the same bytes), none is
    duplicated, and every acknowledged message reads back once."""
    prefix, data, arm, trace = unique_prefix(), tmp_path / "data", tmp_path / "arm", \
        tmp_path / "trace"
    broker = s3_broker(broker_process, seaweedfs, prefix, data, faults={
        "FAULT_ROOT": str(data), "FAULT_ARM": str(arm), "FAULT_TRACE": str(trace),
        # Only a line with catalog changes: every publish writes one, without.
        "FAULT_HOLD": "write:catalog.log@changes"}).start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(1), acked)  # the topic exists (journalled)
    arm.touch()
    publishing = asyncio.create_task(publish_many(http, broker.url, range(1, 400), acked))
    try:
        await wait_for_trace(trace, "held write")
        store = raw_store(seaweedfs, prefix)
        uploaded = await listed(store)
        assert uploaded, "the journal write held is not an offload's: nothing is uploaded"
        broker.kill()
        with contextlib.suppress(aiohttp.ClientError):  # a publish in flight is not acked
            await publishing
    finally:
        publishing.cancel()
    arm.unlink()
    assert len(acked) > 20
    restarted = s3_broker(broker_process, seaweedfs, prefix, data).start()
    await wait_offloaded(http, restarted.url, 2)
    await assert_all_acked(http, restarted.url, acked)
    described = (await diagnostics(http, restarted.url))["object_store"]
    assert described["missing_objects"] == []
    after = await listed(store)
    for name, size in uploaded.items():  # the same object, recorded, not a second copy
        assert after.get(name) == size
    ranges = [re.sub(r"-[0-9a-f]{64}", "", n) for n in after]  # topic/first-last.kind
    assert len(ranges) == len(set(ranges)), f"a segment stored twice: {sorted(after)}"
    assert described["orphans_waiting"] == 0


async def test_kill_between_record_and_local_delete(broker_process: MakeBroker,
                                                    seaweedfs: SeaweedFS, tmp_path: Path,
                                                    http: aiohttp.ClientSession) -> None:
    """Killed while local retention deletes a recorded segment: after the restart everything
    reads from index 0 with no gap and no repeat, and local retention goes on."""
    prefix, data, arm, trace = unique_prefix(), tmp_path / "data", tmp_path / "arm", \
        tmp_path / "trace"
    arm.touch()
    broker = s3_broker(broker_process, seaweedfs, prefix, data, faults={
        "FAULT_ROOT": str(data), "FAULT_ARM": str(arm), "FAULT_TRACE": str(trace),
        "FAULT_HOLD": "unlink:.seg"}).start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(300), acked)
    await wait_for_trace(trace, "unlink")
    info = await topic_info(http, broker.url)
    assert info["offloaded_segments"] >= 1
    broker.kill()
    arm.unlink()
    restarted = s3_broker(broker_process, seaweedfs, prefix, data).start()
    await assert_all_acked(http, restarted.url, acked)
    await wait_offloaded(http, restarted.url, 3)
    await publish_many(http, restarted.url, range(300, 350), acked)
    await assert_all_acked(http, restarted.url, acked)


# -- the store stopped ----------------------------------------------------------------------


async def test_store_stopped_mid_upload(broker_process: MakeBroker,
                                        start_seaweedfs: Callable[[], SeaweedFS],
                                        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """With the store down, publishing and local reads go on, nothing unrecorded is deleted
    locally (the disk grows past --local-retention-size), the backlog grows and diagnostics
    say why; once the store is back the backlog drains and everything reads from 0."""
    server = start_seaweedfs()
    remember_args(server)
    prefix = unique_prefix()
    broker = s3_broker(broker_process, server, prefix, tmp_path / "data").start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(150), acked)
    await wait_offloaded(http, broker.url, 2)
    kill_seaweedfs(server)
    before = await topic_info(http, broker.url)
    await publish_many(http, broker.url, range(150, 450), acked)

    async def backlog() -> bool:
        return await metric(http, broker.url, "messaging_offload_backlog_segments") >= 5

    await wait_until(backlog, 20, "a backlog of five segments")
    await asyncio.sleep(1.0)  # a few truncation passes: none may delete an unrecorded segment
    info = await topic_info(http, broker.url)
    assert info["size"] > 2 * SEGMENT * 2, "local retention deleted segments not in the store"
    assert info["offloaded_through"] == before["offloaded_through"]
    # only recorded segments went (those recorded before the store stopped, maybe)
    assert info["local_first_index"] <= before["offloaded_through"] + 1
    described = (await diagnostics(http, broker.url))["object_store"]
    assert described["backlog"]["segments"] >= 5
    assert described["last_error"] and "unreachable" in described["last_error"], described
    assert f"s3://{BUCKET}/{prefix}" in described["last_error"]
    assert await metric(http, broker.url, "messaging_object_store_errors_total",
                        operation="upload", kind="unreachable") >= 1
    local = await read_all(http, broker.url, max(acked), info["local_first_index"])
    assert [d for _i, d in local] == [acked[i] for i in sorted(acked)
                                      if i >= info["local_first_index"]]

    restart_seaweedfs(server)

    async def drained() -> bool:
        return await metric(http, broker.url, "messaging_offload_backlog_segments") == 0 \
            and (await topic_info(http, broker.url))["size"] <= 4 * SEGMENT

    await wait_until(drained, 90, "the backlog drained and local copies deleted")
    await assert_all_acked(http, broker.url, acked)


async def test_store_stopped_mid_read(broker_process: MakeBroker,
                                      start_seaweedfs: Callable[[], SeaweedFS],
                                      tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """A read that needs a store that is down answers 503 with Retry-After, naming the store
    and the object; a read of local segments answers 200."""
    server = start_seaweedfs()
    prefix = unique_prefix()
    broker = s3_broker(broker_process, server, prefix, tmp_path / "data").start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(200), acked)
    info = await wait_offloaded(http, broker.url, 3)
    names = sorted(await listed(raw_store(server, prefix)))
    kill_seaweedfs(server)
    status, headers, messages = await read(http, broker.url, 0)
    assert status == 503, (status, headers.get("X-Broker-Error"))
    assert int(headers["Retry-After"]) >= 1
    error = headers["X-Broker-Error"]
    assert f"s3://{BUCKET}/{prefix}" in error
    assert any(name in error for name in names), error
    assert not messages
    local = await read_all(http, broker.url, max(acked), info["local_first_index"])
    assert [i for i, _d in local] == [i for i in sorted(acked)
                                      if i >= info["local_first_index"]]
    await publish_many(http, broker.url, range(200, 210), acked)  # writes go on


async def test_a_hung_store_is_answered_within_the_timeout(
        broker_process: MakeBroker, start_seaweedfs: Callable[[], SeaweedFS], tmp_path: Path,
        http: aiohttp.ClientSession) -> None:
    """The store takes connections and never answers (SIGSTOP): a read that needs it answers
    503 with Retry-After, naming the store and the object, within --object-store-timeout
    (not the 30 s of the store client's own retries); a streaming read from 0 ends with the
    same error; once the store answers again, every message reads from 0."""
    server = start_seaweedfs()
    assert server.process is not None
    prefix = unique_prefix()
    broker = s3_broker(broker_process, server, prefix, tmp_path / "data",
                       "--object-store-timeout", "2s").start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(200), acked)
    info = await wait_offloaded(http, broker.url, 3)
    names = sorted(await listed(raw_store(server, prefix)))
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        started = asyncio.get_running_loop().time()
        status, headers, messages = await read(http, broker.url, 0)
        took = asyncio.get_running_loop().time() - started
        assert status == 503, (status, headers.get("X-Broker-Error"))
        assert took < 2 + 3, f"the 503 took {took:.1f} s"
        assert int(headers["Retry-After"]) >= 1 and not messages
        error = headers["X-Broker-Error"]
        assert f"s3://{BUCKET}/{prefix}" in error and "no answer in 2 s" in error, error
        assert any(name in error for name in names), error
        async with http.get(f"{broker.url}/messaging/messages",
                            params={"topicID": str(TOPIC), "index": "0",
                                    "streaming": "true"}) as resp:
            assert resp.status == 503, resp.status
            assert "no answer in 2 s" in resp.headers["X-Broker-Error"]
        local = await read_all(http, broker.url, max(acked), info["local_first_index"])
        assert [i for i, _d in local] == [i for i in sorted(acked)
                                          if i >= info["local_first_index"]]
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    await assert_all_acked(http, broker.url, acked)


# -- the store's data harmed ---------------------------------------------------------------


async def test_corrupted_object(broker_process: MakeBroker, seaweedfs: SeaweedFS,
                                tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """An object overwritten with other bytes of the same size: a read that needs it answers
    500 naming it (after a restart empties the cache), and never delivers its frames."""
    prefix, data = unique_prefix(), tmp_path / "data"
    broker = s3_broker(broker_process, seaweedfs, prefix, data).start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(200), acked)
    info = await wait_offloaded(http, broker.url, 3)
    broker.kill()
    store = raw_store(seaweedfs, prefix)
    first = min(name for name in await listed(store) if name.endswith(".seg"))
    original = bytes(await obstore.get_range_async(store, first, start=0,
                                                   end=(await listed(store))[first]))
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF  # inside a frame's data: only its CRC can tell
    await obstore.put_async(store, first, bytes(damaged))
    restarted = s3_broker(broker_process, seaweedfs, prefix, data).start()
    status, headers, messages = await read(http, restarted.url, 0)
    assert status == 500, (status, headers.get("X-Broker-Error"))
    assert first in headers["X-Broker-Error"] and "corrupt" in headers["X-Broker-Error"]
    assert not messages
    local = await read_all(http, restarted.url, max(acked), info["local_first_index"])
    assert [d for _i, d in local] == [acked[i] for i in sorted(acked)
                                      if i >= info["local_first_index"]]
    await obstore.put_async(store, first, original)  # put right: everything reads again
    await assert_all_acked(http, restarted.url, acked)


async def test_bucket_emptied(broker_process: MakeBroker, seaweedfs: SeaweedFS,
                              tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Objects deleted behind the broker's back: reads that need them answer 500 naming the
    object, local reads 200, and after a sweep diagnostics list the missing objects."""
    prefix, data = unique_prefix(), tmp_path / "data"
    broker = s3_broker(broker_process, seaweedfs, prefix, data).start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(200), acked)
    info = await wait_offloaded(http, broker.url, 3)
    store = raw_store(seaweedfs, prefix)
    names = sorted(await listed(store))
    for name in names:
        await obstore.delete_async(store, name)
    status, headers, _messages = await read(http, broker.url, 0)
    assert status == 500, (status, headers.get("X-Broker-Error"))
    assert any(name in headers["X-Broker-Error"] for name in names)
    assert "no such object" in headers["X-Broker-Error"]
    local = await read_all(http, broker.url, max(acked), info["local_first_index"])
    assert [i for i, _d in local] == [i for i in sorted(acked)
                                      if i >= info["local_first_index"]]
    broker.kill()  # a new process sweeps at once (the sweep runs every minute)
    restarted = s3_broker(broker_process, seaweedfs, prefix, data).start()

    async def swept() -> bool:
        described = (await diagnostics(http, restarted.url))["object_store"]
        return described["last_sweep_at"] is not None and bool(described["missing_objects"])

    await wait_until(swept, 20, "a sweep")
    described = (await diagnostics(http, restarted.url))["object_store"]
    recorded = [n for n in names if n in described["missing_objects"]]
    assert recorded and set(described["missing_objects"]) <= set(names), described
    assert await metric(http, restarted.url, "messaging_object_store_missing_objects") >= 1


# -- credentials, and starting without the store -------------------------------------------


async def test_wrong_credential(broker_process: MakeBroker, seaweedfs: SeaweedFS,
                                tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """A broker with a wrong secret: publishing and reads work, nothing is deleted locally,
    and diagnostics and metrics say access is denied."""
    prefix = unique_prefix()
    broker = s3_broker(broker_process, seaweedfs, prefix, tmp_path / "data",
                       secret="not-the-secret").start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(200), acked)

    async def denied() -> bool:
        return await metric(http, broker.url, "messaging_object_store_errors_total",
                            kind="denied") >= 1

    await wait_until(denied, 20, "a denied upload")
    await asyncio.sleep(1.0)  # truncation passes: none may delete what is not in the store
    described = (await diagnostics(http, broker.url))["object_store"]
    assert "access denied" in described["last_error"], described
    info = await topic_info(http, broker.url)
    assert info["offloaded_segments"] == 0 and info["size"] > 4 * SEGMENT
    assert info["local_first_index"] == min(acked)
    await assert_all_acked(http, broker.url, acked)
    assert not await listed(raw_store(seaweedfs, prefix))


async def test_restart_while_store_down(broker_process: MakeBroker,
                                        start_seaweedfs: Callable[[], SeaweedFS],
                                        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """A broker restarted while its store is down starts, serves its local data (the store's
    part answers 503) and takes publishes."""
    server = start_seaweedfs()
    prefix, data = unique_prefix(), tmp_path / "data"
    broker = s3_broker(broker_process, server, prefix, data).start()
    acked: dict[int, bytes] = {}
    await publish_many(http, broker.url, range(200), acked)
    await wait_offloaded(http, broker.url, 3)
    broker.kill()
    kill_seaweedfs(server)
    restarted = s3_broker(broker_process, server, prefix, data).start()

    async def failed_once() -> bool:  # its first offload pass (which may run retention) ran
        return bool((await diagnostics(http, restarted.url))["object_store"]["last_error"])

    await wait_until(failed_once, 30, "an offload pass failing")
    info = await settled(http, restarted.url)
    assert info["local_first_index"] > info["first_index"] == min(acked)
    # The newest segment's messages: local retention may still delete a recorded segment
    # below it (a reader then goes back to the store, which is down: 503).
    newest = max(info["local_first_index"], max(acked) - 20)
    local = await read_all(http, restarted.url, max(acked), newest)
    assert [d for _i, d in local] == [acked[i] for i in sorted(acked) if i >= newest]
    status, headers, _messages = await read(http, restarted.url, 0)
    assert status == 503 and "Retry-After" in headers, (status, headers)
    await publish_many(http, restarted.url, range(200, 250), acked)
    local = await read_all(http, restarted.url, max(acked), newest)
    assert [d for _i, d in local] == [acked[i] for i in sorted(acked) if i >= newest]
