"""The CLI and time, in subprocesses against a real broker: ``tail --since`` (a duration, RFC
3339, ms), append times in ``tail --format json`` and ``--times``, the consumers' lag in time,
a topic's ``--retention-age``, and the one-line errors of bad times."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from messaging.client.client import Client
from messaging.clock import format_moment
from messaging.http.server import BrokerServer
from tests.e2e.test_cli_operator import acli, home  # noqa: F401  (home is a fixture)

PAUSE = 0.3


async def test_tail_since_and_times(server: BrokerServer, home: dict[str, str]) -> None:  # noqa: F811
    url = server.url
    async with Client(url) as client:
        await client.publish_batch(1, [b"early-1", b"early-2"])  # one request: one time
        await asyncio.sleep(PAUSE)
        await client.publish_batch(1, [b"late-1", b"late-2"])
        later = (await client.read(1, times=True))[2].time
    assert later is not None

    async def tail(*args: str) -> list[str]:
        result = await acli("tail", url, "1", *args, env=home)
        assert result.returncode == 0 and result.stderr == "", result
        return result.stdout.splitlines()

    def datas(lines: list[str]) -> list[str]:
        return [line.split("\t")[-1] for line in lines]

    everything = ["early-1", "early-2", "late-1", "late-2"]
    assert datas(await tail("--since", "10m")) == everything
    assert datas(await tail("--since", str(later))) == ["late-1", "late-2"]
    assert datas(await tail("--since", format_moment(later))) == ["late-1", "late-2"]
    assert datas(await tail("--since", "1d", "--limit", "1")) == ["early-1"]
    records = [json.loads(line) for line in await tail("--format", "json", "--since",
                                                       str(later))]
    assert [(r["data"], r["time"]) for r in records] == [("late-1", later), ("late-2", later)]
    shown = await tail("--times", "--from", "3")
    assert [line.split("\t")[1] for line in shown] == [format_moment(later)] * 2

    bad = await acli("tail", url, "1", "--since", "last tuesday", env=home)
    assert bad.returncode == 2 and bad.stdout == ""
    error, see = bad.stderr.splitlines()  # the error, then where the help is
    assert error.startswith("messaging tail: error: argument --since: invalid --since "
                            "'last tuesday': use an RFC 3339 time")
    assert see == "see 'messaging tail --help'"
    both = await acli("tail", url, "1", "--since", "1m", "--from", "1", env=home)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr

    # A follower from a time: what is there from then on, then what comes.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "messaging.cli", "tail", url, "1", "--since", str(later),
        "--follow", "--limit", "3", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **home})
    try:
        await asyncio.sleep(1.0)
        async with Client(url) as client:
            await client.publish(1, b"new")
        out, _err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert datas(out.decode().splitlines()) == ["late-1", "late-2", "new"]


async def test_consumers_lag_time_and_a_topics_retention_age(
        server: BrokerServer, home: dict[str, str]) -> None:  # noqa: F811
    url = server.url
    async with Client(url) as client:
        first = await client.publish(1, b"a")
        await client.publish(1, b"b")
        await client.heartbeat(1, first, "reader")
    await asyncio.sleep(PAUSE)
    listed = await acli("consumers", url, "1", env=home)
    assert listed.returncode == 0, listed
    header, row = listed.stdout.splitlines()
    assert "LAG-TIME" in header
    lag_time = row.split()[4]
    assert lag_time.endswith("s") and float(lag_time[:-1]) >= PAUSE * 0.9
    rows = json.loads((await acli("consumers", url, "1", "--format", "json",
                                  env=home)).stdout)
    assert rows["lag_ms"] >= PAUSE * 1000 * 0.9

    set_age = await acli("topic", "config", url, "1", "--retention-age", "7d", env=home)
    assert set_age.returncode == 0, set_age
    assert any(line.split()[:3] == ["retention-age", "7d", "topic"]
               for line in set_age.stdout.splitlines())
    described = json.loads((await acli("topic", "describe", url, "1", "--format", "json",
                                       env=home)).stdout)
    assert described["settings"]["retention-age"] == {"value": 7 * 86_400_000,
                                                      "source": "topic"}
    off = await acli("topic", "config", url, "1", "--retention-age", "0", env=home)
    assert any(line.split()[:2] == ["retention-age", "off"] for line in off.stdout.splitlines())
    bad = await acli("topic", "config", url, "1", "--retention-age", "soon", env=home)
    assert bad.returncode == 2 and "invalid duration 'soon'" in bad.stderr
