"""Running a benchmark script the way the smoke tests do: ``--quick``, its results and its
servers' data under the test's temporary directory, never the recorded bench/RESULTS.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_quick(script: str, tmp_path: Path, *args: str,
              timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script> --quick ARGS --out tmp_path`` from the repository root."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", *args, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "BENCH_DIR": str(tmp_path)})
