"""Fetching a snapshot from a live peer (a node whose revision etcd compacted away)."""

from __future__ import annotations

import ssl
import urllib.parse
import urllib.request
from typing import IO

from messaging.broker.snapshot import SNAPSHOT_PATH


def fetch_snapshot(url: str, cluster: str, timeout: float = 30.0, *,
                   token: str | None = None, ca: str | None = None) -> IO[bytes]:
    """Open a peer's snapshot for reading (blocking: call it on a thread).

    ``timeout`` bounds connecting and every read, so a peer that stops sending cannot hold
    the caller forever. ``token``: an admin token, when the peers require tokens; ``ca``:
    the CA that signed the peers' certificates (https).
    """
    query = urllib.parse.urlencode({"cluster": cluster})
    request = urllib.request.Request(f"{url.rstrip('/')}{SNAPSHOT_PATH}?{query}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca) if ca else None
    response: IO[bytes] = urllib.request.urlopen(request, timeout=timeout, context=context)
    return response
