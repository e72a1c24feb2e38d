"""The Durable Streams conformance suite (``@durable-streams/server-conformance-tests``, a
Vitest suite in conformance/) against a real broker process.

A broker is started as a subprocess on a free port of 127.0.0.1, ``conformance/run.mjs`` runs
the suite against its root URL (the suite requests ``/v1/stream/...``), and Vitest's JSON
report decides: every test that ran must have passed. Skipped tests are reported, not failed.

Needs Node 20+ and the suite installed: ``make conformance`` (``make test`` does it). To run
only some of the suite's tests, set ``CONFORMANCE_PATTERN`` to a Vitest ``-t`` pattern, e.g.
``CONFORMANCE_PATTERN='SSE Mode' .venv/bin/python -m pytest tests/e2e/test_conformance.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = ROOT / "conformance"
RUNNER = CONFORMANCE / "run.mjs"
INSTALLED = CONFORMANCE / "node_modules" / ".package-lock.json"
SUITE_TIMEOUT = 600.0
"""Seconds the whole suite may take; the reference server needs about 40."""


@dataclass
class CaseOutcome:
    """One test of the suite as the JSON report gives it."""

    title: str
    """The full title path, "Describe > ... > test"."""
    status: str
    """``passed``, ``failed``, ``skipped``, ``pending`` or ``todo``."""
    duration_ms: float | None
    failure_messages: list[str] = field(default_factory=list)

    def first_error_line(self) -> str:
        """The first non-empty line of the first error, made readable for a timeout."""
        for message in self.failure_messages:
            for line in message.splitlines():
                if line.strip():
                    if line.strip() == "Error: STACK_TRACE_ERROR":
                        # Vitest 4 keeps its stack-capturing placeholder as the first line
                        # of a timed-out test's (or hook's) error instead of the message.
                        took = (f" after {self.duration_ms:.0f} ms"
                                if self.duration_ms is not None else "")
                        return f"timed out{took} (Vitest's test or hook timeout)"
                    return line.strip()
        return "(no error message)"


@dataclass
class ConformanceReport:
    """The parts of Vitest's JSON report (the Jest-compatible format) this test uses."""

    tests: list[CaseOutcome]
    file_errors: list[str]
    """Errors of a whole test file (a failed import or hook) that no test carries."""

    @classmethod
    def load(cls, path: Path) -> ConformanceReport:
        """Read the report ``run.mjs`` wrote with ``--output``."""
        report: dict[str, Any] = json.loads(path.read_text())
        tests: list[CaseOutcome] = []
        file_errors: list[str] = []
        for file in report.get("testResults", []):
            for result in file.get("assertionResults", []):
                tests.append(CaseOutcome(
                    title=" > ".join([*result.get("ancestorTitles", []), result["title"]]),
                    status=result["status"],
                    duration_ms=result.get("duration"),
                    failure_messages=list(result.get("failureMessages") or [])))
            if file.get("status") == "failed" and file.get("message"):
                file_errors.append(f"{file.get('name', '?')}: {file['message'].strip()}")
        return cls(tests, file_errors)

    def with_status(self, *statuses: str) -> list[CaseOutcome]:
        """The tests whose status is one of ``statuses``."""
        return [test for test in self.tests if test.status in statuses]

    def counts(self) -> str:
        """"<n> passed, <n> failed, <n> skipped (of <n>)"."""
        return (f"{len(self.with_status('passed'))} passed, "
                f"{len(self.with_status('failed'))} failed, "
                f"{len(self.with_status('skipped', 'pending', 'todo'))} skipped "
                f"(of {len(self.tests)})")


def run_suite(base_url: str, report: Path, log: Path, pattern: str | None = None,
              timeout: float = SUITE_TIMEOUT) -> tuple[int, float]:
    """Run conformance/run.mjs against ``base_url``; returns its exit code and the seconds
    it took. Console output goes to ``log``; on timeout the runner and its Vitest process
    (its own process group) are stopped and ``AssertionError`` is raised."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("the conformance suite needs Node 20+ and npm on PATH: install them "
                    "and run make conformance")
    args = [node, str(RUNNER), base_url, "--quiet", "--output", str(report)]
    if pattern:
        args += ["-t", pattern]
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=CONFORMANCE, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            raise AssertionError(
                f"the conformance suite did not finish in {timeout:.0f} s; "
                f"output: {log}\n{_tail(log)}") from None
    return code, time.monotonic() - started


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop the runner we started: SIGTERM (it passes it on to Vitest), then SIGKILL to the
    process group it leads (``start_new_session``), which holds only it and its children."""
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    with contextlib.suppress(ProcessLookupError):  # the group is gone once all have exited
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def conformance_installed() -> Iterator[None]:
    """Fail with a hint unless ``make conformance`` has installed the suite."""
    if not INSTALLED.exists():
        pytest.fail("the conformance suite is not installed: run make conformance "
                    "(Node 20+ and npm needed)")
    yield


@pytest.mark.timeout(SUITE_TIMEOUT + 60)
def test_durable_streams_conformance(broker_process, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str],
                                     conformance_installed: None) -> None:
    """Every conformance test that runs against a broker process passes."""
    report_path = tmp_path / "conformance.json"
    log = tmp_path / "conformance.log"
    pattern = os.environ.get("CONFORMANCE_PATTERN") or None
    # The suite runs with Vitest's 5 s test timeout, and two of its tests wait for a long-poll
    # to time out: the broker's long-poll timeout must be shorter than that.
    broker = broker_process(tmp_path / "data", "--long-poll-timeout", "3s").start()
    try:
        code, seconds = run_suite(broker.url, report_path, log, pattern)
    finally:
        broker_exit = broker.terminate()  # SIGTERM to the PID we started, then reaped

    assert report_path.exists(), (
        f"the conformance runner wrote no JSON report (exit {code}); output: {log}\n"
        f"{_tail(log)}")
    report = ConformanceReport.load(report_path)
    summary = (f"Durable Streams conformance against {broker.url}"
               f"{f' (-t {pattern!r})' if pattern else ''}: {report.counts()} in "
               f"{seconds:.1f} s; JSON report {report_path}; broker log {broker.log} "
               f"(exit code {broker_exit})")
    skipped = report.with_status("skipped", "pending", "todo")
    with capsys.disabled():  # the counts and skipped tests show in every run, not only failed
        print(f"\n{summary}")
        if skipped and not pattern:
            print(f"skipped: {'; '.join(test.title for test in skipped)}")

    failed = report.with_status("failed")
    problems = [f"  {test.title}: {test.first_error_line()}" for test in failed]
    problems += [f"  (test file) {error.splitlines()[0]}" for error in report.file_errors]
    if problems:  # pytest.fail: the message alone, without the assertion's repr of the list
        pytest.fail(f"{summary}\n{len(failed)} failed:\n" + "\n".join(problems)
                    + f"\nconsole output: {log}", pytrace=False)
    ran = len(report.tests) - len(skipped)
    assert ran > 0, f"{summary}\nno test ran; output:\n{_tail(log)}"
    assert code == 0, (f"{summary}\nevery test passed but Vitest exited with {code} "
                       f"(an unhandled error?); output:\n{_tail(log)}")
    assert broker_exit == 0, f"{summary}\nthe broker did not stop cleanly on SIGTERM"
