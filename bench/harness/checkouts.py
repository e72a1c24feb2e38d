"""Other checkouts of this repository for A/B benchmarks: a git worktree of a commit, and how
to start Python on it so that it imports that checkout's ``messaging`` (its directory first
on ``PYTHONPATH`` and as the working directory: ``python -m`` puts the working directory
before ``PYTHONPATH`` and the editable install)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.harness.procs import ROOT, child_env

GIT_TIMEOUT = 120


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          timeout=GIT_TIMEOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()[:300]}")
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(rev: str, parent: Path) -> Iterator[Path]:
    """A detached git worktree of ``rev`` under ``parent``, removed afterwards."""
    path = parent / f"tree-{rev}"
    git("worktree", "add", "--detach", str(path), rev)
    try:
        yield path
    finally:
        try:
            git("worktree", "remove", "--force", str(path))
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            print(f"  could not remove the worktree {path}: {err}", flush=True)
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                git("worktree", "prune")


@dataclass
class Code:
    """Where one broker's code comes from: the commit, and how to start Python on it."""

    arm: str
    rev: str  # the commit (short), with "+ changes" when the checkout has uncommitted ones
    tree: Path  # the checkout whose messaging/ it must import
    env: dict[str, str]
    cwd: Path
    imported: str = ""  # messaging.__file__ as that Python imports it

    def check_import(self) -> None:
        """Ask the same interpreter, environment and directory which messaging it imports;
        raise unless it is this checkout's."""
        done = subprocess.run([sys.executable, "-c", "import messaging; print(messaging.__file__)"],
                              capture_output=True, text=True, env=self.env, cwd=self.cwd,
                              timeout=60, check=False)
        self.imported = done.stdout.strip()
        want = self.tree / "messaging" / "__init__.py"
        if not self.imported or Path(self.imported).resolve() != want.resolve():
            raise RuntimeError(f"the {self.arm} broker would import {self.imported!r}, not "
                               f"{want} ({done.stderr.strip()[-300:]})")


def other_checkout(arm: str, rev: str, tree: Path) -> Code:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)}
    return Code(arm, git("rev-parse", "--short", rev), tree, env, tree)


def this_checkout() -> Code:
    changed = git("status", "--porcelain", "--", "messaging").splitlines()
    rev = git("rev-parse", "--short", "HEAD") + (
        f" plus uncommitted changes to {len(changed)} files under messaging/" if changed else "")
    return Code("after", rev, ROOT, child_env(), ROOT)
