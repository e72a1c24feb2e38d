"""Standard input for ``messaging publish``: read in chunks on a thread of its own, handed to
the event loop, and cut into lines there."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading

_STDIN_CHUNK = 1 << 16


class StdinReader:
    """Standard input read on a thread of its own in chunks, handed to the loop.

    A daemon thread, because a read of a terminal or a pipe cannot be interrupted: when the
    command ends early (a failed publish) it is left blocked and ends with the process.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=8)
        self._partial = b""
        self._pending: asyncio.Future[bytes] | None = None
        self._interrupted = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="messaging-stdin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # The file descriptor, not sys.stdin.buffer: a read left blocked in the buffered
        # object when the command ends holds its lock, and the interpreter's shutdown, which
        # takes that lock, aborts ("could not acquire lock ... daemon threads").
        fd = sys.stdin.fileno()
        while not self._stopped.is_set():
            try:
                chunk = os.read(fd, _STDIN_CHUNK)
            except OSError:
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(self._queue.put(chunk), self._loop).result()
            except (RuntimeError, asyncio.CancelledError, concurrent.futures.CancelledError):
                return  # the command ended: its loop is closing or gone
            if not chunk:
                return

    async def get(self, timeout: float | None) -> bytes | None:
        """The next chunk (b"" at the end of input, or once :meth:`interrupt` was called);
        None when ``timeout`` passed first."""
        if self._interrupted:
            return b""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._queue.get())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if self._interrupted:
            return b""
        if not done:
            return None
        chunk, self._pending = self._pending.result(), None
        return chunk

    def lines(self, chunk: bytes) -> list[bytes]:
        """The complete lines ``chunk`` ends (without line ends)."""
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        return [line[:-1] if line.endswith(b"\r") else line for line in complete]

    def rest(self) -> bytes | None:
        """A last line without a newline, if any."""
        rest, self._partial = self._partial, b""
        return rest.removesuffix(b"\r") if rest else None

    def interrupt(self) -> None:
        """End the input here (Ctrl-C): :meth:`get` returns b"" now and from now on, and
        what was read after the last complete line is dropped."""
        self._interrupted = True
        self._partial = b""
        if self._pending is not None:
            self._pending.cancel()

    def stop(self) -> None:
        """Stop reading (the thread ends after the read it is in)."""
        self._stopped.set()
        if self._pending is not None:
            self._pending.cancel()
