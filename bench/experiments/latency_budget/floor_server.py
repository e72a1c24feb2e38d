"""The floor of a single-threaded Python server on this disk, for the latency budget: a
minimal uvloop server that does what Redis does with ``appendfsync always`` and nothing more,
or hands its writes to a writer thread the way LocalLog does.

The latency budget starts it (one process, stopped by its PID) as::

    python -m bench.experiments.latency_budget.floor_server PUBLISH_PORT SUBSCRIBE_PORT FILE
        --mode inline|thread [--prealloc BYTES]

and times it with the client in :mod:`bench.experiments.latency_budget.floor` (which also
draws its wire format). Each message becomes the frame our segments store (126 B for 100 B),
is written to ``FILE`` and fdatasynced; then its publisher gets the index and every
subscriber connection gets the frame (publishers first, as the broker answers them before
waking followers). ``inline`` writes and fdatasyncs on the event loop, as Redis does: the
package never may (STYLE.md), but this is the measuring stick. ``thread`` hands the frames to
a writer thread the way ``messaging.log.local.LocalLog`` does (:class:`Handoff`): our design
without HTTP. ``--prealloc`` fills ``FILE`` with that many zero bytes (fsynced once) before it
listens and overwrites them in place; past their end it grows the file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import cast

from bench.experiments.latency_budget.floor import ACK, LENGTH, MODES
from bench.experiments.latency_budget.handoff import Handoff
from bench.harness.disk import fill
from messaging.frames import encode


class LogFile:
    """The server's one log file: appended (``O_APPEND``, as segments are) or, preallocated,
    overwritten at the next offset; every ``append`` ends with an fdatasync."""

    def __init__(self, path: Path, prealloc: int = 0) -> None:
        self.offset = 0
        self.preallocated = prealloc > 0
        if self.preallocated:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fill(self.fd, prealloc)
        else:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def append(self, records: list[bytes]) -> None:
        """Write ``records`` after what is written and fdatasync (blocking)."""
        data = b"".join(records)
        written = (os.pwrite(self.fd, data, self.offset) if self.preallocated
                   else os.write(self.fd, data))
        if written != len(data):
            raise OSError(f"short write: {written} of {len(data)} bytes")
        self.offset += written
        os.fdatasync(self.fd)

    def close(self) -> None:
        """Close the file."""
        os.close(self.fd)


Pending = tuple[asyncio.Transport, int, bytes]  # publisher, index, frame


class FloorServer:
    """Publishers in, one log file, subscribers out; ``inline`` or ``thread`` durability."""

    def __init__(self, log: LogFile, mode: str) -> None:
        self.log = log
        self.index = 0
        self.subscribers: set[asyncio.Transport] = set()
        self.handoff: Handoff[Pending] | None = None
        if mode == "thread":
            self.handoff = Handoff(asyncio.get_running_loop(), log.append, self.settle)
            self.handoff.start()

    def publish(self, publisher: asyncio.Transport, payloads: list[bytes]) -> None:
        """Frame, make durable and deliver the whole messages one read brought."""
        group: list[Pending] = []
        for payload in payloads:
            self.index += 1
            group.append((publisher, self.index, encode(1, 1, payload, self.index)))
        if self.handoff is not None:
            for pending in group:
                self.handoff.submit(pending[2], pending)
            return
        error: BaseException | None = None
        try:
            self.log.append([frame for _, _, frame in group])  # on the loop: Redis's way
        except OSError as err:
            error = err
        self.settle(group, error)

    def settle(self, group: list[Pending], error: BaseException | None) -> None:
        """Answer the publishers, then send the frames to every subscriber (on the loop)."""
        if error is not None:
            print(f"write failed: {error}", file=sys.stderr, flush=True)
            for publisher, _, _ in group:
                publisher.close()
            return
        for publisher, index, _ in group:
            publisher.write(ACK.pack(index))
        frames = b"".join(frame for _, _, frame in group)
        for subscriber in self.subscribers:
            subscriber.write(frames)

    async def close(self) -> None:
        """Stop the writer thread, if there is one, once it has written what is queued."""
        if self.handoff is not None:
            await self.handoff.close()


class PublisherConnection(asyncio.Protocol):
    """Length-prefixed messages in; each read's whole messages go to the server together."""

    def __init__(self, server: FloorServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        pos, payloads = 0, []
        while len(buf) - pos >= LENGTH.size:
            (length,) = LENGTH.unpack_from(buf, pos)
            end = pos + LENGTH.size + length
            if end > len(buf):
                break
            payloads.append(buf[pos + LENGTH.size:end])
            pos = end
        self._buf = buf[pos:]
        if payloads and self.transport is not None:
            self.server.publish(self.transport, payloads)


class SubscriberConnection(asyncio.Protocol):
    """A connection that receives every frame made durable while it is open."""

    def __init__(self, server: FloorServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.server.subscribers.add(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.server.subscribers.discard(self.transport)


async def serve(publish_port: int, subscribe_port: int, log: LogFile, mode: str) -> None:
    """Listen on both ports of 127.0.0.1, say ``ready``, serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: stop.done() or stop.set_result(None))
    server = FloorServer(log, mode)
    listeners = [
        await loop.create_server(lambda: PublisherConnection(server), "127.0.0.1", publish_port),
        await loop.create_server(lambda: SubscriberConnection(server), "127.0.0.1",
                                 subscribe_port)]
    print("ready", flush=True)
    try:
        await stop
    finally:
        for listener in listeners:
            listener.close()
        for subscriber in list(server.subscribers):
            subscriber.close()
        await server.close()


def main() -> None:
    """The server process: prepare the file, listen, serve until SIGTERM."""
    from messaging.cli.main import event_loop_factory

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("publish_port", type=int)
    p.add_argument("subscribe_port", type=int)
    p.add_argument("file", type=Path)
    p.add_argument("--mode", choices=MODES, default="inline")
    p.add_argument("--prealloc", type=int, default=0, help="zero bytes to preallocate")
    args = p.parse_args()
    log = LogFile(args.file, args.prealloc)  # before the loop runs: preallocating blocks
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(serve(args.publish_port, args.subscribe_port, log, args.mode))
    finally:
        log.close()


if __name__ == "__main__":
    main()
