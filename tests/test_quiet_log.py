"""QuietLog: one line per kind per interval, the rest counted into the next line."""

from __future__ import annotations

import logging
import threading

import pytest

from messaging.quiet_log import QuietLog


def test_each_kind_once_per_interval_and_the_rest_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    quiet = QuietLog(logging.getLogger("test.quiet"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.quiet"):
        assert quiet.log("disk", logging.ERROR, "disk full on %s", "topic 1")
        assert not quiet.log("disk", logging.ERROR, "disk full on %s", "topic 2")
        assert not quiet.log("disk", logging.ERROR, "disk full on %s", "topic 3")
        assert quiet.log("etcd", logging.WARNING, "etcd down")  # another kind: its own clock
        assert quiet.held("disk") == 2
        now[0] += 10.0
        assert quiet.log("disk", logging.ERROR, "disk full on %s", "topic 4")
        assert quiet.held("disk") == 0
    assert [r.getMessage() for r in caplog.records] == [
        "disk full on topic 1", "etcd down",
        "disk full on topic 4 (2 more like it not logged)"]
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.WARNING,
                                                   logging.ERROR]


def test_threads_share_one() -> None:
    quiet = QuietLog(logging.getLogger("test.quiet.threads"), 3600.0)
    logged: list[bool] = []

    def flood() -> None:
        for _ in range(1000):
            logged.append(quiet.log("k", logging.DEBUG, "line"))

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert logged.count(True) == 1
    assert quiet.held("k") == 3999


def test_several_lines_per_window_and_a_summary_of_ones_own(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    quiet = QuietLog(logging.getLogger("test.quiet.lines"), 1.0, lines=2, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.quiet.lines"):
        assert [quiet.log("r", logging.WARNING, "line %d", n) for n in range(5)] == [
            True, True, False, False, False]
        assert quiet.window_end("r") == 1.0
        assert quiet.take_held("r") == 3 and quiet.held("r") == 0
        now[0] = 1.0
        assert quiet.log("r", logging.WARNING, "line %d", 5)
    assert [r.getMessage() for r in caplog.records] == ["line 0", "line 1", "line 5"]
