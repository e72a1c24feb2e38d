"""Bounded loops: the event loop a benchmark runs on (uvloop, as the broker's), open-loop
pacing, closed loops, waits for a condition, and timed repeats of a blocking call. Every loop
here stops at a count and at a deadline."""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from bench.harness.figures import Figure

T = TypeVar("T")
#: Seconds a paced run waits past its last send for the answers still out.
DRAIN_SECONDS = 15.0
#: Upper bound of one closed loop's iterations.
MAX_OPS = 10_000_000


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when installed (as the broker does), else asyncio's loop."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def freeze_startup_objects() -> None:
    """Take the load generator's import-time objects out of the collector's view.

    Its imports (matplotlib, the client libraries) made each of its full collections 40-70 ms,
    pauses that landed in every server's live-delivery p99 alike. Those objects live as long
    as the process; every object made later is collected as usual.
    """
    gc.collect()
    gc.freeze()


def off_loop(fn: Callable[[], T]) -> Awaitable[T]:
    """Run a blocking helper (a child's start or stop, an RSS wait) on a thread."""
    return asyncio.get_running_loop().run_in_executor(None, fn)


async def paced(rate: float, total: int, publish: Callable[[int], Awaitable[None]], *,
                drain: float = DRAIN_SECONDS) -> int:
    """Open-loop publishing: ``publish(k)`` for k < ``total``, started ``rate`` times a
    second whether or not earlier ones were answered; waits up to ``drain`` s past the last
    start for the answers (the rest are cancelled); returns ``total``. A failed publish fails
    the run."""
    started = time.perf_counter()
    tasks = []
    for k in range(total):
        delay = started + k / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(publish(k)))
    if not tasks:
        return 0
    done, pending = await asyncio.wait(tasks, timeout=total / rate + drain)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    failed = [task.exception() for task in done if task.exception() is not None]
    if failed:  # every exception retrieved: the first one fails the run
        raise RuntimeError(f"{len(failed)} of {total} publishes failed") from failed[0]
    return total


async def loops(count: int, seconds: float, body: Callable[[], Awaitable[int]]) -> Figure:
    """``count`` concurrent closed loops running ``body`` (which returns items handled) for
    ``seconds``: items per second."""
    items = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal items
        for _ in range(MAX_OPS):
            if time.perf_counter() >= deadline:
                return
            handled = await body()  # not ``items += await``: that reads items before awaiting
            items += handled

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(count)))
    elapsed = time.perf_counter() - started
    return Figure(items / elapsed, elapsed)


async def until(seconds: float, check: Callable[[], bool]) -> None:
    """Wait until ``check()`` or ``seconds`` passed."""
    deadline = time.perf_counter() + seconds
    while not check() and time.perf_counter() < deadline:
        await asyncio.sleep(0.02)


async def bounded_wait(check: Callable[[], Awaitable[bool]], timeout: float, what: str,
                       interval: float = 0.1) -> None:
    """Poll ``check`` until true; at most ``timeout`` seconds and timeout/interval+1 polls;
    raises ``RuntimeError`` naming ``what`` when it never came true."""
    deadline = time.perf_counter() + timeout
    for _ in range(int(timeout / interval) + 1):
        if await check():
            return
        if time.perf_counter() >= deadline:
            break
        await asyncio.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def rate(fn: Callable[[], int], *, min_time: float = 0.5, max_rounds: int = 50,
         repeats: int = 3) -> float:
    """Median over ``repeats`` of items/second, each repeat running ``fn`` (which returns how
    many items it handled) until ``min_time`` passed or ``max_rounds`` calls were made."""
    figures = []
    for _ in range(repeats):
        items = 0
        rounds = 0
        started = time.perf_counter()
        while rounds < max_rounds:
            items += fn()
            rounds += 1
            if time.perf_counter() - started >= min_time:
                break
        figures.append(items / (time.perf_counter() - started))
    return statistics.median(figures)
