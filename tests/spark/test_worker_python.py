"""Registering the data source checks Spark's worker interpreter (messaging.spark.worker_python):
a SparkContext stand-in names the interpreter, as a real one's ``pythonExec`` does, so no JVM
starts; the interpreters are this one, a wrapper that runs it without its site-packages (no
pyarrow, as a system python3), and one that does not exist."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark import SparkContext

from messaging.errors import ConfigError
from messaging.spark import MessagingDataSource
from messaging.spark.worker_python import check_worker_python


class Context:
    """What the check reads of a SparkContext."""

    def __init__(self, python_exec: str) -> None:
        self.pythonExec = python_exec


@pytest.fixture(autouse=True)
def fresh_checks() -> Iterator[None]:
    check_worker_python.cache_clear()
    yield
    check_worker_python.cache_clear()


def without_site_packages(tmp_path: Path) -> str:
    """An interpreter like a system ``python3``: this Python without this environment's
    packages (so no pyarrow)."""
    wrapper = tmp_path / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -I "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def registering_with(monkeypatch: pytest.MonkeyPatch, python: str) -> str:
    """What ``spark.dataSource.register(MessagingDataSource)`` does first, with a
    SparkContext whose workers run ``python``."""
    monkeypatch.setattr(SparkContext, "_active_spark_context", Context(python))
    return MessagingDataSource.name()


@pytest.mark.e2e  # imports pyarrow in a new interpreter: about a third of a second
def test_this_interpreter_passes_and_is_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(2):
        assert registering_with(monkeypatch, sys.executable) == "messaging"
    assert check_worker_python.cache_info().misses == 1


def test_an_interpreter_without_pyarrow_fails_naming_pyspark_python(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    python = without_site_packages(tmp_path)
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    with pytest.raises(ConfigError) as failed:
        registering_with(monkeypatch, python)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"Spark's Python workers run {python} ($PYSPARK_PYTHON), which "
                              "cannot import ")
    assert "No module named 'pyarrow'" in message
    assert f"set PYSPARK_PYTHON to sys.executable ({sys.executable})" in message


def test_the_default_python3_says_pyspark_python_was_not_set(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(without_site_packages(tmp_path))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    with pytest.raises(ConfigError, match=r"^Spark's Python workers run python3 \(PYSPARK_PYTHON "
                       r"was not set when the SparkContext was created\), which cannot import"):
        registering_with(monkeypatch, "python3")


def test_a_missing_interpreter_fails_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(ConfigError) as failed:
        registering_with(monkeypatch, missing)
    message = str(failed.value)
    assert "\n" not in message
    assert f"{missing}, which cannot be run" in message and "set PYSPARK_PYTHON" in message


@pytest.mark.e2e  # imports pyarrow once it passes
def test_an_interpreter_that_failed_is_asked_again(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """Once pyarrow is installed there, registering again passes, without a restart."""
    python = without_site_packages(tmp_path)
    with pytest.raises(ConfigError):
        registering_with(monkeypatch, python)
    Path(python).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    assert registering_with(monkeypatch, python) == "messaging"


def test_without_a_spark_context_nothing_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's workers ask the source's name too: they have no SparkContext."""
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    assert MessagingDataSource.name() == "messaging"
    assert check_worker_python.cache_info().misses == 0


@pytest.mark.e2e
def test_registering_in_a_real_session_fails_with_the_fix(
        spark, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through Spark's own ``spark.dataSource.register``, with the session's workers set to an
    interpreter without pyarrow."""
    python = without_site_packages(tmp_path)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python)
    with pytest.raises(ConfigError, match=r"cannot import pyarrow .*set PYSPARK_PYTHON to "
                                          r"sys\.executable"):
        spark.dataSource.register(MessagingDataSource)
