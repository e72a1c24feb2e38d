"""What every benchmark run is made of, and the command line the benchmarks share.

A family's settings extend :class:`Settings` with its own sizes. On the command line
``--quick`` picks the family's small settings (seconds, not minutes), ``--rounds`` overrides
the rounds, ``--out`` puts results/ and RESULTS.md under another directory (a quick run
without it writes under a temporary one: see :func:`bench.harness.results.results_under`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar


@dataclass
class Settings:
    """Rounds of measured runs (interleaved A B … B A) and the seconds one run lasts."""

    rounds: int = 3
    seconds: float = 3.0


S = TypeVar("S", bound=Settings)


def parser(doc: str, quick: str, *, rounds: bool = True) -> argparse.ArgumentParser:
    """A command line with ``--quick`` (what it shrinks: ``quick``), ``--rounds`` (unless
    ``rounds`` is false) and ``--out``; its description is the first paragraph of ``doc``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"{quick}; without --out its results go to a temporary directory")
    if rounds:
        p.add_argument("--rounds", type=int, help="rounds (overrides the default)")
    p.add_argument("--out", type=Path, help="write results/ and RESULTS.md under this "
                   "directory instead of bench/")
    return p


def with_rounds(s: S, args: argparse.Namespace) -> S:
    """``s`` with the rounds asked for on the command line (at least one), if any."""
    if getattr(args, "rounds", None):
        s.rounds = max(1, args.rounds)
    return s


def only(p: argparse.ArgumentParser, value: str, choices: Sequence[str],
         what: str) -> tuple[str, ...]:
    """A comma-separated ``--only`` list, each of ``choices`` (a usage error otherwise)."""
    chosen = tuple(x.strip() for x in value.split(",") if x.strip())
    unknown = set(chosen) - set(choices)
    if unknown:
        p.error(f"unknown {what} {sorted(unknown)}: choose from {','.join(choices)}")
    return chosen
