"""Security and operations through real processes: the CLI's token and version commands,
the broker's refusal to serve everyone by accident, TLS with tokens for the client and CLI,
and tokens reread on SIGHUP."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from messaging import __version__
from messaging.client.client import Client
from messaging.errors import ConnectionFailedError, MessagingError
from messaging.http.auth import new_token, parse_scope, token_line
from tests.conftest import BrokerProcess, cli, wait_until
from tests.tls import make_certificates


def test_version_and_token_create() -> None:
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"messaging {__version__}"
    result = cli("token", "create", "--name", "reporter", "--scope", "read=1,chat/*",
                 "--scope", "consume=reporter-*")
    assert result.returncode == 0, result.stderr
    token = result.stdout.split("token: ", 1)[1].split()[0]
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("reporter sha256:") and token not in line
    assert line.endswith("read=1,chat/* consume=reporter-*")
    result = cli("token", "create", "--name", "x", "--scope", "root")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "unknown scope 'root'" in result.stderr


def test_broker_refuses_to_serve_everyone_by_accident(tmp_path: Path) -> None:
    result = cli("broker", "--data", str(tmp_path / "d"), "--bind", "0.0.0.0:0", timeout=30)
    assert result.returncode == 1
    assert result.stderr.strip().endswith("or --insecure to let anyone who reaches the port "
                                          "read, write and delete")
    config = tmp_path / "broker.toml"
    config.write_text("max-segmnt-size = 1\n")
    result = cli("broker", "--config", str(config), timeout=30)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "max-segmnt-size: unknown setting" in result.stderr


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


async def test_tls_and_tokens_for_client_and_cli(broker_process, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    await asyncio.to_thread(make_certificates, certs)
    admin, reader = new_token(), new_token()
    tokens = tmp_path / "tokens"
    tokens.write_text(token_line("ops", admin, [parse_scope("admin")]) + "\n"
                      + token_line("reader", reader, [parse_scope("read=5")]) + "\n")
    broker: BrokerProcess = broker_process(
        tmp_path / "data", "--tokens", str(tokens), "--tls-cert", str(certs / "server.pem"),
        "--tls-key", str(certs / "server-key.pem"), "--access-log", "--log-format", "json")
    await asyncio.to_thread(broker.start)
    try:
        url = broker.url
        assert url.startswith("https://")
        ca = certs / "ca.pem"
        async with Client(url, token=admin, ca=ca) as client:
            index = await client.publish(5, b"over tls")
            assert [m.data for m in await client.read(5)] == [b"over tls"]
        async with Client(url, token=reader, ca=ca) as client:
            with pytest.raises(MessagingError, match="token 'reader' has no write scope") as info:
                await client.publish(5, b"nope")
            assert info.value.status == 403
        async with Client(url, ca=ca, retry_timeout=1) as client:
            with pytest.raises(MessagingError, match="authentication required") as info:
                await client.read(5)
            assert info.value.status == 401
        async with Client(url, token=admin, retry_timeout=1) as client:  # no CA: not trusted
            with pytest.raises(ConnectionFailedError, match="certificate"):
                await client.publish(5, b"unverified")

        # The CLI: --ca, and the token from $MESSAGING_TOKEN.
        run = [sys.executable, "-m", "messaging.cli"]
        result = await asyncio.to_thread(
            subprocess.run, [*run, "tail", url, "5", "--ca", str(ca)], capture_output=True,
            text=True, timeout=60, env=_env(MESSAGING_TOKEN=reader))
        assert result.returncode == 0, result.stderr
        assert "over tls" in result.stdout and str(index) in result.stdout
        result = await asyncio.to_thread(
            subprocess.run, [*run, "publish", url, "5", "x", "--ca", str(ca)],
            capture_output=True, text=True, timeout=60, env=_env(MESSAGING_TOKEN=reader))
        assert result.returncode == 1 and "token 'reader' has no write scope" in result.stderr

        # A token added to the file works once the broker got SIGHUP.
        late = new_token()
        with tokens.open("a") as f:
            f.write(token_line("late", late, [parse_scope("read")]) + "\n")
        os.kill(broker.pid, signal.SIGHUP)

        async def accepted() -> bool:
            async with Client(url, token=late, ca=ca, retry_timeout=0.5) as client:
                try:
                    await client.topics()
                except MessagingError:
                    return False
                return True

        await wait_until(accepted, timeout=10, what="the new token to be accepted")

        # Health is open, even over TLS and with tokens.
        context = __import__("ssl").create_default_context(cafile=str(ca))
        with urllib.request.urlopen(f"{url}/readyz", context=context, timeout=10) as resp:
            assert resp.status == 200
    finally:
        broker.terminate()
    log = broker.log.read_text()
    assert '"logger": "messaging.access"' in log and '"token": "ops"' in log
    assert admin not in log and reader not in log


async def test_client_certificates_required(broker_process, tmp_path: Path) -> None:
    """With --tls-client-ca, a connection without a certificate signed by that CA fails."""
    import ssl

    certs = tmp_path / "certs"
    certs.mkdir()
    await asyncio.to_thread(make_certificates, certs)
    broker: BrokerProcess = broker_process(
        tmp_path / "data", "--tls-cert", str(certs / "server.pem"),
        "--tls-key", str(certs / "server-key.pem"), "--tls-client-ca", str(certs / "ca.pem"))
    await asyncio.to_thread(broker.start)
    try:
        def fetch(with_certificate: bool) -> int:
            context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
            if with_certificate:
                context.load_cert_chain(certs / "client.pem", certs / "client-key.pem")
            with urllib.request.urlopen(f"{broker.url}/healthz", context=context,
                                        timeout=10) as resp:
                return int(resp.status)

        assert await asyncio.to_thread(fetch, True) == 200
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(fetch, False)
    finally:
        broker.terminate()


def test_python_dash_m_messaging() -> None:
    result = subprocess.run([sys.executable, "-m", "messaging", "--version"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("messaging ")
