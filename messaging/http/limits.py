"""What one client can take of a broker: streams, subscribers, upload time, append rate.

- At most ``max_streams`` streaming reads (native streams, long-polls, SSE) at once: more are
  answered 503.
- Subscriber ids are at most :data:`MAX_SUBSCRIBER_ID` characters, and a topic registers at
  most ``max_subscribers`` of them (429 for a new one beyond).
- A request body must arrive at ``min_upload_rate`` bytes per second or better once
  :data:`UPLOAD_GRACE` seconds have passed (as Gazette's ``MinAppendRate``): a slower upload
  is cut off with 408, so that it cannot hold a connection and a buffer forever.
- ``max_append_rate`` appends per second per topic (a token bucket of one second's worth):
  more are answered 429 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiohttp import web

from messaging.config import (
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_SUBSCRIBERS,
    DEFAULT_MIN_UPLOAD_RATE,
    MAX_SUBSCRIBER_ID,
    UPLOAD_GRACE,
)
from messaging.errors import (
    BadRequestError,
    MessageTooLargeError,
    SlowUploadError,
    TooManyRequestsError,
    TooManyStreamsError,
)

_READ = 64 << 10


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class Limits:
    """The limits of one broker (see the module docstring)."""

    max_streams: int = DEFAULT_MAX_STREAMS
    max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS
    min_upload_rate: int = DEFAULT_MIN_UPLOAD_RATE
    max_append_rate: int = 0
    streams: int = 0
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    @contextlib.contextmanager
    def stream(self) -> Iterator[None]:
        """Hold one streaming slot for the duration (503 when none is free)."""
        if self.streams >= self.max_streams:
            raise TooManyStreamsError(f"too many streaming reads (--max-streams "
                                      f"{self.max_streams}); try again later")
        self.streams += 1
        try:
            yield
        finally:
            self.streams -= 1

    def check_subscriber(self, url: str, known: dict[str, int]) -> None:
        """Refuse an over-long subscriber id, or a new one on a topic that has enough."""
        if len(url) > MAX_SUBSCRIBER_ID:
            raise BadRequestError(f"subscriber id of {len(url)} characters: at most "
                                  f"{MAX_SUBSCRIBER_ID}")
        if url not in known and len(known) >= self.max_subscribers:
            raise TooManyRequestsError(f"the topic has {len(known)} subscribers already "
                                       f"(--max-subscribers {self.max_subscribers})", 60.0)

    def admit_append(self, key: str) -> None:
        """Count one append to ``key`` (a topic or stream); 429 past ``max_append_rate``."""
        rate = self.max_append_rate
        if not rate:
            return
        now = time.monotonic()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(rate), now)
        bucket.tokens = min(float(rate), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            raise TooManyRequestsError(f"{key}: more than {rate} appends per second "
                                       "(--max-append-rate)", (1.0 - bucket.tokens) / rate)
        bucket.tokens -= 1.0
        if len(self._buckets) > 100_000:  # forget idle topics' buckets
            for stale in [k for k, b in self._buckets.items() if now - b.at > 60.0]:
                del self._buckets[stale]

    async def read_body(self, request: web.Request, max_size: int) -> bytes:
        """The request body, refused past ``max_size`` (413) or below the minimum rate (408)."""
        declared = request.content_length
        if declared is not None and declared > max_size:
            raise MessageTooLargeError(f"request body too large: {declared} bytes, at most "
                                       f"{max_size}")
        content = request.content
        # Most bodies arrived whole with their headers: take them without a timer or a task.
        first = content.read_nowait()
        size = len(first)
        if size > max_size:
            raise MessageTooLargeError(f"request body too large: over {max_size} bytes")
        if content.at_eof():
            return first
        chunks = [first] if first else []
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(None) as deadline:
                while True:
                    if self.min_upload_rate:
                        # The time by which the body so far (plus one more byte) was due.
                        deadline.reschedule(
                            started + max(UPLOAD_GRACE, (size + 1) / self.min_upload_rate))
                    chunk = await content.read(_READ)
                    if not chunk:
                        return b"".join(chunks)
                    size += len(chunk)
                    if size > max_size:
                        raise MessageTooLargeError(
                            f"request body too large: over {max_size} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            # Cut the connection: the rest of the body will not be read.
            if request.transport is not None:
                request.transport.close()
            raise SlowUploadError(
                f"request body too slow: {size} bytes in {loop.time() - started:.1f} s "
                f"(at least {self.min_upload_rate} bytes per second after "
                f"{UPLOAD_GRACE:g} s)") from None
