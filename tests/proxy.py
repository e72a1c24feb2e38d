"""A small fault-injecting TCP proxy for client tests (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import contextlib
import socket


def dead_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class FaultProxy:
    """Forwards connections to ``upstream_port``, optionally breaking them.

    ``cut_after``: close a connection once it has carried that many response bytes (so a
    stream is cut wherever that falls, usually inside a frame). ``drop_responses``: forward
    requests but close the client connection as soon as the answer starts, so the client never
    learns the outcome. ``drop_connections``: the same, for those connections only (numbered
    from 1 in the order they came). :meth:`sever` cuts every connection and refuses new
    ones until ``refuse`` is set back to False (a server gone and back, on the same port).
    ``hold_responses``: requests still reach the server, but nothing it answers reaches the
    client while set (a server that took a request and went silent).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after: int | None = None
        self.drop_responses = False
        self.drop_connections: set[int] = set()
        self.refuse = False
        self.hold_responses = False
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0
        self.cuts = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def sever(self) -> None:
        """Cut every connection now and refuse new ones (until ``refuse`` is False)."""
        self.refuse = True
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        if self.refuse:
            client_w.close()
            self._tasks.discard(task)
            return
        drop = self.drop_responses or self.connections in self.drop_connections
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        upward = asyncio.ensure_future(self._pump(client_r, up_w, None))
        self._writers.update((client_w, up_w))
        try:
            await self._pump(up_r, client_w, self.cut_after, drop=drop, downward=True)
        finally:
            upward.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await upward
            for writer in (client_w, up_w):
                writer.close()
                self._writers.discard(writer)
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    limit: int | None, drop: bool = False, downward: bool = False) -> None:
        carried = 0
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(4096):
                if drop:
                    return
                if downward and self.hold_responses:
                    continue
                if limit is not None and carried + len(data) >= limit:
                    writer.write(data[: limit - carried])
                    await writer.drain()
                    self.cuts += 1
                    return
                carried += len(data)
                writer.write(data)
                await writer.drain()
