"""The one exception hierarchy of messaging.

Every class carries the HTTP status it maps to; only :mod:`messaging.http` turns exceptions
into responses, and the client turns responses back into the same classes.
"""

from __future__ import annotations


class MessagingError(Exception):
    """Base class of every error this package raises on purpose."""

    status: int = 500

    def headers(self) -> dict[str, str]:
        """Headers an error response carries besides ``X-Broker-Error``."""
        return {}


class BadRequestError(MessagingError):
    """A missing or invalid parameter."""

    status = 400


class CorruptFrameError(MessagingError):
    """A frame that can never become valid: impossible length, bad type, index not increasing."""

    status = 400


class ChecksumError(CorruptFrameError):
    """A frame whose CRC-32C does not match its contents."""


class MessageTooLargeError(MessagingError):
    """A message or request body over the configured maximum."""

    status = 413


class CorruptDataError(MessagingError):
    """Data on the broker's own disk failed verification: the server's fault, never the client's.

    The message names the topic, the segment file and the byte where the damage starts.
    """

    status = 500


class StorageError(MessagingError):
    """Writing to the broker's disk failed; nothing of the failed request was kept."""

    status = 500


class DiskFullError(StorageError):
    """The broker's disk is full; writes resume by themselves once space is freed."""

    status = 507


class StorageFailedError(StorageError):
    """A topic stopped accepting writes after its data could not be made durable (failed fsync).

    After a failed fsync the kernel may have dropped the dirty pages, so a later fsync proves
    nothing: the topic stays read-only until a restart re-verifies its files.
    """

    status = 503


class FrameTooLargeError(CorruptFrameError):
    """A frame whose length is over the maximum a decoder was given."""

    status = 413


class NotFoundError(MessagingError):
    """An unknown path or topic."""

    status = 404


class TopicTruncatedError(MessagingError):
    """A read below the first index that retention kept."""

    status = 410

    def __init__(self, topic: int, first_index: int) -> None:
        super().__init__(
            f"topic {topic}: index below {first_index} was deleted by retention; "
            f"first available index is {first_index}"
        )
        self.topic = topic
        self.first_index = first_index

    def headers(self) -> dict[str, str]:
        """The first index still available, for readers that resume from there."""
        return {"X-Broker-First-Index": str(self.first_index)}


class NoLeaderError(MessagingError):
    """The cluster has no leader right now, so writes cannot be accepted."""

    status = 503


class CommitUnknownError(MessagingError):
    """A write reached the leader but leadership changed before it was known to commit.

    It may still be committed by the new leader; retrying blindly could store it twice.
    """

    status = 504


class NotLeaderError(MessagingError):
    """This node is a follower; the write belongs on the leader at ``leader_url``."""

    status = 307

    def __init__(self, leader_url: str) -> None:
        super().__init__(f"not the leader; the leader is {leader_url}")
        self.leader_url = leader_url


class BrokerClosedError(MessagingError):
    """The broker (or its log) is shutting down and accepts no more work."""

    status = 503


class DataDirectoryError(MessagingError):
    """The data directory cannot be used (permissions, wrong format, locked by another broker)."""

    status = 500


class ClientError(MessagingError):
    """Base class of errors raised by the client side."""


class ConnectionFailedError(ClientError):
    """No broker URL could be reached."""

    status = 503


class PublishOutcomeUnknownError(ClientError):
    """A publish request may have reached the broker, but no answer came back.

    Publishes are not idempotent, so the client does not retry them; the caller decides.
    """

    status = 503


class ConnClosedError(ClientError):
    """A :class:`messaging.client.Conn` was used after ``close()``."""


class ConnStateError(ClientError):
    """A :class:`messaging.client.Conn` was used in the wrong state (opened twice, not opened)."""


class InvalidURLError(ClientError):
    """A broker URL the client cannot use: not ``http://HOST:PORT`` or ``https://HOST:PORT``."""

    status = 400


class ClientConfigError(ClientError):
    """The client's ``config_path`` is unreadable or not ``{"urls": [...]}``; names the file."""


class NotABrokerError(ClientError):
    """An answer no messaging broker gives: an error without ``X-Broker-Error``, a missing or
    invalid broker header, a body that does not parse, or no HTTP at all."""

    status = 502


_BY_STATUS: dict[int, type[MessagingError]] = {
    400: BadRequestError,
    404: NotFoundError,
    413: MessageTooLargeError,
    503: NoLeaderError,
    504: PublishOutcomeUnknownError,
    507: DiskFullError,
}


def error_for_status(status: int, message: str, first_index: str | None = None,
                     ) -> MessagingError:
    """The exception a client raises for an error response.

    ``first_index`` is the ``X-Broker-First-Index`` header of a 410.
    """
    if status == 410 and first_index is not None:
        topic = message.split()[1].rstrip(":") if message.startswith("topic ") else "0"
        return TopicTruncatedError(int(topic) if topic.isdigit() else 0, int(first_index))
    cls = _BY_STATUS.get(status, MessagingError)
    error = cls(message)
    error.status = status
    return error
