"""bench/kafka/run.py --quick: it runs the four loads (Kafka produce and consume, HTTP batch
publish, Conn) against one broker, exits 0 and writes a positive rate for each beside its
baseline (figures are not checked: no timed assertions)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.bench_run import run_quick


def test_quick_run_of_bench_kafka(tmp_path: Path) -> None:
    done = run_quick("kafka/run.py", tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    payload = json.loads((tmp_path / "results" / "kafka.json").read_text())
    rows = {row["baseline_name"]: row for row in payload["rows"]}
    assert set(rows) == {"HTTP batch publish", "Conn from index 0"}
    assert all(row["value"] > 0 and row["baseline"] > 0 for row in rows.values())
    assert "Kafka clients beside HTTP" in (tmp_path / "RESULTS.md").read_text()
    assert (tmp_path / "results" / "kafka.png").exists()
