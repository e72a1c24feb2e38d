"""The data source's options (``url``/``urls``, ``topics``, ``startingIndex``, ...), parsed
once with clear errors. Spark passes option names case-insensitively; so do we."""

from __future__ import annotations

from messaging.errors import MessagingError

DEFAULT_PARTITION_SIZE = 100_000


class SourceOptions:
    """What a reader was asked for."""

    def __init__(self, given: dict[str, str]) -> None:
        options = lower_case(given)
        self.urls = broker_urls(options)
        self.token = options.get("token") or None
        self.ca = options.get("ca") or None
        topics = options.get("topics") or options.get("topic") or ""
        try:
            self.topics = [int(t) for t in topics.split(",") if t.strip()]
        except ValueError:
            raise MessagingError(f"option topics {topics!r}: expected ids like 1,2") from None
        if not self.topics:
            raise MessagingError("option topics is required, e.g. 1,2")
        self.starting = options.get("startingindex", "earliest")
        self.ending = options.get("endingindex", "latest")
        self.max_records = _positive(options, "maxRecordsPerTrigger")
        self.partition_size = _positive(options, "partitionSize") or DEFAULT_PARTITION_SIZE
        flag = options.get("failondataloss", "true").lower()
        if flag not in ("true", "false"):
            raise MessagingError(f"option failOnDataLoss {flag!r}: expected true or false")
        self.fail_on_data_loss = flag == "true"


def lower_case(options: dict[str, str]) -> dict[str, str]:
    """The options with lower-case names."""
    return {key.lower(): value for key, value in options.items()}


def broker_urls(options: dict[str, str]) -> tuple[str, ...]:
    """The broker URLs of option ``urls`` (comma separated) or ``url``."""
    urls = options.get("urls") or options.get("url") or ""
    found = tuple(u.strip().rstrip("/") for u in urls.split(",") if u.strip())
    if not found:
        raise MessagingError("option url (or urls) is required, e.g. http://127.0.0.1:8086")
    return found


def max_publish_bytes(options: dict[str, str], default: int) -> int:
    """Option ``maxPublishBytes`` of a writer: the size of one publish request."""
    return _positive(lower_case(options), "maxPublishBytes") or default


def _positive(options: dict[str, str], name: str) -> int | None:
    value = options.get(name.lower())
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise MessagingError(f"option {name} {value!r}: expected a positive integer") from None
    if number < 1:
        raise MessagingError(f"option {name} {value!r}: expected a positive integer")
    return number
