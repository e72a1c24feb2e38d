"""Two brokers side by side for an A/B run: this checkout ("after") and a git worktree of
another commit ("before"), each on 127.0.0.1 with its own data directory, stopped by PID."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from bench.harness.checkouts import Code, other_checkout, this_checkout, worktree
from bench.harness.procs import Proc, broker

ARMS = ("before", "after")


@contextlib.contextmanager
def ab_brokers(before: str, tmp: Path, *args: str,
               ) -> Iterator[tuple[dict[str, Code], dict[str, tuple[Proc, str]]]]:
    """The code of each arm and its running broker (``args``: its flags), under ``tmp``;
    each arm's copy of ``messaging`` is checked before its broker starts."""
    with worktree(before, tmp) as tree:
        codes = {"before": other_checkout("before", before, tree), "after": this_checkout()}
        procs: dict[str, tuple[Proc, str]] = {}
        try:
            for arm, code in codes.items():
                code.check_import()
                procs[arm] = broker(tmp / arm, *args, env=code.env, cwd=code.cwd)
            yield codes, procs
        finally:
            for proc, _url in procs.values():
                proc.stop()


def round_order(k: int) -> tuple[str, str]:
    """The arms of round ``k`` in the order they run: alternating, so neither always goes
    first."""
    return ARMS if k % 2 == 0 else ARMS[::-1]
