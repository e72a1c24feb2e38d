"""How the etcd client words failures: a refused authentication says so, and what to do."""

from __future__ import annotations

import grpc
from grpc.aio import AioRpcError, Metadata

from messaging.log.etcd.client import describe, never_sent, refusal, unavailable


def rpc_error(code: grpc.StatusCode, details: str) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details)


def test_refused_credentials_are_named_with_the_fix() -> None:
    empty = rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")
    assert refusal(empty) == ("etcd refused authentication (user name is empty): start with "
                              "--etcd-user USER (its password in $MESSAGING_ETCD_PASSWORD)")
    wrong = rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                      "etcdserver: authentication failed, invalid user ID or password")
    assert (refusal(wrong) or "").startswith(
        "etcd refused authentication (authentication failed, invalid user ID or password): "
        "check --etcd-user")
    denied = rpc_error(grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
    assert (refusal(denied) or "").startswith("etcd refused access (permission denied)")
    # A watch cancelled by etcd carries the same words in its reason.
    cancelled = ConnectionError("rpc error: code = InvalidArgument desc = etcdserver: user "
                                "name is empty")
    assert describe(cancelled) == refusal(empty)
    # Nothing is stored for a refused caller: a put may go to the next endpoint.
    assert all(never_sent(err) for err in (empty, wrong, denied))
    other = rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided")
    assert refusal(other) is None and not never_sent(other)
    assert describe(other) == "INVALID_ARGUMENT: etcdserver: key is not provided"


def test_a_refusal_comes_before_the_other_reasons() -> None:
    down = rpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    empty = rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")
    message = str(unavailable("etcd has no quorum", [("https://a:2379", down),
                                                     ("https://b:2379", empty)]))
    assert message.startswith("etcd refused authentication (user name is empty): start with "
                              "--etcd-user USER")
    assert "(etcd at https://b:2379)" in message
    assert message.endswith("https://a:2379: UNAVAILABLE: failed to connect to all addresses")
    assert str(unavailable("etcd has no quorum", [("https://a:2379", down)])) == (
        "etcd has no quorum: https://a:2379: UNAVAILABLE: failed to connect to all addresses")
