"""Every setting of a broker: its default, its command-line flag and its help, in one place.

``BrokerConfig`` is the single source of defaults: the modules that need one import the
``DEFAULT_*`` constants below, and ``messaging broker``'s options are built from the fields'
metadata (:func:`broker_options`).

One parser for each kind of value, wherever it comes from (a flag, the environment, a
settings file, a JSON body, the CLI): :func:`parse_size` reads ``10M``-style text, a bare
number being a byte count; :func:`parse_duration` reads ``10m``-style text, and refuses a
bare number other than 0, which one caller read as seconds and another as milliseconds
("add a unit"). :func:`size_of` and :func:`duration_of` take the same values as JSON or
TOML, numbers included.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from messaging.errors import BadRequestError, ConfigError

FsyncMode = Literal["always", "interval", "never"]
FSYNC_MODES: tuple[FsyncMode, ...] = ("always", "interval", "never")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8086
#: A new segment starts once the active one has grown past this many bytes.
DEFAULT_MAX_SEGMENT_SIZE = 10 << 20
#: Retention deletes old segments of topics larger than this.
DEFAULT_MAX_TOPIC_SIZE = 1 << 30
#: Largest message data accepted.
DEFAULT_MAX_MESSAGE_SIZE = 1 << 20
#: Largest publish request body accepted (and the size clients cut batches to).
DEFAULT_MAX_REQUEST_SIZE = 64 << 20
DEFAULT_TRUNCATION_INTERVAL = 600.0
#: A subscriber silent this long stops holding data back.
DEFAULT_LONG_POLL_TIMEOUT = 10.0
DEFAULT_SUBSCRIBER_TIMEOUT = 600.0
#: Seconds a connection may take to send a complete request head.
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_MAX_CLOCK_OFFSET = 0.5
DEFAULT_CLUSTER_SYNC_INTERVAL = 0.1
DEFAULT_CLUSTER_APPLY_LINGER = 0.02
DEFAULT_ETCD_COMPACT_EVERY = 1000
#: Streaming reads (native streams, long-polls, SSE) served at once; more are answered 503.
DEFAULT_MAX_STREAMS = 10_000
#: Subscribers (consumer ids) a topic may have registered; a new one beyond is refused (429).
DEFAULT_MAX_SUBSCRIBERS = 1000
#: Longest subscriber (consumer) id accepted.
MAX_SUBSCRIBER_ID = 256
#: Uploads slower than this (bytes per second, after UPLOAD_GRACE seconds) are cut (408).
DEFAULT_MIN_UPLOAD_RATE = 1024
UPLOAD_GRACE = 10.0
#: Bytes of object chunks a broker keeps in memory for reads from its object store.
DEFAULT_OBJECT_CACHE_SIZE = 256 << 20
#: Segments uploaded to the object store at once.
DEFAULT_OBJECT_UPLOADS = 4
#: Seconds an object no manifest will ever record is left before the sweep deletes it.
DEFAULT_OBJECT_SWEEP_GRACE = 600.0
DEFAULT_OBJECT_STORE_TIMEOUT = 10.0
DEFAULT_INTAKE_MIN_SIZE = 64 << 10
DEFAULT_INTAKE_WINDOW = 0.02
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_size(text: str) -> int:
    """``10M``, ``10MiB``, ``1g`` or a plain byte count (ASCII digits)."""
    match = _SIZE.match(text) if text.isascii() else None
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use e.g. 1048576, 10M, 1G")
    number, unit = int(match.group(1)), match.group(2).lower()
    return number << _SIZE_UNITS[unit]


def positive_size(text: str) -> int:
    """A size above zero."""
    size = parse_size(text)
    if size <= 0:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: must be above zero")
    return size


def parse_duration(text: str) -> float:
    """Seconds from ``100ms``, ``10s``, ``10m``, ``1h`` or ``7d`` text; ``0`` needs no unit.

    Any other bare number is refused: read as seconds on one path and as milliseconds on
    another, ``12`` meant durations 1000 times apart.
    """
    match = _DURATION.match(text) if text.isascii() else None
    if not match:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 500ms, 10s, 10m")
    number, unit = float(match.group(1)), match.group(2)
    if unit is None:
        if number == 0:
            return 0.0
        raise _no_unit(match.group(1))
    return number * _DURATION_UNITS[unit.lower()]


def _no_unit(number: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(
        f"invalid duration {number}: add a unit: {number}s, {number}h "
        f"(units: {', '.join(_DURATION_UNITS)})")


def duration_of(value: object) -> float:
    """Seconds from a duration given as JSON or TOML: text, or a number read as its text
    would be (so 0 is 0, and any other number is refused for want of a unit)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise argparse.ArgumentTypeError(f"invalid duration {value!r}: expected a duration "
                                         "such as 500ms, 10s or 7d")
    return parse_duration(value)


