"""The Kafka wire protocol as this listener speaks it: framing, request headers, the APIs and
versions it answers, and requests and responses as plain dicts.

Every request and response body is one of aiokafka's protocol structs (the schemas kafka-python
wrote from Kafka's message definitions), looked up by API and version; this module turns a
request into a dict of its fields (:func:`read_request`) and a handler's dict into the
response of the request's version (:func:`encode_response`), filling the fields a version has
and the handler left out with their zero values. Only non-flexible versions are offered, so no
request or response carries tagged fields: the kcat of Debian (librdkafka 2.0.2, which misreads
non-empty tagged fields) and current clients alike negotiate them. A client that opens with a
newer ApiVersions (librdkafka sends v3) is answered with v0 and UNSUPPORTED_VERSION, and
retries with the versions it is told, as Kafka's own brokers have it.
"""

from __future__ import annotations

import functools
import importlib
import struct
from dataclasses import dataclass
from typing import Any

from aiokafka.protocol.types import Array, Boolean, Bytes, Schema, String

#: Error codes (Kafka's protocol guide).
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
NOT_LEADER_OR_FOLLOWER = 6
INVALID_TOPIC_EXCEPTION = 17
RECORD_LIST_TOO_LARGE = 18
NOT_ENOUGH_REPLICAS = 19
INVALID_REQUIRED_ACKS = 21
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REQUEST = 42
INVALID_CONFIG = 40
NOT_CONTROLLER = 41
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
UNKNOWN_PRODUCER_ID = 59
UNSUPPORTED_COMPRESSION_TYPE = 76
UNKNOWN_SERVER_ERROR = -1

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
SASL_HANDSHAKE, API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS = 17, 18, 19, 20
INIT_PRODUCER_ID, DESCRIBE_CONFIGS, SASL_AUTHENTICATE = 22, 32, 36

#: The largest request this listener reads (a Produce of many batches fits; more is a
#: broken or hostile client, whose connection is closed).
MAX_REQUEST_SIZE = 100 << 20

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhih")  # api key, version, correlation id, client id length
_CORRELATION = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Api:
    """One API this listener answers: its key, name, the versions it offers, and where
    aiokafka keeps its structs (module, request class prefix, response class prefix)."""

    key: int
    name: str
    low: int
    high: int
    module: str
    request: str
    response: str

    def structs(self, version: int) -> tuple[Any, Any]:
        """The request and response struct classes of ``version``."""
        module = importlib.import_module(f"aiokafka.protocol.{self.module}")
        return (getattr(module, f"{self.request}_v{version}"),
                getattr(module, f"{self.response}_v{version}"))


#: The APIs and versions offered: the newest non-flexible version of each that aiokafka
#: describes, and no version older than record batches v2 (Produce v3, Fetch v4).
APIS: dict[int, Api] = {api.key: api for api in (
    Api(PRODUCE, "Produce", 3, 8, "produce", "ProduceRequest", "ProduceResponse"),
    Api(FETCH, "Fetch", 4, 11, "fetch", "FetchRequest", "FetchResponse"),
    # v4 and later: aiokafka's schema has current_leader_epoch as an int64 (Kafka's is int32).
    Api(LIST_OFFSETS, "ListOffsets", 1, 3, "offset", "OffsetRequest", "OffsetResponse"),
    Api(METADATA, "Metadata", 0, 5, "metadata", "MetadataRequest", "MetadataResponse"),
    Api(OFFSET_COMMIT, "OffsetCommit", 2, 3, "commit", "OffsetCommitRequest",
        "OffsetCommitResponse"),
    Api(OFFSET_FETCH, "OffsetFetch", 1, 3, "commit", "OffsetFetchRequest",
        "OffsetFetchResponse"),
    Api(FIND_COORDINATOR, "FindCoordinator", 0, 1, "coordination", "FindCoordinatorRequest",
        "FindCoordinatorResponse"),
    # JoinGroup v4 and later ask a new member to join twice (KIP-394), v5 adds static members.
    Api(JOIN_GROUP, "JoinGroup", 0, 2, "group", "JoinGroupRequest", "JoinGroupResponse"),
    Api(HEARTBEAT, "Heartbeat", 0, 1, "group", "HeartbeatRequest", "HeartbeatResponse"),
    Api(LEAVE_GROUP, "LeaveGroup", 0, 1, "group", "LeaveGroupRequest", "LeaveGroupResponse"),
    Api(SYNC_GROUP, "SyncGroup", 0, 1, "group", "SyncGroupRequest", "SyncGroupResponse"),
    Api(API_VERSIONS, "ApiVersions", 0, 2, "admin", "ApiVersionRequest", "ApiVersionResponse"),
    Api(CREATE_TOPICS, "CreateTopics", 0, 3, "admin", "CreateTopicsRequest",
        "CreateTopicsResponse"),
    Api(DELETE_TOPICS, "DeleteTopics", 0, 3, "admin", "DeleteTopicsRequest",
        "DeleteTopicsResponse"),
    Api(INIT_PRODUCER_ID, "InitProducerId", 0, 0, "transaction", "InitProducerIdRequest",
        "InitProducerIdResponse"),
    Api(DESCRIBE_CONFIGS, "DescribeConfigs", 0, 2, "admin", "DescribeConfigsRequest",
        "DescribeConfigsResponse"),
    # v0 would carry the SASL exchange outside Kafka's framing: only v1, with
    # SaslAuthenticate, is offered.
    Api(SASL_HANDSHAKE, "SaslHandshake", 1, 1, "admin", "SaslHandShakeRequest",
        "SaslHandShakeResponse"),
    Api(SASL_AUTHENTICATE, "SaslAuthenticate", 0, 1, "admin", "SaslAuthenticateRequest",
        "SaslAuthenticateResponse"),
)}


