"""bench/experiments/latency_budget/run.py --quick: it runs every measurement whose tools are
here, exits 0 and writes a positive p50 and p99 for each (figures are not checked: no timed
assertions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.e2e.bench_run import run_quick

MEASUREMENTS = {
    "disk": ["disk-append", "disk-zeroed", "disk-fallocate", "disk-dsync"],
    "handoff": ["handoff", "handoff-disk"],
    "floor": ["floor-inline", "floor-thread", "floor-inline-prealloc", "floor-thread-prealloc"],
    "ours": ["ours", "ours-nofsync"],
    "redis": ["redis"],
}


def test_quick_run(tmp_path: Path) -> None:
    groups = [g for g in MEASUREMENTS if g != "redis" or shutil.which("redis-server")]
    done = run_quick("experiments/latency_budget/run.py", tmp_path, "--only", ",".join(groups))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    payload = json.loads((tmp_path / "results" / "latency.json").read_text())
    measured = payload["measurements"]
    for group in groups:
        for key in MEASUREMENTS[group]:
            assert measured[key]["error"] == "", (key, measured[key]["error"])
            assert measured[key]["p50_us"] > 0 and measured[key]["p99_us"] > 0, key
    rows = {row["name"]: row for row in payload["rows"]}
    assert any(name.startswith("ours p50 vs Redis p50") for name in rows)
    assert all(row["value"] > 0 for row in rows.values())
    assert (tmp_path / "RESULTS.md").read_text().count("<!-- latency:start -->") == 1
    assert (tmp_path / "results" / "latency.png").stat().st_size > 0
    assert (tmp_path / "results" / "latency-budget.png").stat().st_size > 0
