"""The cluster's connection to etcd over TLS (client certificates) and with a user and
password: a real etcd member, certificates from a throwaway CA made here with openssl."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from aetcd import rpc

from tests.conftest import free_port, wait_until
from tests.tls import make_certificates


class SecureEtcd:
    """One etcd member serving clients over https with client-certificate checks."""

    def __init__(self, tmp: Path) -> None:
        self.certs = tmp / "certs"
        self.certs.mkdir()
        make_certificates(self.certs)
        self.port, peer = free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        etcd = shutil.which("etcd")
        if etcd is None:
            pytest.fail("etcd is required for the cluster tests: apt-get install etcd-server")
        c = self.certs
        with (tmp / "etcd.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [etcd, "--name", "s0", "--data-dir", str(tmp / "etcd"),
                 "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", f"s0=http://127.0.0.1:{peer}",
                 "--cert-file", str(c / "server.pem"), "--key-file", str(c / "server-key.pem"),
                 "--trusted-ca-file", str(c / "ca.pem"), "--client-cert-auth",
                 "--logger", "zap", "--log-level", "warn"],
                stdout=out, stderr=out)

    def credentials(self) -> grpc.ChannelCredentials:
        c = self.certs
        return grpc.ssl_channel_credentials((c / "ca.pem").read_bytes(),
                                            (c / "client-key.pem").read_bytes(),
                                            (c / "client.pem").read_bytes())

    async def call(self, method: str, request: object) -> object:
        async with grpc.aio.secure_channel(f"127.0.0.1:{self.port}",
                                           self.credentials()) as channel:
            stub = (rpc.AuthStub if method.startswith(("User", "Role", "Auth"))
                    else rpc.KVStub)(channel)
            return await getattr(stub, method)(request, timeout=5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15)


@pytest.fixture
def secure_etcd(tmp_path: Path) -> Iterator[SecureEtcd]:
    etcd = SecureEtcd(tmp_path)
    try:
        yield etcd
    finally:
        etcd.stop()


async def publish_and_read(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/messaging/messages", params={"topicID": "1"},
                                data=b"over tls") as resp:
            assert resp.status == 200, resp.headers.get("X-Broker-Error")
            index = resp.headers["X-Broker-Index"]
        async with session.get(f"{url}/messaging/messages",
                               params={"topicID": "1", "index": index}) as resp:
            assert resp.status == 200 and (await resp.read()).endswith(b"over tls")


async def wait_serving(etcd: SecureEtcd) -> None:
    async def serving() -> bool:
        try:
            await etcd.call("Range", rpc.RangeRequest(key=b"health"))
        except grpc.aio.AioRpcError:
            return False
        return True

    await wait_until(serving, timeout=30, what="etcd serving over TLS")


async def test_cluster_over_tls_with_client_certificates(secure_etcd: SecureEtcd,
                                                         broker_process, tmp_path: Path) -> None:
    await wait_serving(secure_etcd)
    c = secure_etcd.certs
    node = broker_process(tmp_path / "node", "--etcd", secure_etcd.url, "--cluster", "tls",
                          "--etcd-ca", str(c / "ca.pem"), "--etcd-cert", str(c / "client.pem"),
                          "--etcd-key", str(c / "client-key.pem"))
    node.start()
    await publish_and_read(node.url)
    # Without the client certificate etcd refuses the connection: the node serves reads of
    # its own data but answers writes 503 (nothing is sent), with the reason.
    refused = broker_process(tmp_path / "plain", "--etcd", secure_etcd.url, "--cluster", "tls2",
                             "--etcd-ca", str(c / "ca.pem")).start()
    async with aiohttp.ClientSession() as session, session.post(
            f"{refused.url}/messaging/messages", params={"topicID": "1"}, data=b"no") as resp:
        assert resp.status == 503, resp.headers.get("X-Broker-Error")
        assert "etcd" in resp.headers["X-Broker-Error"]


async def test_cluster_with_an_etcd_user_and_password(secure_etcd: SecureEtcd, broker_process,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    await wait_serving(secure_etcd)
    for request in (rpc.AuthUserAddRequest(name="root", password="rootpw"),
                    rpc.AuthUserGrantRoleRequest(user="root", role="root"),
                    rpc.AuthEnableRequest()):
        method = {rpc.AuthUserAddRequest: "UserAdd", rpc.AuthUserGrantRoleRequest:
                  "UserGrantRole", rpc.AuthEnableRequest: "AuthEnable"}[type(request)]
        await secure_etcd.call(method, request)
    c = secure_etcd.certs
    monkeypatch.setenv("MESSAGING_ETCD_PASSWORD", "rootpw")
    node = broker_process(tmp_path / "node", "--etcd", secure_etcd.url, "--cluster", "auth",
                          "--etcd-ca", str(c / "ca.pem"), "--etcd-cert", str(c / "client.pem"),
                          "--etcd-key", str(c / "client-key.pem"), "--etcd-user", "root")
    node.start()
    await publish_and_read(node.url)
    # A wrong password: writes are refused with the reason, nothing is stored.
    monkeypatch.setenv("MESSAGING_ETCD_PASSWORD", "wrong")
    wrong = broker_process(tmp_path / "wrong", "--etcd", secure_etcd.url, "--cluster", "auth2",
                           "--etcd-ca", str(c / "ca.pem"), "--etcd-cert", str(c / "client.pem"),
                           "--etcd-key", str(c / "client-key.pem"), "--etcd-user", "root").start()
    async with aiohttp.ClientSession() as session, session.post(
            f"{wrong.url}/messaging/messages", params={"topicID": "1"}, data=b"no") as resp:
        assert resp.status == 503, resp.headers.get("X-Broker-Error")
