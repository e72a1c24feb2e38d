"""Startup: a cluster node's failures are INFO while it starts, WARNING once it is late."""

from __future__ import annotations

import logging

import pytest

from messaging.log.etcd.startup import Startup
from messaging.quiet_log import QuietLog

LOGGER = "test.startup"


def test_failures_are_info_until_ready_then_their_own_level(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    startup = Startup(logging.getLogger(LOGGER), "/log", grace=10.0, clock=lambda: now[0])
    quiet = QuietLog(logging.getLogger(LOGGER), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert startup.level() == logging.INFO and startup.level(logging.ERROR) == logging.INFO
        startup.log(quiet, "quorum", logging.WARNING, "no leader yet")
        startup.check("the watch of etcd's log is not live: starting")
        now[0] = 1.5
        startup.check(None)
        assert not startup.starting and startup.level() == logging.WARNING
        # The line while starting was a kind of its own: the first real fault is not held.
        assert startup.log(quiet, "quorum", logging.WARNING, "quorum lost")
        startup.check("no etcd quorum")  # after the start: the fault's own lines say it
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "no leader yet"), ("INFO", "/log: ready 1.5s after start"),
        ("WARNING", "quorum lost")]


def test_a_start_past_the_grace_period_is_told_once(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    startup = Startup(logging.getLogger(LOGGER), "/log", grace=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        startup.check("no etcd quorum: connection refused")
        now[0] = 10.0
        assert not startup.starting and startup.level() == logging.WARNING
        startup.check("no etcd quorum: connection refused")
        now[0] = 11.0
        startup.check("no etcd quorum: connection refused")
        now[0] = 12.0
        startup.check(None)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "/log: not ready 10s after start: no etcd quorum: connection refused"),
        ("INFO", "/log: ready 12.0s after start")]
