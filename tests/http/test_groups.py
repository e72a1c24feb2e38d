"""How a node of a cluster of topic groups finds the group a request names
(messaging.http.groups.GroupRouter.group_of): a topic id by the id, a stream's name, in
topicID or in the path, by the name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from messaging.config import BrokerConfig
from messaging.http.app import STREAM_NAME, TOPIC_PARAM
from messaging.http.executors import Executors
from messaging.http.groups import GroupRouter
from messaging.http.limits import Limits
from messaging.placement import first_named_topic, group_of_name, group_of_topic


@dataclass
class FakeNode:
    """The part of a GroupNode that finding a group reads."""

    groups: int
    on_stopped: list[Any] = field(default_factory=list)


@pytest.fixture
def router() -> GroupRouter:
    return GroupRouter(FakeNode(8), BrokerConfig(), Executors(), Limits())  # type: ignore[arg-type]


def test_a_name_in_topic_id_routes_to_the_group_of_the_name(router: GroupRouter) -> None:
    names = ["orders", "chat/room", "-1", "x y"]
    assert len({group_of_name(n, 8) for n in names}) > 1  # the names do spread
    for name in names:
        request = make_mocked_request("GET", "/messaging/messages", match_info={})
        request = request.clone(rel_url=request.rel_url.with_query(topicID=name))
        assert router.group_of(request, TOPIC_PARAM) == group_of_name(name, 8), name


def test_ids_route_by_the_id_and_nonsense_by_nothing(router: GroupRouter) -> None:
    for topic in (7, first_named_topic(5) + 3):
        request = make_mocked_request("GET", f"/messaging/messages?topicID={topic}")
        assert router.group_of(request, TOPIC_PARAM) == group_of_topic(topic, 8)
    assert group_of_topic(first_named_topic(5) + 3, 8) == 5
    for text in ("", str(2**64), "bad%01name"):
        request = make_mocked_request("GET", f"/messaging/messages?topicID={text}")
        assert router.group_of(request, TOPIC_PARAM) is None, text
    stream = make_mocked_request("GET", "/v1/stream/orders", match_info={"name": "orders"})
    assert router.group_of(stream, STREAM_NAME) == group_of_name("orders", 8)
