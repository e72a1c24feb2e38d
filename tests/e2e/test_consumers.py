"""Stored consumer positions with a broker process and the CLI: positions, resets and
deletes survive kill -9 and restarts, a lower heartbeat never moves a position back, reads by
consumer start after its position, and ``messaging consumers`` / ``messaging tail
--consumer`` (which commits as it prints)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from messaging.client.client import Client
from tests.conftest import cli


async def positions(client: Client) -> dict[tuple[int, str], int]:
    return {(c["topic"], c["name"]): c["index"] for c in await client.consumers()}


async def test_positions_resets_and_deletes_survive_kill_9(broker_process,
                                                           tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = broker_process(data).start()
    async with Client(broker.url) as client:
        for n in range(10):
            await client.publish(1 + n % 2, b"m%d" % n)
        await client.heartbeat(1, 7, "billing")
        await client.heartbeat(2, 8, "billing")
        await client.heartbeat(1, 3, "audit")
        await client.heartbeat(1, 5, "billing")  # lower: only says "alive"
        await client.reset_consumer("audit", 1, 1)  # explicit: may go back
        await client.heartbeat(2, 4, "gone")
        assert await client.delete_consumer("gone") == [2]
        before = await positions(client)
        assert before == {(1, "billing"): 7, (1, "audit"): 1, (2, "billing"): 8}
    broker.kill()  # right after the 200s: only broker.json has them
    broker = broker_process(data).start()
    async with Client(broker.url) as client:
        assert await positions(client) == before
        conn = client.conn(1, consumer="billing")
        await conn.open(streaming=False)
        assert [m.index async for m in conn] == [9]
        await conn.close()
        rows = await client.consumers(1, "billing")
        assert rows[0]["index"] == 9 and rows[0]["lag"] == 0 and rows[0]["live"]
    assert broker.terminate() == 0
    broker = broker_process(data).start()
    async with Client(broker.url) as client:
        assert (await positions(client))[(1, "billing")] == 9


async def test_bad_requests_get_clear_errors(broker_process, tmp_path: Path) -> None:
    broker = broker_process(tmp_path / "data").start()
    async with aiohttp.ClientSession() as http:
        url = f"{broker.url}/messaging"
        for method, path, wanted in [
                ("GET", "/messages?topicID=1&consumer=a&index=3", "not index and consumer"),
                ("GET", "/messages?topicID=1&consumer=", "missing consumer name"),
                ("PUT", "/consumers/a?topicID=1", "missing parameter index"),
                ("PUT", "/consumers/a?topicID=x&index=1", "invalid topicID"),
                ("DELETE", "/consumers/nobody", "no consumer 'nobody'"),
                ("GET", "/consumers?topicID=-1", "invalid topicID")]:
            async with http.request(method, url + path) as resp:
                assert 400 <= resp.status < 500, (path, resp.status)
                assert wanted in resp.headers["X-Broker-Error"], path


async def test_cli_tail_by_consumer_commits_what_it_prints(broker_process,
                                                           tmp_path: Path) -> None:
    broker = broker_process(tmp_path / "data").start()
    url = broker.url
    for n in range(5):
        assert cli("publish", url, "1", f"m{n}").returncode == 0
    first = cli("tail", url, "1", "--consumer", "printer", "--commit-every", "2")
    assert first.returncode == 0, first.stderr
    assert [line.split("\t")[2] for line in first.stdout.splitlines()] == [
        "m0", "m1", "m2", "m3", "m4"]
    assert cli("publish", url, "1", "m5").returncode == 0
    again = cli("tail", url, "1", "--consumer", "printer")
    assert [line.split("\t")[2] for line in again.stdout.splitlines()] == ["m5"]

    listed = cli("consumers", url)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["TOPIC", "INDEX", "LAST", "LAG", "LAG-TIME", "IDLE", "NAME"]
    assert row.split()[:4] == ["1", "6", "6", "0"] and row.split()[-1] == "printer"

    assert cli("consumers", url, "1", "--reset", "printer", "--to", "4").returncode == 0
    replay = cli("tail", url, "1", "--consumer", "printer")
    assert [line.split("\t")[2] for line in replay.stdout.splitlines()] == ["m4", "m5"]
    assert cli("consumers", url, "--delete", "printer").returncode == 0
    assert cli("consumers", url, "1").stdout.splitlines()[1:] == []

    for args, wanted in [(["consumers", url, "--reset", "x", "--to", "1"], "needs TOPIC"),
                         (["consumers", url, "--delete", "x"], "no consumer 'x'"),
                         (["tail", url, "1", "--consumer", "a", "--from", "3"], "not allowed with"),
                         (["tail", url, "1", "--commit-every", "0"], "positive integer")]:
        failed = cli(*args)
        error = failed.stderr.strip().splitlines()[0]  # the error, then where help is
        assert failed.returncode != 0 and wanted in error, (args, failed.stderr)
        assert "Traceback" not in failed.stderr