class ProtocolError(Exception):
    """A request this listener cannot even answer (its connection is closed)."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A request's header (v1: flexible versions, which carry v2 headers, are not offered)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_at: int  # where the body starts in the request


def frame_size(prefix: bytes) -> int:
    """The size a 4-byte length prefix announces (ProtocolError when out of bounds)."""
    size: int = _SIZE.unpack(prefix)[0]
    if not 0 < size <= MAX_REQUEST_SIZE:
        raise ProtocolError(f"a request of {size} bytes (at most {MAX_REQUEST_SIZE})")
    return size


def read_header(data: bytes) -> RequestHeader:
    """The header at the start of a request."""
    if len(data) < _HEADER.size:
        raise ProtocolError(f"a request of {len(data)} bytes is shorter than its header")
    api_key, version, correlation, length = _HEADER.unpack_from(data)
    at = _HEADER.size
    client_id = None
    if length >= 0:
        client_id = data[at:at + length].decode("utf-8", "replace")
        at += length
    return RequestHeader(api_key, version, correlation, client_id, at)


def offered(api_key: int, version: int) -> Api | None:
    """The API when this version of it is offered, else None."""
    api = APIS.get(api_key)
    return api if api is not None and api.low <= version <= api.high else None


def read_request(api: Api, header: RequestHeader, data: bytes) -> dict[str, Any]:
    """A request's body as a dict of its fields (ProtocolError when it does not decode)."""
    request_class, _ = api.structs(header.api_version)
    try:
        decoded = request_class.decode(data[header.body_at:])
    except Exception as err:  # the structs raise anything from struct.error to ValueError
        raise ProtocolError(f"{api.name} v{header.api_version} request does not decode: "
                            f"{err}") from err
    return _to_dict(request_class.SCHEMA, decoded)


def dict_of(schema: Schema, struct_: Any) -> dict[str, Any]:
    """A decoded struct of ``schema`` as a dict of its fields (arrays of structs as lists of
    dicts)."""
    return _to_dict(schema, struct_)


def fields_of(schema: Schema, values: dict[str, Any]) -> list[Any]:
    """What ``schema`` encodes, from a dict of its fields (one left out: its zero)."""
    return _from_dict(schema, values)


def _to_dict(schema: Schema, struct_: Any) -> dict[str, Any]:
    values = [getattr(struct_, name) for name in schema.names] if not isinstance(
        struct_, tuple) else list(struct_)
    out: dict[str, Any] = {}
    for name, field, value in zip(schema.names, schema.fields, values, strict=True):
        out[name] = _value_to_plain(field, value)
    return out


