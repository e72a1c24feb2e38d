"""The one exception hierarchy of messaging: every error class of the package is here.

Every class carries the HTTP status it maps to; only :mod:`messaging.http.app` turns exceptions
into responses, and :func:`error_for_status` turns them back into the same classes for the
clients (from the status and headers, never by parsing the message).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from http import HTTPStatus

from messaging.headers import (
    DELETED_AT_HEADER,
    ERROR_HEADER,
    FIRST_INDEX_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_EXPECTED_SEQ_HEADER,
    PRODUCER_RECEIVED_SEQ_HEADER,
    STREAM_CLOSED_HEADER,
    STREAM_NEXT_OFFSET_HEADER,
    TOPIC_HEADER,
)


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
    """A read below the first index that retention kept.

    ``topic`` is None only when a broker's answer did not name it.
    """

    status = 410

    def __init__(self, topic: int | None, first_index: int) -> None:
        where = f"topic {topic}: " if topic is not None else ""
        super().__init__(
            f"{where}index below {first_index} was deleted by retention; "
            f"first available index is {first_index}"
        )
        self.topic = topic
        self.first_index = first_index

    def headers(self) -> dict[str, str]:
        """The topic and its first index still available, for readers that resume there."""
        headers = {FIRST_INDEX_HEADER: str(self.first_index)}
        if self.topic is not None:
            headers[TOPIC_HEADER] = str(self.topic)
        return headers


class NoLeaderError(MessagingError):
    """The cluster has no leader right now, so writes cannot be accepted."""

    status = 503


class CommitUnknownError(MessagingError):
    """A write reached the leader but leadership changed before it was known to commit.

    It may still be committed by the new leader; retrying blindly could store it twice.
    """

    status = 504


class ClusterUnavailableError(MessagingError):
    """etcd is unreachable or has no quorum: the write was never sent, so it is safe to retry."""

    status = 503


class ClockOffsetError(ClusterUnavailableError):
    """This node's clock is too far from its peers' (``--max-clock-offset``): it takes no
    writes until its clock is back; another node may take the command."""

    def headers(self) -> dict[str, str]:
        """When to try again (clocks are checked every second)."""
        return {"Retry-After": "1"}


class ClusterNoSpaceError(MessagingError):
    """etcd raised its NOSPACE alarm (backend quota reached) and refuses every write.

    An operator recovers with ``etcdctl compact``, ``etcdctl defrag`` and ``etcdctl alarm
    disarm`` (see the README).
    """

    status = 507


class BrokerClosedError(MessagingError):
    """The broker (or its log) is shutting down and accepts no more work."""

    status = 503


class BindError(MessagingError):
    """The broker cannot listen on its address (in use, not this machine's, no permission)."""


class DataDirectoryError(MessagingError):
    """The data directory cannot be used (permissions, wrong format, locked by another broker)."""

    status = 500


class ClientError(MessagingError):
    """Base class of errors raised by the client side."""


class ConnectionFailedError(ClientError):
    """No broker URL could be reached (or a stream from one broke).

    ``refused``: every URL refused the connection or named no host, so nothing listens there.
    """

    status = 503

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class PublishOutcomeUnknownError(ClientError):
    """A publish request may have reached the broker, but no answer came back.

    Publishes are not idempotent, so the client does not retry them; the caller decides.
    """

    status = 503


class ConnClosedError(ClientError):
    """A :class:`~messaging.client.Conn` was used after ``close()``."""


class ConnStateError(ClientError):
    """A :class:`~messaging.client.Conn` was used in the wrong state (opened twice, not opened)."""


class InvalidURLError(ClientError):
    """A broker URL the client cannot use: not ``http://HOST:PORT`` or ``https://HOST:PORT``."""

    status = 400


class ClientConfigError(ClientError):
    """The client's ``config_path`` is unreadable or not ``{"urls": [...]}``; names the file."""


class NotABrokerError(ClientError):
    """An answer no messaging broker gives: an error without ``X-Broker-Error``, a missing or
    invalid broker header, a body that does not parse, or no HTTP at all."""

    status = 502

    @classmethod
    def at(cls, url: str, why: str) -> NotABrokerError:
        """``URL does not look like a messaging broker: why``."""
        return cls(f"{url or 'the URL'} does not look like a messaging broker: {why}")


_BY_STATUS: dict[int, type[MessagingError]] = {
    400: BadRequestError,
    404: NotFoundError,
    413: MessageTooLargeError,
    503: NoLeaderError,
    504: PublishOutcomeUnknownError,
    507: DiskFullError,
}


# -- configuration ----------------------------------------------------------------------------


class ConfigError(MessagingError):
    """A configuration file, environment variable or option that cannot be used."""

# -- limits (messaging.http.limits) -----------------------------------------------------------


class TooManyStreamsError(MessagingError):
    """Every streaming slot is taken."""

    status = 503

class TooManyRequestsError(MessagingError):
    """A rate or count limit; ``retry_after`` seconds until it is worth trying again."""

    status = 429

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """When to try again."""
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

class SlowUploadError(MessagingError):
    """A request body that did not arrive at the minimum rate."""

    status = 408

# -- authentication and scopes (messaging.http.auth) ------------------------------------------


class UnauthorizedError(MessagingError):
    """No credentials, or credentials no token matches."""

    status = 401

    def headers(self) -> dict[str, str]:
        """How to authenticate."""
        return {"WWW-Authenticate": 'Bearer realm="messaging"'}

class ForbiddenError(MessagingError):
    """A valid token without the scope a request needs."""

    status = 403

class UndeclaredScopeError(MessagingError):
    """A route that declares no scope: refused, never served open (a bug in the broker)."""

    status = 500

class TokensFileError(MessagingError):
    """A tokens file that cannot be used (the message names the file and line)."""
class TopicDeletedError(TopicTruncatedError):
    """A read of a topic deleted by ``DELETE /messaging/topics/{id}`` at broker index
    ``deleted_at``: nothing through that index is served again. ``first_index`` (0: none) is
    where the topic, created again since, starts; only then is it sent as a header."""

    def __init__(self, topic: int, deleted_at: int, first_index: int = 0) -> None:
        again = (f"; it was created again: first available index is {first_index}"
                 if first_index else "")
        MessagingError.__init__(self, f"topic {topic} was deleted (at index {deleted_at})"
                                      f"{again}")
        self.topic = topic
        self.first_index = first_index
        self.deleted_at = deleted_at

    def headers(self) -> dict[str, str]:
        """The topic, the index of its deletion, and where it starts again if it was
        created again."""
        found = super().headers() if self.first_index else {TOPIC_HEADER: str(self.topic)}
        return {**found, DELETED_AT_HEADER: str(self.deleted_at)}


# -- named streams (messaging.broker.catalog) -------------------------------------------------


class StreamNotFoundError(NotFoundError):
    """No stream of that name (or it expired)."""

class StreamGoneError(MessagingError):
    """The stream was deleted while forks still read it (soft-deleted)."""

    status = 410

class StreamConflictError(MessagingError):
    """A create with another configuration, a content type or ``Stream-Seq`` conflict."""

    status = 409

class StreamClosedError(MessagingError):
    """An append to a closed stream."""

    status = 409

    def __init__(self, message: str, next_offset: str) -> None:
        super().__init__(message)
        self.next_offset = next_offset  # the stream's final offset, as a token

    def headers(self) -> dict[str, str]:
        """The closure and the final offset."""
        return {STREAM_CLOSED_HEADER: "true", STREAM_NEXT_OFFSET_HEADER: self.next_offset}

# -- idempotent producers (messaging.broker.producers) ----------------------------------------


class ProducerFencedError(MessagingError):
    """A producer epoch older than the stream's (a zombie)."""

    status = 403

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch

    def headers(self) -> dict[str, str]:
        """The epoch the stream holds."""
        return {PRODUCER_EPOCH_HEADER: str(self.epoch)}

class ProducerSequenceGapError(MessagingError):
    """A producer sequence number that skips ahead of the next one expected."""

    status = 409

    def __init__(self, message: str, expected: int, received: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.received = received

    def headers(self) -> dict[str, str]:
        """The sequence expected and the one received."""
        return {PRODUCER_EXPECTED_SEQ_HEADER: str(self.expected),
                PRODUCER_RECEIVED_SEQ_HEADER: str(self.received)}

# -- transactional consumers (messaging.client.consumer) --------------------------------------


class ConsumerError(MessagingError):
    """A consumer cannot go on: its store is in use or damaged, or its producer fenced."""

# -- journals (messaging.client.journal) ------------------------------------------------------


class JournalError(MessagingError):
    """A journal used the wrong way, or a writer that can no longer write."""

class FencedError(JournalError):
    """A writer whose epoch is no longer the journal's: another primary took over."""

    status = 403


def error_for_status(status: int, headers: Mapping[str, str], url: str = "") -> MessagingError:
    """The exception an error answer (status >= 300) of the broker at ``url`` stands for.

    Read from the status and headers (names in any case), never from the body: the message
    is ``X-Broker-Error``; a 410 with ``X-Broker-Deleted-At`` is a :class:`TopicDeletedError`,
    one with ``X-Broker-First-Index`` a :class:`TopicTruncatedError`, for the topic in
    ``X-Broker-Topic``. An answer without
    ``X-Broker-Error`` (a web server's or a proxy's error page) or with a broker header that
    is not an unsigned integer is a :class:`NotABrokerError`.
    """
    found = {name.lower(): (name, value) for name, value in headers.items()}
    _, message = found.get(ERROR_HEADER.lower(), ("", None))
    if message is None:
        try:
            phrase = f" {HTTPStatus(status).phrase}"
        except ValueError:
            phrase = ""
        return NotABrokerError.at(url, f"it answered HTTP {status}{phrase}")
    numbers = {}
    for wanted in (FIRST_INDEX_HEADER, TOPIC_HEADER, DELETED_AT_HEADER):
        name, value = found.get(wanted.lower(), (wanted, None))
        if value is not None and not is_unsigned(value):
            return NotABrokerError.at(url, f"invalid {name} {value!r}")
        numbers[wanted] = None if value is None else int(value)
    first_index = numbers[FIRST_INDEX_HEADER]
    deleted_at = numbers[DELETED_AT_HEADER]
    if status == 410 and deleted_at is not None:
        return TopicDeletedError(numbers[TOPIC_HEADER] or 0, deleted_at, first_index or 0)
    if status == 410 and first_index is not None:
        return TopicTruncatedError(numbers[TOPIC_HEADER], first_index)
    expected = found.get(PRODUCER_EXPECTED_SEQ_HEADER.lower(), ("", None))[1]
    received = found.get(PRODUCER_RECEIVED_SEQ_HEADER.lower(), ("", None))[1]
    if (status == 409 and expected is not None and received is not None
            and is_unsigned(expected) and is_unsigned(received)):
        return ProducerSequenceGapError(message.strip(), int(expected), int(received))
    cls = _BY_STATUS.get(status, MessagingError)
    error = cls(message.strip() or f"HTTP {status}")
    error.status = status
    return error


def is_unsigned(text: str) -> bool:
    """Whether a header value is an unsigned decimal integer (ASCII digits only)."""
    return text.isascii() and text.isdigit()
