"""The wire protocol: framing bounds, request headers, requests decoded into dicts and responses
encoded from dicts with the fields a version has, and the UNSUPPORTED_VERSION answers."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from aiokafka.protocol.admin import ApiVersionResponse_v0
from aiokafka.protocol.metadata import MetadataRequest_v4, MetadataResponse_v0, MetadataResponse_v5
from aiokafka.protocol.produce import ProduceRequest_v7

from messaging.kafka import protocol as p


def _request(struct_: Any, correlation: int = 7, client: str | None = "test") -> bytes:
    header = struct.pack(">hhi", struct_.API_KEY, struct_.API_VERSION, correlation)
    name = b"\xff\xff" if client is None else struct.pack(">h", len(client)) + client.encode()
    return header + name + bytes(struct_.encode())


def test_a_request_reads_back_as_a_dict() -> None:
    data = _request(ProduceRequest_v7(None, -1, 1000, [("t", [(2, b"batch")])]))
    header = p.read_header(data)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        0, 7, 7, "test")
    api = p.offered(header.api_key, header.api_version)
    assert api is not None and api.name == "Produce"
    assert p.read_request(api, header, data) == {
        "transactional_id": None, "required_acks": -1, "timeout": 1000,
        "topics": [{"topic": "t", "partitions": [{"partition": 2, "messages": b"batch"}]}]}


def test_a_null_client_id_is_none() -> None:
    assert p.read_header(_request(MetadataRequest_v4(None, True), client=None)).client_id is None


def test_a_request_that_does_not_decode_is_a_protocol_error() -> None:
    data = _request(MetadataRequest_v4(["a"], True))[:-3]
    header = p.read_header(data)
    api = p.offered(header.api_key, header.api_version)
    assert api is not None
    with pytest.raises(p.ProtocolError, match="does not decode"):
        p.read_request(api, header, data)


@pytest.mark.parametrize("size", [0, -1, p.MAX_REQUEST_SIZE + 1])
def test_a_request_size_out_of_bounds_is_a_protocol_error(size: int) -> None:
    with pytest.raises(p.ProtocolError):
        p.frame_size(struct.pack(">i", size))


def test_a_short_header_is_a_protocol_error() -> None:
    with pytest.raises(p.ProtocolError):
        p.read_header(b"\x00\x03\x00")


def test_versions_outside_the_offer_are_not_offered() -> None:
    assert p.offered(p.PRODUCE, 2) is None  # before record batches v2
    assert p.offered(p.FETCH, 12) is None  # flexible
    assert p.offered(999, 0) is None
    for api in p.APIS.values():
        for version in range(api.low, api.high + 1):
            request, response = api.structs(version)
            assert not getattr(request, "FLEXIBLE_VERSION", False), (api.name, version)
            assert version == response.API_VERSION


def _body(frame: bytes, correlation: int) -> bytes:
    size, got = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and got == correlation
    return frame[8:]


def test_a_response_gets_the_fields_its_version_has() -> None:
    body = {"brokers": [{"node_id": 0, "host": "h", "port": 9, "rack": None}],
            "cluster_id": "c", "controller_id": 0,
            "topics": [{"error_code": 0, "topic": "t", "is_internal": False,
                        "partitions": [{"error_code": 0, "partition": 0, "leader": 0,
                                        "replicas": [0], "isr": [0]}]}]}
    api = p.APIS[p.METADATA]
    old = MetadataResponse_v0.decode(_body(p.encode_response(api, 0, 3, body), 3))
    assert old.brokers == [(0, "h", 9)]
    new = MetadataResponse_v5.decode(_body(p.encode_response(api, 5, 4, body), 4))
    assert new.throttle_time_ms == 0  # left out: zero
    assert new.topics[0][3][0] == (0, 0, 0, [0], [0], [])


def test_an_api_versions_of_another_version_is_answered_with_v0_and_the_offer() -> None:
    answer = p.unsupported(p.API_VERSIONS, 3, 11)
    assert answer is not None
    decoded = ApiVersionResponse_v0.decode(_body(answer, 11))
    assert decoded.error_code == p.UNSUPPORTED_VERSION
    assert (p.PRODUCE, 3, 8) in decoded.api_versions


def test_an_api_not_offered_is_answered_when_its_response_has_an_error_code() -> None:
    answer = p.unsupported(16, 0, 5)  # ListGroups v0: error_code first
    assert answer is not None and _body(answer, 5)[:2] == struct.pack(">h", 35)
    assert p.unsupported(999, 0, 5) is None  # unknown: the connection is closed instead
