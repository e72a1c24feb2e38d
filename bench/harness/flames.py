"""py-spy samples of a running process and their summary: the frames where the most samples
stopped (self time), as a markdown table for bench/RESULTS.md."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r":\d+\)")


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter, or on PATH (None: not installed)."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


def record(pid: int, seconds: float, out: Path, *, rate: int = 250) -> subprocess.Popen[bytes]:
    """Start sampling ``pid`` for ``seconds`` into ``out`` (py-spy's raw format): only
    threads holding the GIL, without pausing the process (the figures beside stay honest)."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install -e '.[bench]')")
    return subprocess.Popen([exe, "record", "--gil", "--nonblocking", "-r", str(rate),
                             "-d", str(max(1, round(seconds))), "-f", "raw", "-o", str(out),
                             "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_self(raw: Path, count: int = 15) -> tuple[int, list[tuple[str, float]]]:
    """The samples in ``raw`` and its ``count`` frames with the most self time, each with its
    share of the samples."""
    frames: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        total += int(samples)
        frames[_LINE.sub(")", stack.split(";")[-1])] += int(samples)
    return total, [(frame, n / total) for frame, n in frames.most_common(count)] if total \
        else []


def table(raw: Path, title: str, count: int = 15) -> str:
    """A markdown table of :func:`top_self` under ``title``."""
    total, top = top_self(raw, count)
    lines = [f"{title} ({total} samples while holding the GIL):", "",
             "| self | frame |", "|---|---|"]
    lines += [f"| {share:.1%} | `{frame}` |" for frame, share in top]
    return "\n".join(lines)
