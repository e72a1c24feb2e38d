"""The data source's options (``url``/``urls``, ``topics``, ``startingIndex``, ...), parsed
once with clear errors. Spark passes option names case-insensitively; so do we.

Where a read starts follows Spark's Kafka source, which documents "``startingTimestamp``
takes precedence over ``startingOffsetsByTimestamp`` and ``startingOffsets``" and
"``startingOffsetsByTimestamp`` takes precedence over ``startingOffsets``": here
``startingTimestamp`` (one time for every topic) > ``startingOffsetsByTimestamp`` (a time per
topic) > ``startingIndex``. A time starts each topic at its first message appended at or
after it; when a topic has none, ``startingOffsetsByTimestampStrategy`` decides: ``error``
(the default) fails the query, ``latest`` starts at the topic's end. A batch read ends at
``endingTimestamp`` (before the first message appended at or after it, or at the end when
there is none) or else at ``endingIndex``. Times are milliseconds since the Unix epoch.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from messaging.errors import MessagingError
from messaging.spark.store_reads import StoreAccess

log = logging.getLogger(__name__)

DEFAULT_PARTITION_SIZE = 100_000
#: What ``startingOffsetsByTimestampStrategy`` takes (Kafka's source: the same two).
STRATEGIES = ("error", "latest")
#: One past the largest time an option takes (a long, as in Kafka's options).
_TIME_LIMIT = 1 << 63
_TIME_EXAMPLE = "1795600000000"


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
        self.strategy = starting_strategy(options)
        #: ``objectStore``: executors read offloaded ranges straight from the store.
        self.store = store_access(options)
        #: ``endingIndex`` or ``endingTimestamp`` was given (a streaming query refuses both).
        self.ending_given = [name for name in ("endingIndex", "endingTimestamp")
                             if name.lower() in options]
        self.ending_time = timestamp_option(options, "endingTimestamp")
        self.start_option, self.start_times = starting_times(options, self.topics)
        if self.start_times is not None and self.ending_time is not None:
            for topic, start in self.start_times.items():
                if start > self.ending_time:
                    raise MessagingError(
                        f"option {self.start_option}: topic {topic} starts at {describe(start)}, "
                        f"after option endingTimestamp {describe(self.ending_time)}")


def store_access(options: dict[str, str]) -> StoreAccess | None:
    """``objectStore`` (the broker's ``--object-store`` URL), ``s3Endpoint`` and the
    optional ``s3AccessKeyId``/``s3SecretAccessKey``/``s3Region`` (else the executors'
    environment), or None: everything through the broker."""
    url = options.get("objectstore") or None
    extra = [name for name in ("s3Endpoint", "s3AccessKeyId", "s3SecretAccessKey", "s3Region")
             if name.lower() in options]
    if url is None:
        if extra:
            raise MessagingError(f"option {extra[0]} needs option objectStore")
        return None
    if not url.startswith(("s3://", "file:///")):
        raise MessagingError(f"option objectStore {url!r}: expected s3://BUCKET/PREFIX or "
                             "file:///PATH, as the broker's --object-store")
    key, secret = options.get("s3accesskeyid"), options.get("s3secretaccesskey")
    if (key is None) != (secret is None):
        raise MessagingError("options s3AccessKeyId and s3SecretAccessKey go together")
    return StoreAccess(url, options.get("s3endpoint"), key, secret, options.get("s3region"))


def starting_times(options: dict[str, str], topics: list[int],
                   ) -> tuple[str | None, dict[int, int] | None]:
    """The option that names where a read starts by time and its time per topic, or
    ``(None, None)`` when ``startingIndex`` does (it has neither). ``options`` has lower-case
    names; every given time option is checked, the one that takes precedence is used."""
    everywhere = timestamp_option(options, "startingTimestamp")
    by_topic = timestamps_by_topic(options, "startingOffsetsByTimestamp", topics)
    if everywhere is not None:
        ignored = [name for name in ("startingOffsetsByTimestamp", "startingIndex")
                   if name.lower() in options]
        if ignored:
            log.info("option startingTimestamp takes precedence over %s", " and ".join(ignored))
        return "startingTimestamp", {topic: everywhere for topic in topics}
    if by_topic is not None:
        if "startingindex" in options:
            log.info("option startingOffsetsByTimestamp takes precedence over startingIndex")
        return "startingOffsetsByTimestamp", by_topic
    return None, None


def starting_strategy(options: dict[str, str]) -> str:
    """Option ``startingOffsetsByTimestampStrategy``: ``error`` (default) or ``latest``."""
    value = options.get("startingoffsetsbytimestampstrategy", "error")
    strategy = value.strip().lower()
    if strategy not in STRATEGIES:
        raise MessagingError(f"option startingOffsetsByTimestampStrategy {value!r}: expected "
                             "error (fail the query when a topic has no message at or after "
                             "the time) or latest (start that topic at its end)")
    return strategy


def timestamp_option(options: dict[str, str], name: str) -> int | None:
    """Option ``name``: a time in milliseconds since the Unix epoch, or None when not given."""
    value = options.get(name.lower())
    if value is None:
        return None
    return milliseconds(value.strip(), f"option {name} {value!r}")


def timestamps_by_topic(options: dict[str, str], name: str,
                        topics: list[int]) -> dict[int, int] | None:
    """Option ``name``: JSON ``{"<topic>": <ms>, ...}`` naming every topic of ``topics`` and
    no other, or None when not given."""
    value = options.get(name.lower())
    if value is None:
        return None
    example = f'{{"{topics[0]}": {_TIME_EXAMPLE}}}'
    try:
        given = json.loads(value)
    except ValueError:
        given = None
    if not isinstance(given, dict):
        raise MessagingError(f"option {name} {value!r}: expected JSON with a time (ms since "
                             f"the Unix epoch) per topic, like {example}")
    times: dict[int, int] = {}
    for key, time_ms in given.items():
        if not (key.isascii() and key.isdigit()) or int(key) not in topics:
            raise MessagingError(f"option {name} names topic {key!r}, which is not one of "
                                 f"option topics ({','.join(map(str, topics))})")
        times[int(key)] = milliseconds(time_ms, f"option {name}, topic {key}: {time_ms!r}")
    missing = [topic for topic in topics if topic not in times]
    if missing:
        raise MessagingError(f"option {name} names no time for topic {missing[0]}: it needs "
                             f"one for every topic read, like {example}")
    return times


def milliseconds(value: object, what: str) -> int:
    """``value`` (a JSON number or a string of digits) as a time in ms since the Unix epoch;
    MessagingError starting with ``what`` for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    else:
        number = -1
    if not 0 <= number < _TIME_LIMIT:
        raise MessagingError(f"{what}: expected a time in milliseconds since the Unix epoch, "
                             f"e.g. {_TIME_EXAMPLE}")
    return number


def describe(time_ms: int) -> str:
    """A time in ms for messages: the number and, when it is a date, its UTC form."""
    try:
        moment = datetime.fromtimestamp(time_ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return str(time_ms)
    return f"{time_ms} ({moment.isoformat(timespec='milliseconds').replace('+00:00', 'Z')})"


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
