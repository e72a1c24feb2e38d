"""SerialExecutor: one thread that runs what it is handed, in order, cheaply.

A cluster node's writer thread owns its broker: every write, checkpoint and install runs on
it, one after the other. ``ThreadPoolExecutor(max_workers=1)`` would do, but each ``submit``
builds a future with its own condition variable, takes the pool's locks and checks whether
to start a thread; at a few hundred applied revisions a second per node that bookkeeping cost
more than the writes themselves. :meth:`SerialExecutor.post` hands over a job with no
future at all (one ``SimpleQueue.put``); :meth:`SerialExecutor.submit` keeps the
:class:`~concurrent.futures.Executor` contract for ``loop.run_in_executor``.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: prctl's option that names the calling thread (Linux).
_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Name the calling thread for the OS too (Linux: ``top -H``, ``/proc/PID/task/*/comm``
    show it; the kernel keeps 15 bytes); a no-op elsewhere or when it fails."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # only a node that starts its writer thread needs it
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any] | None, Future[Any] | None]


class SerialExecutor(Executor):
    """Runs jobs one at a time, in the order they were handed over, on one thread.

    The thread starts with the first job and ends at :meth:`shutdown`, after every job handed
    over before it. It is a daemon: a process that exits without shutting the executor down
    (a crash path) is not held up by it.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _thread and _shut
        self._thread: threading.Thread | None = None
        self._shut = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` in turn; its future gets the result or exception."""
        future: Future[T] = Future()
        self._put((fn, args, kwargs, future))
        return future

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in turn, with no future: an exception it raises is logged. For
        jobs that report their outcome themselves (``loop.call_soon_threadsafe``)."""
        self._put((fn, args, None, None))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new jobs; the thread ends after the ones already handed over (waited for
        when ``wait``). ``cancel_futures`` is not supported: queued jobs always run."""
        with self._lock:
            thread = self._thread
            if not self._shut:
                self._shut = True
                if thread is not None:
                    self._queue.put(None)
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _put(self, job: _Job) -> None:
        with self._lock:
            if self._shut:
                raise RuntimeError(f"{self._name}: cannot take jobs after shutdown")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.put(job)

    def _run(self) -> None:
        name_os_thread(self._name)
        get = self._queue.get
        while True:
            job = get()
            if job is None:
                return
            fn, args, kwargs, future = job
            if future is None:
                try:
                    fn(*args)
                except BaseException:
                    log.exception("%s: a job failed", self._name)
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs) if kwargs else fn(*args)
            except BaseException as err:
                future.set_exception(err)
            else:
                future.set_result(result)