def _value_to_plain(field: Any, value: Any) -> Any:
    if isinstance(field, Array) and isinstance(field.array_of, Schema):
        return [] if value is None else [_to_dict(field.array_of, item) for item in value]
    if isinstance(field, Schema):
        return _to_dict(field, value)
    return value


def encode_response(api: Api, version: int, correlation_id: int,
                    body: dict[str, Any]) -> bytes:
    """The whole response frame (length, correlation id, body) of a handler's dict."""
    _, response_class = api.structs(version)
    encoded = response_class.SCHEMA.encode(_from_dict(response_class.SCHEMA, body))
    return _frame(correlation_id, encoded)


def _frame(correlation_id: int, body: bytes) -> bytes:
    return _SIZE.pack(len(body) + 4) + _CORRELATION.pack(correlation_id) + body


#: What a field a handler left out is (by field name; anything else: 0).
_ZERO: dict[str, Any] = {"error_message": None, "rack": None, "cluster_id": None,
                         "replicas": [], "isr": [], "offline_replicas": [],
                         "aborted_transactions": None, "record_errors": [],
                         "config_synonyms": [], "preferred_read_replica": -1,
                         "log_start_offset": -1, "leader_epoch": -1}


def _zero(name: str, field: Any) -> Any:
    """What a field a handler left out is."""
    if name in _ZERO:
        return _ZERO[name]
    if isinstance(field, Array):
        return []
    if isinstance(field, Schema):
        return {}
    if field is Bytes or isinstance(field, String):
        return None
    return False if field is Boolean else 0


def _from_dict(schema: Schema, values: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for name, field in zip(schema.names, schema.fields, strict=True):
        value = values[name] if name in values else _zero(name, field)
        if isinstance(field, Array) and isinstance(field.array_of, Schema):
            value = None if value is None else [_from_dict(field.array_of, item)
                                                for item in value]
        elif isinstance(field, Schema):
            value = _from_dict(field, value)
        out.append(value)
    return out


_MODULES = ("admin", "commit", "coordination", "fetch", "group", "metadata", "offset",
            "produce", "transaction")


@functools.cache
def _known_responses() -> dict[tuple[int, int], Any]:
    """Every response struct aiokafka describes, by (API key, version)."""
    found: dict[tuple[int, int], Any] = {}
    for name in _MODULES:
        module = importlib.import_module(f"aiokafka.protocol.{name}")
        for value in vars(module).values():
            key, version = getattr(value, "API_KEY", None), getattr(value, "API_VERSION", None)
            response = getattr(value, "RESPONSE_TYPE", None)
            if (isinstance(key, int) and isinstance(version, int) and response is not None
                    and not getattr(value, "FLEXIBLE_VERSION", False)):
                found[(key, version)] = response
    return found


def unsupported(api_key: int, version: int, correlation_id: int) -> bytes | None:
    """An answer with UNSUPPORTED_VERSION to a request of an API or version not offered, when
    its response has an error code of its own to carry it (None: it has none, and the
    connection is closed instead)."""
    if api_key == API_VERSIONS:
        api = APIS[API_VERSIONS]
        body = api_versions_body()
        body["error_code"] = UNSUPPORTED_VERSION
        return encode_response(api, 0, correlation_id, body)
    response = _known_responses().get((api_key, version))
    if response is None or "error_code" not in response.SCHEMA.names:
        return None
    encoded = response.SCHEMA.encode(_from_dict(response.SCHEMA,
                                                {"error_code": UNSUPPORTED_VERSION}))
    return _frame(correlation_id, encoded)


def by_topic(answers: list[tuple[str, dict[str, Any]]], key: str = "topic",
             ) -> list[dict[str, Any]]:
    """Per-partition answers grouped under their topics, in the order the topics came (a
    response's ``topics`` array; ``key`` names the topic field, which Fetch calls
    ``topics``)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for name, answer in answers:
        grouped.setdefault(name, []).append(answer)
    return [{key: name, "partitions": parts} for name, parts in grouped.items()]


def api_versions_body() -> dict[str, Any]:
    """The body of an ApiVersions response: every API offered with its versions."""
    return {"error_code": NONE, "api_versions": [
        {"api_key": api.key, "min_version": api.low, "max_version": api.high}
        for api in APIS.values()]}

