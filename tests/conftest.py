"""Shared fixtures and helpers."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from blockbuster import BlockBuster, blockbuster_ctx
from hypothesis import settings

from messaging.broker.broker import ApplyResult, Broker
from messaging.config import BrokerConfig
from messaging.errors import MessagingError
from messaging.frames import Message, encode_many
from messaging.http.server import BrokerServer
from tests.examples import examples

settings.register_profile("messaging", max_examples=examples(100))
settings.load_profile("messaging")


def apply(broker: Broker, command: bytes) -> ApplyResult:
    """Apply one command as its own group, not fsynced (as the logs do without --fsync)."""
    result = broker.write_group([command], durable=False)[0]
    if isinstance(result, MessagingError):
        raise result
    return result


def frames(topic: int, indexes: Iterable[int], data: bytes | None = None) -> bytes:
    """Frames for ``topic`` with the given indexes; data defaults to a per-index payload."""
    return encode_many(
        Message(i, 1, topic, data if data is not None else f"message {i}".encode())
        for i in indexes
    )


# -- the event loop must never block -------------------------------------------------------


@pytest.fixture(autouse=True)
def blockbuster(request: pytest.FixtureRequest) -> Iterator[BlockBuster | None]:
    """Fail any test in which messaging code blocks the event loop (as aiohttp's tests do).

    Blocking calls (file I/O, sleeps, a contended lock, ...) made from the ``messaging``
    package on a thread that runs an event loop raise ``BlockingError``. Only where a loop
    can run: a coroutine test, or a test in a module that uses asyncio (``asyncio.run``);
    patching every blocking call costs each of the other tests about 3 ms for nothing.
    """
    module = getattr(request, "module", None)
    if not (inspect.iscoroutinefunction(getattr(request, "function", None))
            or (module is not None and "asyncio" in vars(module))):
        yield None
        return
    with blockbuster_ctx("messaging") as bb:
        yield bb


# -- servers --------------------------------------------------------------------------------


StartServer = Callable[..., Awaitable[BrokerServer]]


@pytest.fixture
async def start_server(tmp_path: Path) -> AsyncIterator[StartServer]:
    """Start in-process brokers on 127.0.0.1 with a free port; all are stopped at the end."""
    servers: list[BrokerServer] = []

    async def start(**options: Any) -> BrokerServer:
        options.setdefault("data", tmp_path / f"data{len(servers)}")
        server = BrokerServer(BrokerConfig(host="127.0.0.1", port=0, **options))
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        await server.stop()


@pytest.fixture
async def server(start_server: StartServer) -> BrokerServer:
    """One broker with default settings."""
    return await start_server()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP session (no client library) for testing the API itself."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


#: How long a broker process may take to print its startup line. A node of a cluster of topic
#: groups prints it once it has joined etcd and opened its groups: on a machine whose other
#: processes use a core that took more than 20 s, and an idle one needs 1-3 s.
START_WITHIN = 60.0


class BrokerProcess:
    """``messaging broker`` in a real subprocess, bound to a free port on 127.0.0.1.

    ``nofile``, when given, is the soft RLIMIT_NOFILE the broker runs under (``ulimit -n``).
    """

    def __init__(self, data: Path, *args: str, port: int = 0, nofile: int | None = None,
                 launcher: list[str] | None = None, env: dict[str, str] | None = None,
                 host: str = "127.0.0.1") -> None:
        self.data = data
        self.args = list(args)
        self.port = port
        self.host = host  # another address only for a broker in a test's network namespace
        self.nofile = nofile
        #: What runs ``messaging`` (tests/faultpoint.py, for one), and extra environment.
        self.launcher = launcher or [sys.executable, "-m", "messaging.cli"]
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.log = data.parent / f"{data.name}.log"

    def start(self, timeout: float = START_WITHIN) -> BrokerProcess:
        self.data.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [*self.launcher, "broker", "--data", str(self.data),
                 "--bind", f"{self.host}:{self.port}", *self.args],
                stdout=subprocess.PIPE, stderr=log, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                preexec_fn=_nofile_limit(self.nofile) if self.nofile is not None else None)
        assert self.proc.stdout is not None
        line = _readline(self.proc, timeout)
        match = re.search(r"listening on (https?://\S+)", line)
        if not match:
            self.kill()
        assert match, (f"broker did not start within {timeout:g} s: {line!r}; "
                       f"log: {self.log.read_text()}")
        self.url = match.group(1)
        return self

    def _reap(self, timeout: float) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self._reap(10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self._reap(timeout)


def _nofile_limit(soft: int) -> Callable[[], None]:
    """A ``preexec_fn`` that lowers the child's soft RLIMIT_NOFILE to ``soft``."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return limit


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """The first stdout line of ``proc``, or "" after ``timeout`` seconds."""
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


@pytest.fixture
def broker_process(tmp_path: Path, request: pytest.FixtureRequest):
    """A factory of subprocess brokers; every one still running is killed at the end. When
    the test failed, the end of each broker's log is printed (pytest shows it)."""
    started: list[BrokerProcess] = []

    def make(data: Path | None = None, *args: str, port: int = 0,
             nofile: int | None = None, launcher: list[str] | None = None,
             env: dict[str, str] | None = None, host: str = "127.0.0.1") -> BrokerProcess:
        process = BrokerProcess(data or tmp_path / f"proc{len(started)}", *args, port=port,
                                nofile=nofile, launcher=launcher, env=env, host=host)
        started.append(process)
        return process

    yield make
    for process in started:
        process.kill()
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for path in dict.fromkeys(p.log for p in started):
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                print(f"--- last {len(lines)} lines of {path} ---", *lines, sep="\n")


#: How much of each broker's log a failed test prints.
LOG_TAIL_LINES = 60


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep the call phase's report on the test item, for fixtures that act on failure."""
    outcome = yield
    if call.when == "call":
        item.report_call = outcome.get_result()  # type: ignore[attr-defined]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(*args: str, stdin: str | None = None, timeout: float = 60,
        ) -> subprocess.CompletedProcess[str]:
    """Run the ``messaging`` command in a subprocess."""
    return subprocess.run([sys.executable, "-m", "messaging.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0,
                     what: str = "condition") -> None:
    """Poll an async predicate (for state another process owns) with a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session (Java 17 required)."""
    import shutil

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Java 17 is required for the Spark tests: install a JDK 17 "
                    "(e.g. apt-get install openjdk-17-jdk-headless) or set JAVA_HOME")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from messaging.spark import MessagingDataSource

    # local[2,2]: two cores, and a failed task is tried once more (the sink tests need it).
    session = (SparkSession.builder.master("local[2,2]").appName("messaging-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MessagingDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def spark_broker(tmp_path_factory: pytest.TempPathFactory):
    """A broker process for Spark tests (small segments so retention can be exercised)."""
    data = tmp_path_factory.mktemp("spark") / "data"
    process = BrokerProcess(data, "--max-segment-size", "256K").start()
    yield process
    process.kill()
