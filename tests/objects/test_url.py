"""``--object-store URL`` to a store, and clear errors for anything else."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from messaging.errors import ConfigError, MessagingError
from messaging.objects import FileStore, parse_store_url
from messaging.objects.s3 import S3Store


def test_file_urls_name_a_directory(tmp_path: Path) -> None:
    store = parse_store_url(tmp_path.as_uri())
    assert isinstance(store, FileStore) and store.root == tmp_path
    assert store.url == tmp_path.as_uri()
    assert parse_store_url("file:///srv/objects/../objects/").root == Path(  # type: ignore[attr-defined]
        "/srv/objects")
    assert parse_store_url("file://localhost/srv/x").root == Path("/srv/x")  # type: ignore[attr-defined]
    assert parse_store_url("file:///srv/with%20space").root == Path("/srv/with space")  # type: ignore[attr-defined]


def test_s3_urls_name_a_bucket_and_a_prefix() -> None:
    store = parse_store_url("s3://my-bucket/brokers/one/", "http://127.0.0.1:9000")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.url) == ("my-bucket", "brokers/one",
                                                       "s3://my-bucket/brokers/one")
    assert store.settings.endpoint == "http://127.0.0.1:9000"
    bare = parse_store_url("s3://my-bucket")
    assert isinstance(bare, S3Store) and (bare.prefix, bare.url) == ("", "s3://my-bucket")


@pytest.mark.parametrize(("url", "match"), [
    ("", "expected s3://BUCKET/PREFIX or file:///PATH"),
    ("/srv/objects", "expected s3://BUCKET/PREFIX or file:///PATH"),
    ("gs://bucket/x", "expected s3://BUCKET/PREFIX or file:///PATH"),
    ("http://127.0.0.1:9000/bucket", "expected s3://BUCKET/PREFIX or file:///PATH"),
    ("file://srv/objects", "three slashes"),
    ("file:///", "absolute path below /"),
    ("file:///srv/x?sync=1", "no port, user, query or fragment"),
    ("s3://Bucket_Name/x", "not an S3 bucket name"),
    ("s3://ab/x", "not an S3 bucket name"),
    ("s3:///prefix", "not an S3 bucket name"),
    ("s3://bucket:9000/x", "no port"),
    ("s3://bucket:x/x", "expected s3://"),
    ("s3://user@bucket/x", "no port, user"),
    ("s3://bucket/a//b", "prefix 'a//b' is not usable"),
    ("s3://bucket/../x", "is not usable"),
])
def test_bad_urls_say_what_is_expected(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_store_url(url)


def test_an_endpoint_for_a_file_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--s3-endpoint applies to s3://"):
        parse_store_url(tmp_path.as_uri(), "http://127.0.0.1:9000")


def test_without_obstore_s3_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore raises ImportError
    monkeypatch.delitem(sys.modules, "messaging.objects.s3")
    with pytest.raises(MessagingError, match=r"make s3 adds it"):
        importlib.import_module("messaging.objects.s3")
    with pytest.raises(ConfigError, match=r"make s3 adds it"):
        parse_store_url("s3://bucket/prefix")
