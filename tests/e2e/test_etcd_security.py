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
    """One etcd member serving clients over https, with client-certificate checks unless
    ``client_certificates`` is false."""

    def __init__(self, tmp: Path, *, client_certificates: bool = True) -> None:
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
                 *(["--trusted-ca-file", str(c / "ca.pem"), "--client-cert-auth"]
                   if client_certificates else []),
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


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[SecureEtcd]:
    """etcd over https that does not ask for client certificates (nor take a user from one)."""
    etcd = SecureEtcd(tmp_path, client_certificates=False)
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


async def enable_auth(etcd: SecureEtcd) -> None:
    """Add user root (password rootpw, role root) and turn etcd's authentication on."""
    await wait_serving(etcd)
    for request in (rpc.AuthUserAddRequest(name="root", password="rootpw"),
                    rpc.AuthUserGrantRoleRequest(user="root", role="root"),
                    rpc.AuthEnableRequest()):
        method = {rpc.AuthUserAddRequest: "UserAdd", rpc.AuthUserGrantRoleRequest:
                  "UserGrantRole", rpc.AuthEnableRequest: "AuthEnable"}[type(request)]
        await etcd.call(method, request)


async def refused_publish(url: str) -> str:
    """A publish to a node etcd does not admit: 503 and its X-Broker-Error."""
    async with aiohttp.ClientSession() as session, session.post(
            f"{url}/messaging/messages", params={"topicID": "1"}, data=b"no") as resp:
        assert resp.status == 503, resp.headers.get("X-Broker-Error")
        return resp.headers["X-Broker-Error"]


async def test_cluster_with_an_etcd_user_and_password(secure_etcd: SecureEtcd, broker_process,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    await enable_auth(secure_etcd)
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
    assert (await refused_publish(wrong.url)).startswith(
        "etcd refused authentication (authentication failed, invalid user ID or password): "
        "check --etcd-user and the password in $MESSAGING_ETCD_PASSWORD")
    # No --etcd-user: etcd takes the client certificate's name (client), a user it lacks.
    anonymous = broker_process(tmp_path / "cn", "--etcd", secure_etcd.url, "--cluster", "auth3",
                               "--etcd-ca", str(c / "ca.pem"), "--etcd-cert",
                               str(c / "client.pem"), "--etcd-key",
                               str(c / "client-key.pem")).start()
    assert (await refused_publish(anonymous.url)).startswith(
        "etcd refused access (permission denied): the etcd user (--etcd-user, or else the "
        "common name of the --etcd-cert certificate) needs a role")


async def test_a_node_without_etcd_credentials_says_so(tls_etcd: SecureEtcd, broker_process,
                                                       tmp_path: Path) -> None:
    """Against an etcd with authentication on, a node started without --etcd-user says that
    etcd refused it and what to do, first: in a publish's answer, /readyz and the log (not
    "etcd has no quorum or cannot be reached")."""
    await enable_auth(tls_etcd)
    node = broker_process(tmp_path / "anonymous", "--etcd", tls_etcd.url, "--cluster", "anon",
                          "--etcd-ca", str(tls_etcd.certs / "ca.pem")).start()
    expected = ("etcd refused authentication (user name is empty): start with --etcd-user USER "
                "(its password in $MESSAGING_ETCD_PASSWORD)")
    assert (await refused_publish(node.url)).startswith(expected)
    problems: list[str] = []

    async def readyz_says_it() -> bool:
        async with aiohttp.ClientSession() as session, session.get(
                f"{node.url}/readyz") as resp:
            assert resp.status == 503
            problems[:] = (await resp.json())["problems"]
        return bool(problems) and problems[0].startswith(expected)

    await wait_until(readyz_says_it, timeout=10,
                     what=f"/readyz to name the refused authentication: {problems}")

    async def logged() -> bool:
        return expected in node.log.read_text()

    await wait_until(logged, timeout=10, what="the log to name the refused authentication")
