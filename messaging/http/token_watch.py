"""Reread the tokens file when it changes, so a token added or revoked takes effect within a
few seconds without SIGHUP.

Every :data:`CHECK_INTERVAL` seconds the file's version (device, inode, size, modification
time) is compared with the one the tokens were read from; a rename over it (``messaging
token`` rewrites it that way) or an edit in place changes it. A file that cannot be used keeps
the tokens read before and is logged at ERROR once per change, as SIGHUP does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from messaging.aio import cancel_and_wait
from messaging.errors import MessagingError
from messaging.files import FileVersion, file_version
from messaging.http.auth import Tokens

log = logging.getLogger(__name__)

#: Seconds between two looks at the tokens file.
CHECK_INTERVAL = 2.0

T = TypeVar("T")
#: No version of the file was found unusable (None stands for a missing file).
_NOTHING_REFUSED = object()


class TokensWatch:
    """Rereads ``tokens`` whenever its file changes: :meth:`start`, then :meth:`close`."""

    def __init__(self, tokens: Tokens, interval: float = CHECK_INTERVAL) -> None:
        self.tokens = tokens
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        #: The version of the file last found unusable (logged once, not again).
        self._refused: FileVersion | object | None = _NOTHING_REFUSED
        #: The look at the file or reread a thread is doing (owned: awaited by close).
        self._in_thread: asyncio.Future[Any] | None = None

    def start(self) -> None:
        """Start watching the file."""
        self._task = asyncio.create_task(self._watch(), name="messaging-tokens-watch")

    async def close(self) -> None:
        """Stop watching; waits for a look or reread a thread is doing."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._in_thread is not None:
            with contextlib.suppress(Exception):
                await self._in_thread

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # a bug: keep watching rather than stop rereading for good
                log.exception("watching the tokens file %s failed", self.tokens.path)

    async def check(self) -> bool:
        """Reread the file if it is not the version the tokens were read from (nor the
        version found unusable last time); returns whether the tokens were reread."""
        now = await self._run(file_version, self.tokens.path)
        if now == self.tokens.version or now == self._refused:
            return False
        try:
            await self._run(self.tokens.reload)
        except MessagingError as err:
            self._refused = now
            log.error("%s; keeping the tokens read before", err)
            return False
        self._refused = _NOTHING_REFUSED
        return True

    async def _run(self, function: Callable[..., T], *args: object) -> T:
        """``function(*args)`` on a thread, which :meth:`close` waits for even when the
        caller is cancelled."""
        future = asyncio.get_running_loop().run_in_executor(None, function, *args)
        self._in_thread = future
        return await asyncio.shield(future)
