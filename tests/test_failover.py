"""The failover policy, fed events: URL order, redirects, backoff and when to give up."""

from __future__ import annotations

import errno
import socket

import pytest

from messaging.errors import InvalidURLError
from messaging.failover import (
    MAX_REDIRECTS,
    Brokers,
    GroupMap,
    Retry,
    RetryPolicy,
    base_url,
    refused,
    topic_of,
)
from messaging.placement import group_of_name, group_of_topic

A, B, C = "http://a:1", "http://b:2", "http://c:3"


def test_base_url_keeps_scheme_host_and_port() -> None:
    assert base_url(" http://a:1/messaging/ping?x=1 ") == A
    assert base_url("https://[::1]:8086") == "https://[::1]:8086"
    for bad in ("ftp://a:1", "a:1", "http://", "http://a:0", "http://a:99999"):
        with pytest.raises(InvalidURLError, match="invalid broker URL"):
            base_url(bad)


def test_urls_are_normalised_and_unique() -> None:
    brokers = Brokers([A + "/", A, B])
    assert brokers.urls == [A, B]
    brokers.add([B, C + "/x"])
    assert brokers.urls == [A, B, C]


def test_order_rotates_past_a_failed_url() -> None:
    brokers = Brokers([A, B, C])
    assert brokers.order(write=False) == [A, B, C]
    brokers.failed(A)
    assert brokers.order(write=False) == [B, C, A]
    brokers.failed(C)
    assert brokers.order(write=True) == [A, B, C]
    brokers.failed("http://unknown:9")  # not one of ours: nothing moves
    assert brokers.order(write=False) == [A, B, C]
    brokers.replace([C, B])
    assert brokers.order(write=False) == [C, B]


def test_a_redirect_names_the_leader_tried_first_for_writes() -> None:
    brokers = Brokers([A, B])
    assert brokers.redirected(A, "http://c:3/messaging/messages?topicID=1", hops=0) == C
    assert brokers.leader == C and brokers.urls == [A, B, C]
    assert brokers.order(write=True) == [C, A, B]
    assert brokers.order(write=False) == [A, B, C]
    assert brokers.redirected(C, "//b:2/elsewhere", hops=1) == B  # relative to the broker
    assert brokers.order(write=True) == [B, A, C]
    brokers.failed(B)  # the leader failed: forget it
    assert brokers.leader is None
    assert brokers.order(write=True) == [C, A, B]


def test_redirects_are_bounded_and_must_name_a_broker() -> None:
    brokers = Brokers([A])
    assert brokers.redirected(A, B, hops=MAX_REDIRECTS - 1) == B
    assert brokers.redirected(B, A, hops=MAX_REDIRECTS) is None
    assert brokers.leader == B
    with pytest.raises(InvalidURLError):
        brokers.redirected(A, "ftp://b:2/", hops=0)


def test_the_leader_is_forgotten_when_it_has_none() -> None:
    brokers = Brokers([A, B])
    brokers.redirected(A, B, hops=0)
    brokers.forget_leader()
    assert brokers.order(write=True) == [A, B]


def test_backoff_doubles_up_to_the_cap_and_never_past_the_budget() -> None:
    retry = Retry(RetryPolicy(budget=10, start=0.1, factor=2, cap=0.5), started=0.0)
    delays = []
    for _ in range(5):
        assert retry.failed(1.0, refused_everywhere=False, reached=True)
        delays.append(retry.delay(1.0))
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    assert retry.failed(9.8, refused_everywhere=False, reached=True)
    assert retry.delay(9.8) == pytest.approx(0.2)  # what is left of the budget
    assert retry.delay(9.8, jitter=0.5) == pytest.approx(0.2)
    assert not retry.failed(10.0, refused_everywhere=False, reached=True)
    assert retry.exhausted(10.0)


def test_progress_resets_the_backoff() -> None:
    retry = Retry(RetryPolicy(start=0.1, cap=1.0))
    retry.failed(0.0, refused_everywhere=False, reached=True)
    retry.delay(0.0)
    retry.delay(0.0)
    retry.progressed()
    assert retry.delay(0.0) == pytest.approx(0.1)
    assert retry.delay(0.0, jitter=1.5) == pytest.approx(0.3)


def test_a_zero_budget_means_one_round() -> None:
    retry = Retry(RetryPolicy(budget=0), started=5.0)
    assert retry.exhausted(5.0)
    assert not retry.failed(5.0, refused_everywhere=False, reached=True)


