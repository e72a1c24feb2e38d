"""The S3 store against failures: wrong credentials, a server stopped mid-way, one too slow to
answer, one answering 5xx; and credentials found the standard AWS ways. Every test starts or
uses a server process, or waits out a timeout: all are e2e."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from messaging.objects import (
    ObjectStoreError,
    S3Settings,
    StoreDeniedError,
    StoreServerError,
    StoreUnreachableError,
    parse_store_url,
)
from messaging.objects.s3 import S3Store
from tests.objects.conftest import (
    ACCESS_KEY,
    BUCKET,
    READ_ONLY_KEY,
    READ_ONLY_SECRET,
    SECRET_KEY,
    SeaweedFS,
)
from tests.raw_server import app_server, raw_server

pytestmark = pytest.mark.e2e

NAME = "7/00000000000000000001-00000000000000000009-segment.seg"
#: How long any one failing operation may take with the test limits (FAST).
BOUND_S = 8.0


async def every_operation_fails(store: S3Store, kind: type[ObjectStoreError]) -> None:
    """put, get, size, list and delete all raise ``kind``, within BOUND_S each, with a
    one-line message naming the store (and the object)."""
    operations: dict[str, Callable[[], object]] = {
        "put": lambda: store.put_if_absent(NAME, b"frames"),
        "get": lambda: store.get_range(NAME, 0, 3), "size": lambda: store.size(NAME),
        "list": lambda: store.list("7"), "delete": lambda: store.delete(NAME)}
    for what, operation in operations.items():
        started = time.monotonic()
        with pytest.raises(kind) as info:
            await operation()  # type: ignore[misc]
        assert time.monotonic() - started < BOUND_S, what
        message = str(info.value)
        assert store.url in message and "\n" not in message, what
        assert (NAME in message) == (what != "list"), what
        assert info.value.status == 503 and "Retry-After" in info.value.headers(), what


async def test_wrong_credentials_are_denied(seaweedfs: SeaweedFS) -> None:
    await every_operation_fails(seaweedfs.store(secret_access_key="not-the-secret"),
                                StoreDeniedError)
    await every_operation_fails(seaweedfs.store(access_key_id="nobody"), StoreDeniedError)


async def test_a_read_only_key_reads_but_cannot_upload(seaweedfs: SeaweedFS) -> None:
    writer = seaweedfs.store()
    await writer.put_if_absent(NAME, b"frames")
    reader = seaweedfs.store(prefix=writer.prefix, access_key_id=READ_ONLY_KEY,
                             secret_access_key=READ_ONLY_SECRET)
    assert await reader.get_range(NAME, 0, 6) == b"frames"
    with pytest.raises(StoreDeniedError, match="HTTP 403 Forbidden"):
        await reader.put_if_absent("7/other.seg", b"x")


async def test_a_server_stopped_mid_way_is_unreachable(
        start_seaweedfs: Callable[[], SeaweedFS]) -> None:
    server = start_seaweedfs()
    store = server.store()
    await store.put_if_absent(NAME, b"frames")
    assert await store.get_range(NAME, 0, 6) == b"frames"
    server.stop()
    await every_operation_fails(store, StoreUnreachableError)
    with pytest.raises(StoreUnreachableError, match="connection failed"):
        await store.size(NAME)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A port on 127.0.0.1 that accepts connections and never answers."""
    async def hold(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    async with raw_server(hold) as port:
        yield port


async def test_a_server_too_slow_to_answer_times_out() -> None:
    async with silent_server() as port:
        store = S3Store(BUCKET, "p", S3Settings(
            endpoint=f"http://127.0.0.1:{port}", access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY, request_timeout=0.5, connect_timeout=0.5,
            max_retries=1, retry_timeout=2.0, init_backoff=0.05, max_backoff=0.1))
        started = time.monotonic()
        with pytest.raises(StoreUnreachableError, match="timed out"):
            await store.get_range(NAME, 0, 3)
        with pytest.raises(StoreUnreachableError, match="timed out"):
            await store.put_if_absent(NAME, b"frames")
        assert time.monotonic() - started < BOUND_S


@contextlib.asynccontextmanager
async def failing_server(status: int) -> AsyncIterator[int]:
    """An HTTP server on 127.0.0.1 that answers every request with ``status`` and an S3
    error body."""
    async def answer(_request: web.Request) -> web.Response:
        return web.Response(status=status, content_type="application/xml",
                            text="<Error><Code>SlowDown</Code></Error>")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with app_server(app) as url:
        yield int(url.rsplit(":", 1)[1])


async def test_server_errors_are_their_own_kind() -> None:
    async with failing_server(503) as port:
        store = S3Store(BUCKET, "p", S3Settings(
            endpoint=f"http://127.0.0.1:{port}", access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY, max_retries=2, init_backoff=0.01, max_backoff=0.02))
        await every_operation_fails(store, StoreServerError)
        with pytest.raises(StoreServerError,
                           match=r"HTTP 503 Service Unavailable \(SlowDown\) \(after 2 retries"):
            await store.get_range(NAME, 0, 3)


async def test_credentials_from_the_environment(
        seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    store = await asyncio.to_thread(parse_store_url, f"s3://{BUCKET}/from-env",
                                    seaweedfs.endpoint)
    assert isinstance(store, S3Store)
    await store.put_if_absent(NAME, b"frames")
    assert await store.get_range(NAME, 0, 6) == b"frames"


async def test_credentials_from_a_profile_of_the_shared_files(
        seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[default]\naws_access_key_id = wrong\naws_secret_access_key = x\n"
                           f"[broker]\naws_access_key_id = {ACCESS_KEY}\n"
                           f"aws_secret_access_key = {SECRET_KEY}\n")
    config = tmp_path / "config"
    config.write_text("[profile broker]\nregion = eu-west-3\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "broker")
    store = await asyncio.to_thread(parse_store_url, f"s3://{BUCKET}/from-profile",
                                    seaweedfs.endpoint)
    await store.put_if_absent(NAME, b"frames")
    assert [info.name for info in await store.list()] == [NAME]
    monkeypatch.delenv("AWS_PROFILE")  # the default profile's keys are wrong
    wrong = await asyncio.to_thread(parse_store_url, f"s3://{BUCKET}/from-profile",
                                    seaweedfs.endpoint)
    with pytest.raises(StoreDeniedError):
        await wrong.size(NAME)
