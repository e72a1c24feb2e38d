"""Waiting in tests for what another process is still starting (a connection, an etcd member,
a broker's first answer): try again until a stated deadline, never fail on the first refusal.

On a loaded machine a first connect can miss a one-second deadline that it meets in a few
milliseconds on an idle one; a test that gives up then fails for the machine's sake, not the
code's. Each attempt keeps its own deadline; the whole wait has a bound, stated by the
caller, and its failure names what was awaited and the last error. No pytest here: helper
subprocesses (tests/e2e/etcd_idle_channels.py) use it too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Pause between attempts.
PAUSE = 0.2


Retryable = tuple[type[BaseException], ...] | Callable[[BaseException], bool]


async def retry_until(attempt: Callable[[], Awaitable[T]], *, within: float, what: str,
                      retry_on: Retryable) -> T:
    """``attempt()``'s result, calling it again after each failure that ``retry_on`` (a tuple
    of exception types, or a predicate) accepts, until ``within`` seconds have passed; then
    TimeoutError naming ``what`` and the last failure. Any other exception goes through."""
    deadline = time.monotonic() + within
    attempts = 0
    while True:
        attempts += 1
        try:
            return await attempt()
        except Exception as err:
            _give_up_unless(retry_on, err, deadline, within, what, attempts)
        await asyncio.sleep(PAUSE)


def _give_up_unless(retry_on: Retryable, err: Exception, deadline: float, within: float,
                    what: str, attempts: int) -> None:
    """Re-raise ``err`` unless it is retryable; TimeoutError once the deadline is near."""
    retryable = isinstance(err, retry_on) if isinstance(retry_on, tuple) else retry_on(err)
    if not retryable:
        raise err
    if time.monotonic() + PAUSE >= deadline:
        raise TimeoutError(f"{what}: still failing after {within:g} s and {attempts} "
                           f"attempts: {type(err).__name__}: {err}") from err
