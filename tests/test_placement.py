"""Placement: which group a topic is in, and which nodes hold each group."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messaging.placement import (
    MAX_GROUPS,
    NAMED_TOPIC_BASE,
    check_groups,
    first_named_topic,
    group_of_name,
    group_of_topic,
    holders,
    log_name,
)
from tests.examples import examples

groups_ = st.integers(1, 64)
urls = st.lists(st.integers(1, 60000).map(lambda p: f"http://10.0.0.1:{p}"), min_size=1,
                max_size=12, unique=True)


@settings(max_examples=examples(200), deadline=None)
@given(groups_, st.integers(0, NAMED_TOPIC_BASE - 1))
def test_a_native_topic_is_in_one_stable_group(groups: int, topic: int) -> None:
    group = group_of_topic(topic, groups)
    assert 0 <= group < groups
    assert group_of_topic(topic, groups) == group


@settings(max_examples=examples(200), deadline=None)
@given(groups_, st.data())
def test_a_named_streams_id_names_the_group_of_its_name(groups: int, data: st.DataObject) -> None:
    name = data.draw(st.text(min_size=1, max_size=40))
    group = group_of_name(name, groups)
    assert 0 <= group < groups
    nth = data.draw(st.integers(0, (1 << 40)))
    assert group_of_topic(first_named_topic(group) + nth, groups) == group


def test_one_group_is_the_cluster_of_before() -> None:
    assert first_named_topic(0) == NAMED_TOPIC_BASE
    assert group_of_topic(12345, 1) == group_of_name("orders", 1) == 0
    assert log_name("prod", 0, 1) == "prod"
    assert log_name("prod", 3, 8) == "prod~g3"
    assert holders(0, ["b", "a", "c"], 1) in (["a"], ["b"], ["c"])
    assert holders(0, ["b", "a", "c"], 5) == holders(0, ["a", "b", "c"], 5)


def test_native_topics_spread_over_the_groups() -> None:
    counts = [0] * 8
    for topic in range(8000):
        counts[group_of_topic(topic, 8)] += 1
    assert min(counts) > 800  # 1,000 each on average


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 32), urls, st.integers(1, 5))
def test_every_group_has_r_holders_and_every_node_about_its_share(
        groups: int, nodes: list[str], replicas: int) -> None:
    count = min(replicas, len(nodes))
    chosen = [holders(g, nodes, replicas, groups) for g in range(groups)]
    assert all(len(h) == count and len(set(h)) == count for h in chosen)
    assert chosen == [holders(g, list(reversed(nodes)), replicas, groups)
                      for g in range(groups)]  # the same in any order
    loads = Counter(u for h in chosen for u in h)
    share = -(-groups * count // len(nodes))
    assert max(loads.values()) <= share + count  # past the bound only when too few are under


def test_four_nodes_eight_groups_two_replicas_hold_four_each() -> None:
    nodes = [f"http://10.0.0.{i}:8086" for i in range(1, 5)]
    loads = Counter(u for g in range(8) for u in holders(g, nodes, 2, 8))
    assert sorted(loads.values()) == [4, 4, 4, 4]


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 32), urls, st.integers(1, 4), st.data())
def test_a_node_leaving_never_keeps_a_group(groups: int, nodes: list[str], replicas: int,
                                          data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(nodes))
    rest = [n for n in nodes if n != gone]
    assert all(gone not in holders(g, rest, replicas, groups) for g in range(groups))


def test_the_number_of_groups_is_bounded() -> None:
    assert check_groups(1) == 1 and check_groups(MAX_GROUPS) == MAX_GROUPS
    for wrong in (0, MAX_GROUPS + 1):
        with pytest.raises(ValueError, match="the number of groups must be from 1 to"):
            check_groups(wrong)
