"""Tokens through real processes: ``messaging token create --tokens``, ``token list`` and
``token revoke`` against a running broker, which picks the changes up from its file watch
(no SIGHUP)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import aiohttp

from messaging.http.token_watch import CHECK_INTERVAL
from tests.conftest import BrokerProcess, cli, wait_until


async def status_with(session: aiohttp.ClientSession, url: str, token: str) -> int:
    async with session.get(f"{url}/messaging/topics",
                           headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status


async def test_revoked_and_created_tokens_take_effect_without_sighup(
        broker_process, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"

    async def create(name: str, *scopes: str) -> str:
        args = [a for scope in scopes for a in ("--scope", scope)]
        result = await asyncio.to_thread(cli, "token", "create", "--name", name, *args,
                                         "--tokens", str(tokens))
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    admin = await create("admin", "admin")
    reporter = await create("reporter", "read=1,chat/*", "consume=reporter-*")
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    broker: BrokerProcess = broker_process(tmp_path / "data", "--tokens", str(tokens))
    await asyncio.to_thread(broker.start)

    result = await asyncio.to_thread(cli, "token", "list", "--tokens", str(tokens))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["NAME      SCOPES", "admin     admin",
                                          "reporter  read=1,chat/* consume=reporter-*"]
    assert admin not in result.stdout and "sha256" not in result.stdout

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        assert await status_with(session, broker.url, reporter) == 200
        result = await asyncio.to_thread(cli, "token", "revoke", "reporter",
                                         "--tokens", str(tokens))
        assert result.returncode == 0, result.stderr

        async def refused() -> bool:
            return await status_with(session, broker.url, reporter) == 401

        await wait_until(refused, timeout=8, what="the revoked token to be refused")
        assert await status_with(session, broker.url, admin) == 200

        late = await create("late", "read")

        async def accepted() -> bool:
            return await status_with(session, broker.url, late) == 200

        await wait_until(accepted, timeout=8, what="the new token to be accepted")

        # A broken file keeps the tokens read before, and says so once in the log.
        tokens.write_text(tokens.read_text() + "oops\n")
        error = (f"{tokens}:3: expected NAME sha256:HEX SCOPE...; keeping the tokens read "
                 "before")

        async def logged() -> bool:
            return error in broker.log.read_text()

        await wait_until(logged, timeout=8, what="the broken file to be logged")
        await asyncio.sleep(2 * CHECK_INTERVAL)  # the watch looks again: no second line
        assert await status_with(session, broker.url, late) == 200
    assert broker.terminate() == 0
    log = broker.log.read_text()
    assert log.count(error) == 1, log
    assert admin not in log and reporter not in log and late not in log


def test_token_commands_fail_in_one_line(tmp_path: Path) -> None:
    result = cli("token", "list", "--tokens", str(tmp_path / "absent"))
    assert result.returncode == 1 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "cannot read tokens file" in result.stderr
    result = cli("token", "revoke", "nobody", "--tokens", str(tmp_path / "absent"))
    assert result.returncode == 1 and result.stderr.count("\n") == 1
