"""The package as a user installs it: ``python -m build`` makes a wheel and an sdist that
``twine check`` passes; the wheel installs into a fresh virtual environment (no system site
packages, dependencies through pip's normal client and cache) and its ``messaging`` command
runs a broker that answers ``/healthz`` and a publish/tail round trip.

About 30 s on 2 cores with a warm pip cache (more when the cores are busy): the two isolated
builds, then the dependencies' install.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def run(*args: str | Path, timeout: float, cwd: Path | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; its output is in the assertion message if it fails."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                            timeout=timeout, cwd=cwd)
    assert result.returncode == 0, (f"{' '.join(map(str, args))} exited "
                                    f"{result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def tracked_package_files() -> set[str]:
    """The package's files as git tracks them (what a clone holds)."""
    listed = run("git", "ls-files", "messaging", cwd=REPO, timeout=30).stdout.split()
    return {name for name in listed if (REPO / name).is_file()}


def test_wheel_and_sdist_build_check_install_and_run(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, REPO, timeout=300)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    run(sys.executable, "-m", "twine", "check", "--strict", wheels[0], sdists[0], timeout=60)

    package = tracked_package_files()
    assert "messaging/__init__.py" in package
    with zipfile.ZipFile(wheels[0]) as wheel:
        in_wheel = set(wheel.namelist())
    sources = {name for name in package if name.endswith(".c")}
    assert sources, "the package has C modules"
    assert package - sources - in_wheel == set(), "tracked package files missing from the wheel"
    for source in sources:  # each C module is in the wheel built, not as its source
        built = source.removesuffix(".c") + ".cpython-"
        assert any(name.startswith(built) and name.endswith(".so") for name in in_wheel), source
    with tarfile.open(sdists[0]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        in_sdist = {name.removeprefix(f"{top}/") for name in sdist.getnames()}
    assert package - in_sdist == set(), "tracked package files missing from the sdist"
    assert {"pyproject.toml", "README.md"} <= in_sdist
    junk = {name for name in in_sdist
            if name.startswith(("tests/", "bench/", "conformance/", "data/"))
            or "__pycache__" in name or name.endswith((".pyc", ".log"))}
    assert junk == set(), "the sdist holds what building the wheel does not need"

    # The fresh venv gets no pip of its own (ensurepip takes longer than the install): this
    # environment's pip installs into it (--python), from the index and pip's cache as usual.
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, timeout=120)
    run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet",
        wheels[0], timeout=600)
    # The installed copy is what runs, not the checkout (cwd is outside it).
    where = run(venv / "bin" / "python", "-c", "import messaging; print(messaging.__file__)",
                cwd=tmp_path, timeout=60).stdout.strip()
    assert Path(where).is_relative_to(venv), where

    messaging = str(venv / "bin" / "messaging")
    broker = BrokerProcess(tmp_path / "data", launcher=[messaging])
    try:
        broker.start()
        with urllib.request.urlopen(f"{broker.url}/healthz", timeout=10) as answer:
            assert answer.status == 200
            assert json.load(answer)["status"] == "ok"
        published = run(messaging, "publish", broker.url, "1", "hello from a wheel",
                        cwd=tmp_path, timeout=30)
        assert published.stdout.split() == ["1"], published.stdout
        tailed = run(messaging, "tail", broker.url, "1", cwd=tmp_path, timeout=30)
        assert "hello from a wheel" in tailed.stdout, tailed.stdout
    finally:
        code = broker.terminate(timeout=30) if broker.proc is not None else None
        broker.kill()
    assert code == 0, broker.log.read_text()
