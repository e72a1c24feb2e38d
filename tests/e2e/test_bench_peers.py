"""bench/bench_peers.py --quick against our broker alone: it runs every workload, exits 0 and
writes a JSON figure for each (figures are not checked: no timed assertions)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = {
    "single": ["ours"],
    "batch": ["ours", "ceiling"],
    "consume": ["ours", "batches"],
    "latency": ["ours"],
    "fanout": ["ours-10", "ours-100"],
    "durable-streams": ["append", "catchup"],
}


def test_quick_run_of_ours(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_peers.py"), "--quick", "--only", "ours",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=150, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "BENCH_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    payload = json.loads((tmp_path / "results" / "peers.json").read_text())
    for workload, keys in WORKLOADS.items():
        for key in keys:
            case = payload["workloads"][workload][key]
            assert case["error"] == "", (workload, key, case["error"])
            assert case["median"] is not None and case["median"] > 0, (workload, key)
    assert (tmp_path / "RESULTS.md").read_text().count("<!-- peers:start -->") == 1
    assert (tmp_path / "results" / "peers-consume.png").stat().st_size > 0


async def test_concurrent_loops_count_every_item() -> None:
    """``loops`` adds up what every concurrent loop handled (``items += await body()`` read
    the total before the await and lost the other loops' counts: rates came out ~4x low)."""
    from bench.peers_load import loops

    calls = 0

    async def body() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        return 10

    figure = await loops(4, 0.2, body)
    assert round(figure.value * figure.seconds) == calls * 10
