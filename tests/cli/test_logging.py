"""The broker's logging setup: every line through logging, JSON when asked, the startup line
alone on standard output at every level."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator

import pytest

from messaging.cli.logging import QUIET_LIBRARIES, setup_logging
from messaging.http.access_log import ACCESS_LOGGER, AccessLogger, DebugAccessLogger
from messaging.http.server import READY_LOGGER


class Streams:
    """What a process would have written to standard output and standard error."""

    def __init__(self) -> None:
        self.stdout = io.StringIO()
        self.stderr = io.StringIO()

    def setup(self, level: str, fmt: str) -> None:
        setup_logging(level, fmt, stdout=self.stdout, stderr=self.stderr)

    def lines(self, stream: io.StringIO) -> list[str]:
        return stream.getvalue().splitlines()


@pytest.fixture
def streams() -> Iterator[Streams]:
    """setup_logging changes process-wide state: put every piece of it back afterwards."""
    root, ready = logging.getLogger(), logging.getLogger(READY_LOGGER)
    saved = (list(root.handlers), root.level, list(ready.handlers), ready.level,
             ready.propagate, sys.excepthook, threading.excepthook,
             {name: logging.getLogger(name).level for name in QUIET_LIBRARIES})
    yield Streams()
    (root.handlers[:], root.level, ready.handlers[:], ready.level, ready.propagate,
     sys.excepthook, threading.excepthook) = saved[:7]
    for name, level in saved[7].items():
        logging.getLogger(name).setLevel(level)
    logging.captureWarnings(False)


def test_json_makes_every_line_json_and_the_startup_line_goes_to_stdout_once(
        streams: Streams) -> None:
    streams.setup("info", "json")
    logging.getLogger("messaging.broker.broker").info("opened %s", "data")
    logging.getLogger(READY_LOGGER).info("messaging broker listening on http://127.0.0.1:1 "
                                         "(data d, fsync always)")
    logging.getLogger("messaging").error("boom")
    [ready] = [json.loads(line) for line in streams.lines(streams.stdout)]
    assert ready["logger"] == READY_LOGGER and ready["level"] == "INFO"
    assert ready["message"].startswith("messaging broker listening on http://127.0.0.1:1 ")
    errors = [json.loads(line) for line in streams.lines(streams.stderr)]
    assert [(e["level"], e["message"]) for e in errors] == [("INFO", "opened data"),
                                                            ("ERROR", "boom")]


def test_the_startup_line_is_written_at_every_level(streams: Streams) -> None:
    streams.setup("ERROR", "text")
    logging.getLogger("messaging").info("not shown")
    logging.getLogger("messaging").warning("not shown either")
    logging.getLogger(READY_LOGGER).info("messaging broker listening on http://h:1 (data d)")
    assert streams.stderr.getvalue() == ""
    [line] = streams.lines(streams.stdout)
    assert line.endswith(" INFO messaging.ready: messaging broker listening on http://h:1 "
                         "(data d)")


def test_warnings_and_uncaught_exceptions_go_through_logging(streams: Streams) -> None:
    streams.setup("info", "json")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("an old option", DeprecationWarning, stacklevel=1)
    thread = threading.Thread(target=lambda: 1 / 0, name="worker")
    thread.start()
    thread.join(10)
    try:
        raise ValueError("nothing caught this")
    except ValueError:
        sys.excepthook(*sys.exc_info())
    entries = [json.loads(line) for line in streams.lines(streams.stderr)]
    assert [e["logger"] for e in entries] == ["py.warnings", "messaging", "messaging"]
    assert "DeprecationWarning: an old option" in entries[0]["message"]
    assert entries[1]["message"] == "uncaught ZeroDivisionError in worker: division by zero"
    assert "Traceback" in entries[1]["error"] and entries[1]["level"] == "ERROR"
    assert entries[2]["message"] == "uncaught ValueError: nothing caught this"
    assert entries[2]["level"] == "CRITICAL"
    assert streams.stdout.getvalue() == ""


def test_debug_shows_the_broker_s_detail_but_not_the_libraries(streams: Streams) -> None:
    streams.setup("debug", "text")
    logging.getLogger("messaging.broker.broker").debug("group commit: 1 commands")
    logging.getLogger("asyncio").debug("Using selector: EpollSelector")
    logging.getLogger("aiohttp.server").debug("connection made")
    assert [line.split(" ", 2)[2] for line in streams.lines(streams.stderr)] == [
        "DEBUG messaging.broker.broker: group commit: 1 commands"]


def test_grpc_core_is_silent_unless_the_environment_says(
        streams: Streams, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    streams.setup("info", "json")
    assert os.environ["GRPC_VERBOSITY"] == "NONE"
    monkeypatch.setenv("GRPC_VERBOSITY", "ERROR")
    streams.setup("info", "json")
    assert os.environ["GRPC_VERBOSITY"] == "ERROR"


@pytest.mark.parametrize(("level", "access_log", "enabled"), [
    ("info", AccessLogger, True), ("info", DebugAccessLogger, False),
    ("debug", DebugAccessLogger, True), ("warning", AccessLogger, False)])
def test_the_access_log_is_info_with_access_log_and_debug_without(
        streams: Streams, level: str, access_log: type[AccessLogger], enabled: bool) -> None:
    streams.setup(level, "text")
    assert access_log(logging.getLogger(ACCESS_LOGGER), "").enabled is enabled
