"""bench/peers/run.py --quick against our broker alone: it runs every workload, exits 0 and
writes a JSON figure for each (figures are not checked: no timed assertions); and its --ab
mode, our broker before and after append times."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from tests.e2e.bench_run import ROOT, run_quick

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


def test_quick_ab_run_starts_the_old_code_and_this_checkout(tmp_path: Path) -> None:
    """--ab: the broker of the commit before append times (a git worktree, removed again)
    against this checkout; each imported its own messaging, only the new one wrote time
    indexes, and every workload (publish → subscriber too) has a figure for both."""
    done = run_quick("peers/run.py", tmp_path, "--ab")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    payload = json.loads((tmp_path / "results" / "peers_ab.json").read_text())
    assert "tree-1b2e5e1" in payload["code"]["before"]["imported"]
    assert payload["code"]["after"]["imported"] == str(ROOT / "messaging" / "__init__.py")
    assert payload["time_files"]["before"] == 0 < payload["time_files"]["after"]
    for workload in ("single", "batch", "latency", "delivery"):
        for arm in ("before", "after"):
            median = payload["workloads"][workload][arm]["median"]
            assert median is not None and median > 0, (workload, arm)
    assert len(payload["rows"]) == 8
    assert (tmp_path / "RESULTS.md").read_text().count("<!-- peers_ab:start -->") == 1
    tree = Path(payload["code"]["before"]["imported"]).parents[1]
    assert str(tree) not in worktree_list() and not tree.exists()  # removed again


def worktree_list() -> set[str]:
    """The repository's worktrees (paths), other sessions' included."""
    out = subprocess.run(["git", "-C", str(ROOT), "worktree", "list", "--porcelain"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")}


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


def test_a_doubled_p50_is_a_regression() -> None:
    """--ab fails (outside --quick) when the single-publish p50 after is twice before's."""
    from bench.harness.figures import doubled_p50

    assert doubled_p50(1.9, 1.0) is None
    assert doubled_p50(0.5, 1.0) is None
    assert doubled_p50(None, 1.0) is None and doubled_p50(1.0, None) is None
    message = doubled_p50(2.4, 1.2)
    assert message is not None and message.startswith("REGRESSION: single publish p50 2.400 ms")
    message = doubled_p50(1.0, 0.5, what="publish → subscriber")
    assert message is not None and message.startswith("REGRESSION: publish → subscriber p50")