def test_the_budget_runs_from_the_first_failure_of_each_outage() -> None:
    retry = Retry(RetryPolicy(budget=10))
    assert not retry.exhausted(100.0)  # nothing failed yet
    assert retry.failed(100.0, refused_everywhere=False, reached=True)
    assert retry.failed(109.0, refused_everywhere=False, reached=True)
    retry.succeeded()  # a broker answered: the outage is over
    assert retry.failed(115.0, refused_everywhere=False, reached=True)
    assert retry.failed(124.0, refused_everywhere=False, reached=True)
    assert not retry.failed(125.0, refused_everywhere=False, reached=True)


def test_give_up_fast_only_when_refused_everywhere_and_never_reached() -> None:
    policy = RetryPolicy(budget=1000, refused_rounds=4)
    retry = Retry(policy, started=0.0)
    assert [retry.failed(0.0, refused_everywhere=True, reached=False)
            for _ in range(4)] == [True, True, True, False]

    retry = Retry(policy, started=0.0)  # a round that was not all refusals starts over
    for _ in range(3):
        assert retry.failed(0.0, refused_everywhere=True, reached=False)
    assert retry.failed(0.0, refused_everywhere=False, reached=False)
    for _ in range(3):
        assert retry.failed(0.0, refused_everywhere=True, reached=False)
    assert not retry.failed(0.0, refused_everywhere=True, reached=False)

    retry = Retry(policy, started=0.0)  # a broker once answered: it is restarting
    assert all(retry.failed(0.0, refused_everywhere=True, reached=True) for _ in range(50))


def test_too_many_failures_give_up_whatever_the_budget() -> None:
    retry = Retry(RetryPolicy(budget=1e9, max_failures=3))
    assert [retry.failed(0.0, refused_everywhere=False, reached=True)
            for _ in range(4)] == [True, True, True, False]
    retry = Retry(RetryPolicy(budget=1e9, max_failures=3))
    for _ in range(3):
        retry.failed(0.0, refused_everywhere=False, reached=True)
    retry.progressed()
    assert retry.failed(0.0, refused_everywhere=False, reached=True)


@pytest.mark.parametrize(("err", "definitive"), [
    (ConnectionRefusedError(), True),
    (OSError(errno.ECONNREFUSED, "Connection refused"), True),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), True),
    (socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), False),
    (TimeoutError(), False),
    (ConnectionResetError(), False),
    (ValueError(), False),
])
def test_what_counts_as_refused(err: BaseException, definitive: bool) -> None:
    assert refused(err) is definitive


def test_a_topic_goes_to_its_groups_holders_first() -> None:
    answer = {"groups": [{"group": 0, "holders": ["http://b:2", "http://c:3"]},
                         {"group": 1, "holders": ["http://c:3", "http://a:1"]}]}
    groups = GroupMap.parse(answer)
    assert groups is not None and groups.groups == 2
    brokers = Brokers(["http://a:1"])
    brokers.groups = groups
    for topic in range(20):
        holders = groups.holders_of(topic)
        assert holders == answer["groups"][group_of_topic(topic, 2)]["holders"]
        assert brokers.order(write=True, topic=topic)[:2] == holders
    assert brokers.order(write=False) == ["http://a:1"]  # no topic: as before


@pytest.mark.parametrize("answer", [None, [], {"groups": []}, {"groups": [{"group": 0}]},
                                    {"groups": [{"group": "x", "holders": []}]},
                                    {"groups": [{"group": 0, "holders": ["ftp://a:1"]}]}])
def test_an_answer_that_is_no_map_of_groups(answer: object) -> None:
    assert GroupMap.parse(answer) is None


def test_a_stream_name_goes_to_the_holders_of_its_names_group() -> None:
    answer = {"groups": [{"group": g, "holders": [f"http://n{g}:1"]} for g in range(4)]}
    groups = GroupMap.parse(answer)
    assert groups is not None
    for name in ("orders", "chat/room", "7x"):
        assert groups.holders_of(name) == [f"http://n{group_of_name(name, 4)}:1"]
    assert topic_of({"topicID": "orders"}) == "orders"
    assert topic_of({"topicID": 7}) == 7 and topic_of({"topicID": str(1 << 63)}) == 1 << 63
    assert topic_of(None, "/messaging/topics/orders") == "orders"
    assert topic_of({"topicID": ""}) is None and topic_of({"topicID": "a\x01"}) is None
    assert topic_of({}, "/messaging/ping") is None
