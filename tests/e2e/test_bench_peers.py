"""bench/peers/run.py --quick against our broker alone: it runs every workload, exits 0 and
writes a JSON figure for each (figures are not checked: no timed assertions)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.e2e.bench_run import run_quick

WORKLOADS = {
    "single": ["ours"],
    "batch": ["ours", "ceiling"],
    "consume": ["ours", "batches"],
    "latency": ["ours"],
    "fanout": ["ours-10", "ours-100"],
    "durable-streams": ["append", "catchup"],
}


def test_quick_run_of_ours(tmp_path: Path) -> None:
    done = run_quick("peers/run.py", tmp_path, "--only", "ours")
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
    from bench.harness.loops import loops

    calls = 0

    async def body() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        return 10

    figure = await loops(4, 0.2, body)
    assert round(figure.value * figure.seconds) == calls * 10
