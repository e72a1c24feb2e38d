"""The broker rereads its tokens file when it changes (messaging.http.token_watch)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from messaging.errors import UnauthorizedError
from messaging.http.auth import Tokens, new_token, parse_scope, token_line
from messaging.http.token_watch import TokensWatch
from tests.conftest import wait_until

ERRORS = "messaging.http.token_watch"


def line(name: str, token: str) -> str:
    return token_line(name, token, [parse_scope("read")]) + "\n"


def replace(path: Path, text: str) -> None:
    """Replace the file by a rename, as ``messaging token`` does."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def accepts(tokens: Tokens, token: str) -> bool:
    try:
        tokens.principal(f"Bearer {token}")
    except UnauthorizedError:
        return False
    return True


async def test_a_changed_file_is_reread_and_a_broken_one_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tokens"
    alice, bob = new_token(), new_token()
    path.write_text(line("alice", alice))
    tokens = await asyncio.to_thread(Tokens, path)
    watch = TokensWatch(tokens)
    assert not await watch.check()  # as read

    replace(path, line("bob", bob))  # a revoke and a create, by rename
    assert await watch.check()
    assert accepts(tokens, bob) and not accepts(tokens, alice)
    assert not await watch.check()

    caplog.set_level(logging.ERROR, ERRORS)
    replace(path, "bob sha256:00 telepathy\n")
    assert not await watch.check() and not await watch.check()
    errors = [r.getMessage() for r in caplog.records if r.name == ERRORS]
    assert errors == [f"{path}:1: unknown scope 'telepathy': expected one of read, write, "
                      "consume, admin, optionally =TARGET,...; keeping the tokens read before"]
    assert accepts(tokens, bob)

    path.unlink()  # another change: said once more
    assert not await watch.check() and not await watch.check()
    errors = [r.getMessage() for r in caplog.records if r.name == ERRORS]
    assert len(errors) == 2 and "No such file or directory" in errors[1]
    assert accepts(tokens, bob)

    with path.open("w") as f:  # written in place this time
        f.write(line("alice", alice))
    assert await watch.check()
    assert accepts(tokens, alice) and not accepts(tokens, bob)


async def test_a_reload_by_sighup_is_not_repeated(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(line("alice", new_token()))
    tokens = await asyncio.to_thread(Tokens, path)
    watch = TokensWatch(tokens)
    replace(path, line("bob", new_token()))
    await asyncio.to_thread(tokens.reload)  # what SIGHUP does
    assert not await watch.check()


async def test_the_watch_runs_until_closed(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("")
    tokens = await asyncio.to_thread(Tokens, path)
    watch = TokensWatch(tokens, interval=0.01)
    watch.start()
    try:
        late = new_token()
        replace(path, line("late", late))

        async def accepted() -> bool:
            return accepts(tokens, late)

        await wait_until(accepted, timeout=5, what="the watch to read the new token")
    finally:
        await watch.close()
    replace(path, "")
    await asyncio.sleep(0.05)
    assert accepts(tokens, late)  # closed: no longer rereads
