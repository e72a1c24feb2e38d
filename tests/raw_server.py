"""Servers on 127.0.0.1 for tests: a raw TCP server for a peer which misbehaves
(:func:`raw_server`), and an aiohttp application on a free port (:func:`app_server`).

Every raw connection's handler runs as a task the server keeps; leaving the context cancels the
handlers still running and closes their connections before the test's loop ends, so nothing
is left for the garbage collector to warn about in a later test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[int]:
    """Serve ``handler`` on a free port of 127.0.0.1; yields the port."""
    tasks: set[asyncio.Task[object]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(reader, writer)
        finally:
            tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        running = list(tasks)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await server.wait_closed()


@contextlib.asynccontextmanager
async def app_server(app: web.Application) -> AsyncIterator[str]:
    """Serve an aiohttp application on a free port of 127.0.0.1; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
