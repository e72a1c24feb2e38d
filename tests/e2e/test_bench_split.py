"""bench/experiments/split/run.py --quick: it runs every configuration (bare aiohttp, the
broker, the split with one and with two fronts), exits 0 and writes a positive rate and the
CPU of every process for each (figures are not checked: no timed assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.bench_run import run_quick

PROCESSES = {
    "bare": ["bare", "wrk"],
    "broker": ["broker", "wrk"],
    "split-1": ["front", "log", "wrk"],
    "split-2": ["front 1", "front 2", "log", "wrk"],
}


def test_quick_run_of_split(tmp_path: Path) -> None:
    done = run_quick("experiments/split/run.py", tmp_path)
    if done.returncode != 0 and "wrk is not installed" in done.stderr:
        pytest.skip(done.stderr.strip())  # the bench could not install it either
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    payload = json.loads((tmp_path / "results" / "split.json").read_text())
    for key, processes in PROCESSES.items():
        column = payload["configurations"][key]
        assert column["error"] == "", (key, column["error"])
        assert column["rate"] is not None and column["rate"] > 0, key
        assert list(column["processes"]) == processes, key
        for process in processes:
            assert column["processes"][process]["us_per_request"] is not None, (key, process)
    for key in ("broker", "split-1", "split-2"):
        assert payload["configurations"][key]["groups_per_s"], key
    names = [row["name"] for row in payload["rows"]]
    assert len(names) == 3 and all(row["value"] > 0 for row in payload["rows"]), names
    assert payload["conclusion"].startswith("**What this shows.**")
    section = (tmp_path / "RESULTS.md").read_text()
    assert section.count("<!-- split:start -->") == 1
    assert section.count("<!-- split:end -->") == 1
    assert (tmp_path / "results" / "split.png").stat().st_size > 0
    assert (tmp_path / "results" / "split-cpu.png").stat().st_size > 0
