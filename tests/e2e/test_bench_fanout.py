"""bench/experiments/fanout/run.py --quick: both brokers (and Redis when installed) run, every
message reaches every subscriber, and the rows and the broker's lag figures are written
(figures are not checked: no timed assertions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.e2e.bench_run import run_quick


def test_quick_run(tmp_path: Path) -> None:
    done = run_quick("experiments/fanout/run.py", tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    payload = json.loads((tmp_path / "results" / "fanout.json").read_text())
    cases = payload["cases"]
    expected = ["ours", "ours-norest"] + (["redis"] if shutil.which("redis-server") else [])
    for key in expected:
        case = cases[key]
        assert case["errors"] == [] and case["runs"] == 1, (key, case["errors"])
        assert case["all_delivered"], key
        assert case["p50"] > 0 and case["p99"] > 0 and case["publish_p50"] > 0, key
    for key in ("ours", "ours-norest"):
        assert cases[key]["broker_lag_p99"] > 0, key  # the broker's histogram was read
    assert all(row["value"] > 0 for row in payload["rows"])
    assert (tmp_path / "RESULTS.md").read_text().count("<!-- fanout:start -->") == 1
    assert (tmp_path / "results" / "fanout.png").stat().st_size > 0
