"""Shared fixtures and helpers."""

from __future__ import annotations

from collections.abc import Iterable

from messaging.message import Message, encode_many


def frames(topic: int, indexes: Iterable[int], data: bytes | None = None) -> bytes:
    """Frames for ``topic`` with the given indexes; data defaults to a per-index payload."""
    return encode_many(
        Message(i, 1, topic, data if data is not None else f"message {i}".encode())
        for i in indexes
    )
