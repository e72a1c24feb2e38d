"""The client's URL file: the broker URLs a :class:`~messaging.client.Client` made with
``config_path`` reads when it opens and writes after a ping, as ``{"urls": [...]}``.

Both run on a thread (the file is read and written synchronously; the write is atomic: a
temp file, fsynced and renamed). A file that cannot be used raises
:class:`~messaging.errors.ClientConfigError` naming it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from messaging.errors import ClientConfigError, InvalidURLError
from messaging.failover import base_url
from messaging.files import read_json, write_json_atomic


def saved_urls(path: Path) -> list[str]:
    """The URLs a config file holds (none if there is no file); blocking, call on a thread."""
    if not path.exists():
        return []
    try:
        config = read_json(path)
    except OSError as err:
        raise ClientConfigError(f"cannot read client config {path}: "
                                f"{(err.strerror or str(err)).lower()}") from err
    except ValueError as err:
        raise ClientConfigError(f"invalid client config {path}: not JSON ({err})") from err
    urls = config.get("urls") if isinstance(config, dict) else None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise ClientConfigError(f'invalid client config {path}: expected JSON '
                                f'{{"urls": ["http://HOST:PORT", ...]}}')
    try:
        return [base_url(u) for u in urls]
    except InvalidURLError as err:
        raise ClientConfigError(f"invalid client config {path}: {err}") from err


async def save_urls(path: Path, urls: list[str]) -> None:
    """Replace the config file at ``path`` with ``urls`` (written on a thread)."""
    try:
        await asyncio.to_thread(write_json_atomic, path, {"urls": urls})
    except OSError as err:
        raise ClientConfigError(f"cannot write client config {path}: "
                                f"{(err.strerror or str(err)).lower()}") from err
