"""Smoke test of bench/scaling/run.py: a ``--quick`` run into a temporary directory ends
well and records every curve's points, the memory figures and a plot per curve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CURVES = {
    "batch": ("msg_per_s", "p99_ms", "disk_msg_per_s", "bare_msg_per_s", "cpu_us_per_msg",
              "bytes_per_fsync"),
    "size": ("msg_per_s", "mib_per_s", "p99_ms", "disk_mib_per_s", "cpu_us_per_msg"),
    "topics": ("msg_per_s", "p99_ms", "batch_msg_per_s", "batch_p99_ms", "disk_msg_per_s",
               "descriptors"),
    "subscribers": ("delivery_p50_ms", "delivery_p99_ms", "complete", "deliveries_per_s",
                    "cpu_share"),
}


def test_quick_run_records_every_curve(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "scaling" / "run.py"), "--quick",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=170, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = tmp_path / "out" / "results"
    payload = json.loads((results / "scaling.json").read_text())
    for curve, keys in CURVES.items():
        points = payload["curves"][curve]
        assert len(points) >= 2, curve
        for point in points:
            assert "x" in point and all(key in point for key in keys), (curve, point)
            assert point["msg_per_s" if "msg_per_s" in keys else "deliveries_per_s"] > 0
        assert (results / f"scaling-{curve}.png").stat().st_size > 0
        assert payload["sentences"][curve]
    memory = payload["memory"]
    assert memory["idle_subscriber"]["per_subscriber_kib"] is not None
    assert memory["idle_topic"]["per_topic_kib"] is not None
    assert memory["idle_topic"]["per_topic_restart_kib"] is not None
    section = (tmp_path / "out" / "RESULTS.md").read_text()
    assert "<!-- scaling:start -->" in section and "results/scaling-topics.png" in section
