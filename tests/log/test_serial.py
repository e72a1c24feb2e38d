"""SerialExecutor: one thread, jobs in order, futures for submit, none for post."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest

from messaging.log.serial import SerialExecutor


def test_jobs_run_in_order_on_one_thread() -> None:
    executor = SerialExecutor("test-serial")
    seen: list[tuple[int, int]] = []
    try:
        for k in range(200):
            if k % 2:
                executor.post(lambda k=k: seen.append((k, threading.get_ident())))
            else:
                executor.submit(lambda k=k: seen.append((k, threading.get_ident())))
        assert executor.submit(lambda: "last").result(timeout=10) == "last"
    finally:
        executor.shutdown()
    assert [k for k, _ in seen] == list(range(200))
    assert len({thread for _, thread in seen}) == 1
    assert seen[0][1] != threading.get_ident()


def test_submit_carries_results_and_exceptions() -> None:
    executor = SerialExecutor("test-serial")
    try:
        assert executor.submit(pow, 2, 10).result(timeout=10) == 1024
        assert executor.submit(int, "12", base=8).result(timeout=10) == 10
        failed = executor.submit(int, "not a number")
        with pytest.raises(ValueError):
            failed.result(timeout=10)
    finally:
        executor.shutdown()


def test_a_failing_post_is_logged_and_the_thread_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    executor = SerialExecutor("test-serial")

    def boom() -> None:
        raise RuntimeError("boom")

    try:
        with caplog.at_level(logging.ERROR, logger="messaging.log.serial"):
            executor.post(boom)
            assert executor.submit(lambda: 7).result(timeout=10) == 7
    finally:
        executor.shutdown()
    assert any("test-serial: a job failed" in r.getMessage() and r.exc_info
               for r in caplog.records)


def test_shutdown_runs_what_was_queued_then_refuses() -> None:
    executor = SerialExecutor("test-serial")
    gate = threading.Event()
    done: list[int] = []
    executor.post(lambda: gate.wait(10))
    for k in range(5):
        executor.post(done.append, k)
    gate.set()
    executor.shutdown(wait=True)
    assert done == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.post(done.append, 5)
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(done.append, 5)
    executor.shutdown()  # a second shutdown is harmless


def test_an_unused_executor_starts_no_thread() -> None:
    before = threading.active_count()
    executor = SerialExecutor("test-serial")
    assert threading.active_count() == before
    executor.shutdown()
    assert threading.active_count() == before


def test_it_serves_run_in_executor() -> None:
    executor = SerialExecutor("test-serial")

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        return list(await asyncio.gather(*(loop.run_in_executor(executor, abs, -k)
                                           for k in range(20))))

    try:
        assert asyncio.run(main()) == list(range(20))
    finally:
        executor.shutdown()


def test_the_thread_carries_its_name_for_the_os() -> None:
    executor = SerialExecutor("test-serial-name")
    try:
        native = executor.submit(threading.get_native_id).result(timeout=10)
        comm = Path(f"/proc/self/task/{native}/comm").read_text().strip()
    finally:
        executor.shutdown()
    assert comm == "test-serial-nam"  # the kernel keeps 15 bytes
