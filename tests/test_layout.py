"""Who may import what of bench/, read from the source with ``ast`` (nothing is imported).

A test imports from bench/ only its harness (``bench.harness``: the launchers of real
services such as SeaweedFS and etcd, and the helpers the benchmarks share), never a benchmark
family. A family (``bench/peers``, ``bench/experiments/split``, ...) imports the harness and
its own modules, never another family: what two families share belongs in the harness, and
the harness imports no family. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESS = "bench.harness"


def within(name: str, prefix: str) -> bool:
    """Whether the dotted ``name`` is ``prefix`` or inside it."""
    return name == prefix or name.startswith(prefix + ".")


def family(name: str) -> str | None:
    """The benchmark family of a dotted name (``bench.peers``, ``bench.experiments.split``);
    None for the harness and for what is in no family (``tests.*``, ``bench`` itself)."""
    parts = name.split(".")
    if parts[0] != "bench" or len(parts) < 2 or parts[1] == "harness":
        return None
    depth = 3 if parts[1] == "experiments" else 2
    return ".".join(parts[:depth]) if len(parts) >= depth else None


def imported(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """Line and dotted name of every import in ``source`` (the code of ``module``): ``from X
    import a`` as ``X.a``, a relative import resolved against the module's package."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                yield node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"


def strays(source: str, module: str, is_package: bool = False) -> list[str]:
    """``line: name`` of each import of bench/ that ``module`` may not make: anything but the
    harness and, for a module of a family, that family's own modules."""
    own = family(module)
    allowed = (HARNESS,) if own is None else (HARNESS, own)
    return [f"{line}: {name}" for line, name in imported(source, module, is_package)
            if within(name, "bench") and not any(within(name, p) for p in allowed)]


def modules(folder: str) -> Iterator[tuple[str, bool, Path]]:
    """Dotted name, whether it is a package's ``__init__``, and path of every module under
    ``folder`` of the repository."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        yield ".".join(parts[:-1] if is_package else parts), is_package, path


def layout_strays(folder: str) -> tuple[dict[str, list[str]], set[str]]:
    """Per module under ``folder``, its stray imports of bench/; and every name of bench/
    imported there (to show the walk saw them)."""
    found: dict[str, list[str]] = {}
    seen: set[str] = set()
    for module, is_package, path in modules(folder):
        source = path.read_text()
        seen.update(name for _line, name in imported(source, module, is_package)
                    if within(name, "bench"))
        if bad := strays(source, module, is_package):
            found[module] = bad
    return found, seen


def test_tests_import_from_bench_only_its_harness() -> None:
    found, seen = layout_strays("tests")
    assert found == {}
    assert any(within(name, HARNESS) for name in seen)  # the walk reads the tests' imports


def test_a_benchmark_family_imports_only_the_harness_and_its_own_modules() -> None:
    found, seen = layout_strays("bench")
    assert found == {}
    assert any(family(name) for name in seen) and any(within(n, HARNESS) for n in seen)


@pytest.mark.parametrize(("module", "source"), [
    ("tests.objects.conftest", "import bench.tiering.run"),
    ("tests.objects.conftest", "from bench.tiering import seaweedfs"),
    ("tests.objects.conftest", "from bench import peers"),
    ("tests.objects.conftest", "import bench"),
    ("tests.e2e.test_bench_peers", "def f() -> None:\n    from bench.peers.load import BATCH\n"),
    ("bench.groups.cluster", "from bench.cluster.load import nodes_ready"),
    ("bench.groups.cluster", "from ..cluster import etcd_members"),
    ("bench.soak.run", "import bench.cluster.load as load"),
    ("bench.experiments.split.run", "from bench.experiments.fanout.run import main"),
    ("bench.experiments.split.run", "from ...peers import cases"),
    ("bench.harness.procs", "from bench.peers.load import BATCH"),
    ("bench", "from bench.peers import run"),
])
def test_a_stray_import_is_found_in_every_form(module: str, source: str) -> None:
    assert strays(source, module, is_package=module == "bench") != []


@pytest.mark.parametrize(("module", "source"), [
    ("tests.objects.conftest", "from bench.harness.seaweedfs import SeaweedFS"),
    ("tests.objects.conftest", "import bench.harness.procs"),
    ("tests.e2e.test_bench_peers", "from tests.e2e.bench_run import ROOT, run_quick"),
    ("bench.groups.run", "from bench.groups.cluster import Config"),
    ("bench.groups.run", "from . import netns"),
    ("bench.groups.run", "from .cluster import Config"),
    ("bench.groups.cluster", "from bench.harness.etcd_members import Etcd"),
    ("bench.experiments.split.run", "from bench.experiments.split.wire import ANSWER"),
    ("bench.experiments.split.run", "from .wire import ANSWER"),
    ("bench.harness.loops", "from bench.harness.figures import Figure"),
    ("bench.harness.loops", "from .figures import Figure"),
])
def test_the_harness_and_a_familys_own_modules_are_allowed(module: str, source: str) -> None:
    assert strays(source, module) == []