def size_of(value: object) -> int:
    """Bytes from a size given as JSON or TOML: text as :func:`parse_size` reads it, or a
    whole number of bytes as it is (the caller checks its range)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise argparse.ArgumentTypeError(f"invalid size {value!r}: expected a size such as "
                                         "1048576, 10M or 1G")
    return parse_size(value)


def positive_duration(text: str) -> float:
    """A duration above zero."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be above zero")
    return seconds


def natural(text: str) -> int:
    """An integer of at least 0 (ASCII digits)."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected an integer >= 0")
    return int(text)


def positive_int(text: str) -> int:
    """An integer of at least 1 (ASCII digits)."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected an integer >= 1")
    return int(text)


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT``."""
    host, sep, port = text.rpartition(":")
    if (not sep or not host or not (port.isascii() and port.isdigit())
            or not 0 <= int(port) <= 65535):
        raise argparse.ArgumentTypeError(f"invalid address {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def show_address(address: tuple[str, int]) -> str:
    """``HOST:PORT`` (brackets around an IPv6 host)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def show_size(size: int) -> str:
    """A size as the shortest ``10M``-style text that reads back the same."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if size and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def show_duration(seconds: float) -> str:
    """A duration as ``10m``/``10s``/``500ms`` text."""
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= length and seconds % length == 0:
            return f"{int(seconds // length)}{unit}"
    return f"{round(seconds * 1000)}ms"


@dataclass(frozen=True)
class Option:
    """How a :class:`BrokerConfig` field appears on the command line."""

    flag: str
    help: str
    parse: Callable[[str], Any] | None = None
    show: Callable[[Any], str] = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    repeat: bool = False  # the flag may be given several times (a list field)
    switch: bool = False  # a flag without a value (a bool field)


def _option(default: Any, flag: str, help: str, **how: Any) -> Any:
    option = Option(flag, help, **how)
    if isinstance(default, list):
        return field(default_factory=list, metadata={"option": option})
    if isinstance(default, bool):
        option = Option(flag, help, switch=True, **how)
    return field(default=default, metadata={"option": option})


@dataclass
class BrokerConfig:
    """Everything ``messaging broker`` can be told (``--bind`` sets ``host`` and ``port``)."""

    data: Path = _option(Path("./data"), "--data", "data directory", parse=Path,
                         show=lambda path: f"./{path}", metavar="DIR")
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    fsync: FsyncMode = _option("always", "--fsync", "durability mode, see above",
                               choices=FSYNC_MODES)
    max_segment_size: int = _option(
        DEFAULT_MAX_SEGMENT_SIZE, "--max-segment-size",
        "start a new segment file past this size", parse=positive_size, show=show_size,
        metavar="SIZE")
    max_topic_size: int = _option(
        DEFAULT_MAX_TOPIC_SIZE, "--max-topic-size",
        "retention deletes old segments of topics above this", parse=parse_size,
        show=show_size, metavar="SIZE")
    max_message_size: int = _option(
        DEFAULT_MAX_MESSAGE_SIZE, "--max-message-size", "largest message data accepted",
        parse=positive_size, show=show_size, metavar="SIZE")
    max_request_size: int = _option(
        DEFAULT_MAX_REQUEST_SIZE, "--max-request-size",
        "largest batch publish body accepted", parse=positive_size, show=show_size,
        metavar="SIZE")
    retention_age: float | None = _option(
        None, "--retention-age", "retention also deletes old segments whose newest message "
        "was appended longer ago than this (default: off; a topic may set its own)",
        parse=positive_duration, show=show_duration, metavar="DURATION")
    object_store: str | None = _option(
        None, "--object-store", "keep rolled segments in an object store as well as, then "
        "instead of, the local disk: s3://BUCKET/PREFIX (credentials and region the AWS way: "
        "environment, ~/.aws files) or file:///PATH (default: off)", metavar="URL")
    s3_endpoint: str | None = _option(
        None, "--s3-endpoint", "the endpoint of an S3-compatible store (SeaweedFS, MinIO, "
        "...) for an s3:// --object-store; TLS is verified for https", metavar="URL")
    local_retention_size: int | None = _option(
        None, "--local-retention-size", "with --object-store: delete the oldest local "
        "copies of segments already in the store while a topic's local files are above "
        "this (default: --max-topic-size)", parse=parse_size, show=show_size,
        metavar="SIZE")
    local_retention_age: float | None = _option(
        None, "--local-retention-age", "with --object-store: also delete local copies of "
        "segments in the store whose newest message is older than this (default: off)",
        parse=positive_duration, show=show_duration, metavar="DURATION")
    object_cache_size: int = _option(
        DEFAULT_OBJECT_CACHE_SIZE, "--object-cache-size", "memory kept for chunks read from "
        "the object store", parse=parse_size, show=show_size, metavar="SIZE")
    object_uploads: int = _option(
        DEFAULT_OBJECT_UPLOADS, "--object-uploads", "segments uploaded to the object store "
        "at once", parse=positive_int, metavar="N")
    object_sweep_grace: float = _option(
        DEFAULT_OBJECT_SWEEP_GRACE, "--object-sweep-grace", "how long an object in the store "
        "that no manifest records or ever will (an interrupted upload or deletion) is left "
        "before it is deleted", parse=positive_duration, show=show_duration,
        metavar="DURATION")
    object_store_timeout: float = _option(
        DEFAULT_OBJECT_STORE_TIMEOUT, "--object-store-timeout", "how long a read waits for one "
        "request to the object store, retries included: a read that needs a store that does "
        "not answer gets its 503 (naming the object, with Retry-After) after this",
        parse=positive_duration, show=show_duration, metavar="DURATION")
    intake_min_size: int = _option(
        DEFAULT_INTAKE_MIN_SIZE, "--intake-min-size", "cluster mode with --object-store: a "
        "publish of at least this many bytes of frames goes to the object store once, in an "
        "object shared with the node's other large publishes, and etcd carries only a "
        "pointer to it (0: every publish goes through etcd)", parse=parse_size,
        show=show_size, metavar="SIZE")
    intake_window: float = _option(
        DEFAULT_INTAKE_WINDOW, "--intake-window", "cluster mode with --object-store: how long "
        "a node gathers large publishes into one object (at most 8 MiB) before writing it",
        parse=positive_duration, show=show_duration, metavar="DURATION")
    truncation_interval: float = _option(
        DEFAULT_TRUNCATION_INTERVAL, "--truncation-interval", "how often retention runs",
        parse=positive_duration, show=show_duration, metavar="DURATION")
    subscriber_timeout: float = _option(
        DEFAULT_SUBSCRIBER_TIMEOUT, "--subscriber-timeout",
        "a subscriber silent this long stops holding data back", parse=positive_duration,
        show=show_duration, metavar="DURATION")
    long_poll_timeout: float = _option(
        DEFAULT_LONG_POLL_TIMEOUT, "--long-poll-timeout",
        "a Durable Streams long-poll with no new data answers 204 after this long",
        parse=positive_duration, show=show_duration, metavar="DURATION")
    header_timeout: float = _option(
        DEFAULT_HEADER_TIMEOUT, "--header-timeout",
        "close a connection that has not sent a complete request head this long after "
        "connecting or after its last response (so idle kept-alive connections too); "
        "requests being served, uploads and streams are not affected",
        parse=positive_duration, show=show_duration, metavar="DURATION")
    max_connections: int = _option(
        DEFAULT_MAX_CONNECTIONS, "--max-connections",
        "connections served at once; more are answered 503 and closed", parse=positive_int,
        metavar="N")
    advertise: str | None = _option(
        None, "--advertise", "the HTTP URL other nodes and clients use for this node",
        metavar="URL")
    etcd: str | None = _option(
        None, "--etcd", "cluster mode: etcd endpoints; the broker nodes of --cluster share one "
        "command log in etcd, and a publish is acknowledged once etcd committed it (etcd is "
        "the write-ahead log) and this node applied it (see --cluster-sync-interval)",
        metavar="URL[,URL...]")
    cluster: str | None = _option(
        None, "--cluster", "cluster mode: the cluster name (etcd keys under /messaging/NAME/)",
        metavar="NAME")
    groups: int = _option(
        1, "--groups", "cluster mode: the number of topic groups, each a command log of its "
        "own; fixed when the cluster is first created (recorded in etcd)", parse=positive_int,
        metavar="G")
    replicas: int = _option(
        3, "--replicas", "cluster mode with --groups above 1: the nodes that hold (apply and "
        "store) each group; every node when there are fewer", parse=positive_int, metavar="R")
    group_requests: str = _option(
        "forward", "--group-requests", "cluster mode with --groups above 1: what a node does "
        "with a request for a group it does not serve: forward it to a holder and pass the "
        "answer back, or redirect the client there (307)", choices=("forward", "redirect"))
    group_etcd: list[str] = _option(
        [], "--group-etcd", "cluster mode: group G's command log lives in this etcd cluster "
        "instead of --etcd (repeat for several groups)", repeat=True,
        metavar="G=URL[,URL...]")
    etcd_ca: Path | None = _option(None, "--etcd-ca", "CA bundle for https etcd URLs",
                                   parse=Path, metavar="FILE")
    etcd_cert: Path | None = _option(None, "--etcd-cert", "client certificate for etcd",
                                     parse=Path, metavar="FILE")
    etcd_key: Path | None = _option(None, "--etcd-key", "client key for etcd", parse=Path,
                                    metavar="FILE")
    etcd_user: str | None = _option(
        None, "--etcd-user", "etcd user; the password comes from $MESSAGING_ETCD_PASSWORD",
        metavar="USER")
    etcd_password: str | None = None  # from the environment, never a flag
    etcd_compact_every: int = _option(
        DEFAULT_ETCD_COMPACT_EVERY, "--etcd-compact-every",
        "compact etcd's history once every node's durable revision moved N revisions",
        parse=positive_int, metavar="N")
    cluster_sync_interval: float = _option(
        DEFAULT_CLUSTER_SYNC_INTERVAL, "--cluster-sync-interval",
        "in a cluster, etcd is the write-ahead log (a publish is durable once etcd committed "
        "it); a node fsyncs its own files in groups at most this often, off the answer's "
        "path, and records how far they are durable", parse=positive_duration,
        show=show_duration, metavar="DURATION")
    cluster_apply_linger: float = _option(
        DEFAULT_CLUSTER_APPLY_LINGER, "--cluster-apply-linger",
        "in a cluster, a node applies a steady stream of revisions made by other nodes at "
        "most this often, several at a time (each wake-up of its writer costs CPU: 20ms "
        "halves a holder's writer CPU); what its own publishers wait for, anything after a "
        "quiet spell and whatever a read waits for are applied at once, so only a "
        "subscriber here to a topic published through another node may get a message that "
        "much later; 0 applies every revision as it comes", parse=parse_duration,
        show=show_duration, metavar="DURATION")
    max_clock_offset: float = _option(
        DEFAULT_MAX_CLOCK_OFFSET, "--max-clock-offset",
        "in a cluster, how far a node's wall clock may be from its peers' (measured every "
        "second); a node further off answers writes 503 and is not ready until its clock is "
        "back, so no clock moves the cluster's time more than this", parse=positive_duration,
        show=show_duration, metavar="DURATION")
    tokens: Path | None = _option(
        None, "--tokens", "bearer tokens and their scopes (see messaging token create); "
        "reread when it changes and on SIGHUP. Without it every request is allowed, which is "
        "refused unless the broker binds a loopback address or --insecure is given",
        parse=Path, metavar="FILE")
    insecure: bool = _option(
        False, "--insecure", "serve a non-loopback address without --tokens (anyone who "
        "reaches the port may read, write and delete)")
    peer_token: str | None = None  # $MESSAGING_PEER_TOKEN: peers' snapshots need admin
    tls_cert: Path | None = _option(None, "--tls-cert", "serve HTTPS with this certificate "
                                    "(PEM, chain included)", parse=Path, metavar="FILE")
    tls_key: Path | None = _option(None, "--tls-key", "the private key of --tls-cert",
                                   parse=Path, metavar="FILE")
    peer_ca: Path | None = _option(
        None, "--peer-ca", "cluster mode: the CA of the other nodes' HTTPS certificates (for "
        "snapshot fetches and Kafka requests asked of another node; the system's CAs "
        "otherwise)", parse=Path, metavar="FILE")
    tls_client_ca: Path | None = _option(
        None, "--tls-client-ca", "require client certificates signed by this CA", parse=Path,
        metavar="FILE")
    kafka_bind: tuple[str, int] | None = _option(
        None, "--kafka-bind", "also serve the Kafka protocol on this address (off by default): "
        "Kafka clients produce to and consume from the same topics, a Kafka topic of P "
        "partitions being P topics of the broker; with --tls-cert it speaks TLS",
        parse=parse_host_port, show=show_address, metavar="HOST:PORT")
    kafka_advertise: tuple[str, int] | None = _option(
        None, "--kafka-advertise", "the address Kafka clients are told to connect to (default: "
        "--kafka-bind's)", parse=parse_host_port, show=show_address, metavar="HOST:PORT")
    kafka_auto_create: str = _option(
        "on", "--kafka-auto-create", "create a Kafka topic (1 partition) on the first produce "
        "or metadata request that names it, as Kafka does by default", choices=("on", "off"))
    max_streams: int = _option(
        DEFAULT_MAX_STREAMS, "--max-streams", "streaming reads (native streams, long-polls, "
        "SSE) at once; more are answered 503", parse=positive_int, metavar="N")
    max_subscribers: int = _option(
        DEFAULT_MAX_SUBSCRIBERS, "--max-subscribers", "registered subscribers per topic; a "
        "heartbeat of a new one beyond is answered 429", parse=positive_int, metavar="N")
    min_upload_rate: int = _option(
        DEFAULT_MIN_UPLOAD_RATE, "--min-upload-rate", "request bodies slower than this many "
        f"bytes per second (after {UPLOAD_GRACE:g} s) are cut off with 408 (0: never)",
        parse=parse_size, show=show_size, metavar="SIZE")
    max_append_rate: int = _option(
        0, "--max-append-rate", "appends per second per topic; more are answered 429 with "
        "Retry-After (0: no limit)", parse=natural, metavar="N")
    access_log: bool = _option(False, "--access-log",
                               "log one line per request (method, path, status, bytes, "
                               "duration, token name)")
    log_format: str = _option("text", "--log-format", "text or json (one object per line)",
                              choices=LOG_FORMATS)
    log_level: str = _option("INFO", "--log-level", "DEBUG, INFO, WARNING or ERROR (any case)",
                             parse=str.upper, choices=LOG_LEVELS)

    def check_object_store(self) -> None:
        """Refuse object store options without ``--object-store``."""
        if self.object_store is None:
            given = [flag for flag, value in (
                ("--s3-endpoint", self.s3_endpoint),
                ("--local-retention-size", self.local_retention_size),
                ("--local-retention-age", self.local_retention_age)) if value is not None]
            if given:
                raise BadRequestError(f"{', '.join(given)} need --object-store")

    def etcd_settings(self) -> EtcdSettings | None:
        """How to reach etcd (None for a single node); checks the cluster options."""
        if not self.etcd and not self.cluster:
            return None
        if not self.etcd or not self.cluster:
            raise BadRequestError("--etcd and --cluster go together")
        if "~" in self.cluster:
            raise BadRequestError(f"invalid cluster name {self.cluster!r}: '~' is kept for "
                                  "the names of topic groups' logs")
        self.group_endpoints()  # checks --group-etcd against --groups
        return EtcdSettings(
            endpoints=tuple(u.strip() for u in self.etcd.split(",") if u.strip()),
            cluster=self.cluster, ca=self.etcd_ca, cert=self.etcd_cert, key=self.etcd_key,
            user=self.etcd_user, password=self.etcd_password if self.etcd_user else None,
            compact_every=self.etcd_compact_every, sync_interval=self.cluster_sync_interval,
            apply_linger=self.cluster_apply_linger,
            max_clock_offset_ms=max(1, round(self.max_clock_offset * 1000)))

    def group_endpoints(self) -> dict[int, tuple[str, ...]]:
        """The groups given an etcd cluster of their own (``--group-etcd G=URL,...``)."""
        placed: dict[int, tuple[str, ...]] = {}
        for item in self.group_etcd:
            group, sep, urls = item.partition("=")
            if not sep or not (group.isascii() and group.isdigit()):
                raise BadRequestError(f"invalid --group-etcd {item!r}: expected G=URL[,URL...]")
            if int(group) >= self.groups:
                raise BadRequestError(f"invalid --group-etcd {item!r}: there are groups 0 to "
                                      f"{self.groups - 1} (--groups {self.groups})")
            endpoints = tuple(u.strip() for u in urls.split(",") if u.strip())
            if not endpoints:
                raise BadRequestError(f"invalid --group-etcd {item!r}: no etcd URL")
            placed[int(group)] = endpoints
        return placed


@dataclass(frozen=True)
class EtcdSettings:
    """How to reach etcd and which cluster of broker nodes this is."""

    endpoints: tuple[str, ...]
    cluster: str
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    user: str | None = None
    password: str | None = None
    #: Compact etcd's history once the smallest durable revision moved this far.
    compact_every: int = 1000
    #: How often (at most) a node fsyncs what it applied (seconds): etcd is the WAL.
    sync_interval: float = 0.1
    #: How long a steady stream of other nodes' revisions may wait to be applied together
    #: (seconds; 0: each as it comes).
    apply_linger: float = DEFAULT_CLUSTER_APPLY_LINGER
    #: How far a node's clock may be from its peers' before it stops taking writes (ms).
    max_clock_offset_ms: int = 500

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise BadRequestError("--etcd needs at least one URL")
        for url in self.endpoints:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
                raise BadRequestError(f"invalid etcd URL {url!r}: expected http(s)://HOST:PORT")
        if not self.cluster or "/" in self.cluster:
            raise BadRequestError(f"invalid cluster name {self.cluster!r}: must be non-empty, "
                                  "without '/'")
        if (self.cert is None) != (self.key is None):
            raise BadRequestError("--etcd-cert and --etcd-key go together")
        if (self.user is None) != (self.password is None):
            raise BadRequestError("--etcd-user needs a password (MESSAGING_ETCD_PASSWORD)")



def broker_options() -> Iterator[tuple[str, Option, Any]]:
    """(field name, option, default) of every BrokerConfig field that has a flag."""
    for f in fields(BrokerConfig):
        option = f.metadata.get("option")
        if option is not None:
            default = [] if option.repeat else f.default
            yield f.name, option, default


#: Environment variables ``MESSAGING_<FIELD>`` (e.g. ``MESSAGING_MAX_SEGMENT_SIZE``) set
#: options too, as do the keys of a TOML ``--config`` file (``max-segment-size = "64M"``).
ENV_PREFIX = "MESSAGING_"


def load_config(explicit: Mapping[str, Any], environ: Mapping[str, str],
                config_file: Path | None) -> BrokerConfig:
    """A BrokerConfig from, by precedence: command-line options given (``explicit``), then
    ``MESSAGING_*`` environment variables, then the TOML config file, then the defaults."""
    options = {name: option for name, option, _default in broker_options()}
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            with config_file.open("rb") as f:
                data = tomllib.load(f)
        except OSError as err:
            raise ConfigError(f"cannot read config file {config_file}: "
                              f"{err.strerror or err}") from err
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {config_file} is not valid TOML: {err}") from err
        for key, raw in data.items():
            name = key.replace("-", "_")
            where = f"{config_file}: {key}"
            if name == "bind":
                values["host"], values["port"] = _parsed(parse_host_port, str(raw), where)
            elif name in options:
                values[name] = _value(options[name], raw, where)
            else:
                raise ConfigError(f"{where}: unknown setting (settings are the broker's "
                                  "options without the leading dashes, e.g. max-segment-size)")
    if ENV_PREFIX + "BIND" in environ:
        values["host"], values["port"] = _parsed(parse_host_port, environ[ENV_PREFIX + "BIND"],
                                                 ENV_PREFIX + "BIND")
    for name, option in options.items():
        variable = ENV_PREFIX + name.upper()
        if variable in environ:
            values[name] = _value(option, environ[variable], variable)
    values.update(explicit)
    values["etcd_password"] = environ.get(ENV_PREFIX + "ETCD_PASSWORD")
    values["peer_token"] = environ.get(ENV_PREFIX + "PEER_TOKEN")
    return BrokerConfig(**values)


def _parsed(parse: Callable[[str], Any], text: str, where: str) -> Any:
    try:
        return parse(text)
    except (argparse.ArgumentTypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err


def _value(option: Option, raw: Any, where: str) -> Any:
    """A setting's value from a config file or the environment, parsed like its flag."""
    if option.switch:
        text = str(raw).strip().lower()
        if isinstance(raw, bool):
            return raw
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{where}: expected true or false, not {raw!r}")
    if option.repeat:
        items = raw if isinstance(raw, list) else str(raw).split(",")
        return [_value(Option(option.flag, option.help, option.parse), item, where)
                for item in items]
    value = _parsed(option.parse or str, str(raw), where)
    if option.choices is not None and value not in option.choices:
        raise ConfigError(f"{where}: {raw!r} is not one of {', '.join(option.choices)}")
    return value
