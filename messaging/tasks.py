"""Owning background tasks the aiohttp way: cancel, await, and never swallow the caller's
own cancellation."""

from __future__ import annotations

import asyncio
from typing import Any


async def wait_finished(task: asyncio.Future[Any]) -> None:
    """Await a task that is ending (or was cancelled by its owner), ignoring its cancellation.

    If the *caller* is being cancelled meanwhile, that cancellation is re-raised, not eaten.
    """
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel a task this object owns and wait until it has finished."""
    if task is None:
        return
    task.cancel()
    await wait_finished(task)
