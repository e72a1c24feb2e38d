"""A former holder's copy of a group: deleted all or nothing, also when killed midway."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from messaging.cluster.node import find_retired, remove_group
from messaging.files import DELETING


def make_group(root: Path, group: int, revision: int, files: int = 20) -> Path:
    path = root / str(group)
    (path / "topics" / "7").mkdir(parents=True)
    for k in range(files):
        (path / "topics" / "7" / f"{k:020d}.seg").write_bytes(b"x" * 100)
    (path / "cluster.json").write_text(json.dumps({"revision": revision, "index": 1}))
    return path


def test_retired_groups_are_found_with_their_revisions(tmp_path: Path) -> None:
    make_group(tmp_path, 1, 40)
    make_group(tmp_path, 3, 7)
    (tmp_path / "2").mkdir()  # no checkpoint yet: replayed from the start if held again
    make_group(tmp_path, 9, 1)  # past the number of groups: not ours
    assert find_retired(tmp_path, 4) == {1: 40, 2: 0, 3: 7}
    assert find_retired(tmp_path / "missing", 4) == {}


def test_a_deleted_group_leaves_nothing(tmp_path: Path) -> None:
    path = make_group(tmp_path, 2, 5)
    remove_group(path)
    assert list(tmp_path.iterdir()) == []


_KILLED_MIDWAY = """
import os, shutil, signal, sys
from pathlib import Path
from messaging.cluster import node

removed = []
real_unlink = os.unlink

def unlink(path, *args, **kwargs):  # shutil.rmtree's deletions: killed -9 after five
    real_unlink(path, *args, **kwargs)
    removed.append(path)
    if len(removed) == 5:
        os.kill(os.getpid(), signal.SIGKILL)

os.unlink = unlink
node.remove_group(Path(sys.argv[1]))
"""


@pytest.mark.e2e  # slow: over a third of a second
def test_a_deletion_killed_midway_leaves_nothing_under_the_groups_name(tmp_path: Path) -> None:
    """kill -9 while the tree is being deleted: the group's name is already gone (a node
    that holds the group again replays it or installs a snapshot, never opens half a copy),
    and the next start removes the rest."""
    path = make_group(tmp_path, 2, 5)
    make_group(tmp_path, 3, 9)
    done = subprocess.run([sys.executable, "-c", _KILLED_MIDWAY, str(path)], timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not path.exists()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(DELETING)]
    assert len(left) == 1 and any((tmp_path / left[0]).rglob("*.seg"))  # cut short
    assert find_retired(tmp_path, 4) == {3: 9}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3"]
