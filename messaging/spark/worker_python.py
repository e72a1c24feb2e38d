"""Whether Spark's Python workers can run this data source, asked once when it is registered.

Spark starts its Python workers with ``$PYSPARK_PYTHON`` as it was when the SparkContext was
created (``python3`` from PATH when unset), not with the interpreter the driver runs in. A
system ``python3`` without pyarrow fails the first read deep inside a worker
(``PYTHON_DATA_SOURCE_ERROR … No module named 'pyarrow'``, a page of Java stack). Registration
runs on the driver, before any worker: there the worker interpreter is run once with a probe,
and a missing pyarrow or messaging package, or another Python version, is one line naming
the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache

from pyspark import SparkContext

from messaging.errors import ConfigError

#: What the probe may take: an interpreter's start and ``import pyarrow`` (about 0.3 s idle).
PROBE_TIMEOUT_S = 60.0
#: Run by the worker interpreter: its version, and what of ours it cannot import.
_PROBE = """\
import importlib.util, json, sys
missing = {}
try:
    import pyarrow
except Exception as err:
    missing["pyarrow"] = f"{type(err).__name__}: {err}"
if importlib.util.find_spec("messaging") is None:
    missing["messaging"] = "No module named 'messaging'"
print(json.dumps({"version": "%d.%d" % sys.version_info[:2], "missing": missing}))
"""


def check_active_context() -> None:
    """Check the workers of the driver's active SparkContext, if there is one (there is none
    in a worker, nor with Spark Connect, whose server starts the workers)."""
    context = SparkContext._active_spark_context
    if context is None:
        return
    check_worker_python(str(context.pythonExec))


@cache
def check_worker_python(python: str) -> None:
    """Raise :class:`ConfigError` unless ``python`` (Spark's ``pythonExec``) can import
    pyarrow and messaging, and is this interpreter's Python version. Only a pass is
    remembered: an interpreter fixed meanwhile passes the next registration."""
    fix = (f"set PYSPARK_PYTHON to sys.executable ({sys.executable}) before the SparkSession "
           "is created: os.environ[\"PYSPARK_PYTHON\"] = sys.executable")
    workers = f"Spark's Python workers run {python}{_whence(python)}"
    try:
        probe = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                               timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"{workers}, which cannot be run ({_last_line(err)}): {fix}") from err
    try:
        found = json.loads(probe.stdout.strip().splitlines()[-1])
        version, missing = str(found["version"]), dict(found["missing"])
    except (IndexError, ValueError, KeyError, TypeError) as err:
        said = _last_line(probe.stderr) or f"exit status {probe.returncode}"
        raise ConfigError(f"{workers}, which is not a Python this source can use ({said}): "
                          f"{fix}") from err
    if missing:
        names = [name for name in ("pyarrow", "messaging") if name in missing]
        raise ConfigError(f"{workers}, which cannot import {' and '.join(names)} "
                          f"({'; '.join(missing[name] for name in names)}): {fix}")
    ours = "{}.{}".format(*sys.version_info[:2])
    if version != ours:
        raise ConfigError(f"{workers}, which is Python {version}, and the driver {ours}: {fix}")


def _whence(python: str) -> str:
    """Where Spark took the worker interpreter from, as the fix depends on it."""
    if os.environ.get("PYSPARK_PYTHON") == python:
        return " ($PYSPARK_PYTHON)"
    if python == "python3":
        return " (PYSPARK_PYTHON was not set when the SparkContext was created)"
    return ""


def _last_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[-1] if lines else ""
