"""Which brokers a Kafka client is told about, and which node coordinates a group: the same
answer from every node of a cluster."""

from __future__ import annotations

from messaging.kafka.nodes import Nodes, broker_id

ADDRESSES = ["10.0.0.1:9092", "10.0.0.2:9092", "10.0.0.3:9092"]


def _node(i: int, live: list[str] = ADDRESSES) -> Nodes:
    host, port = ADDRESSES[i].split(":")
    return Nodes(host, int(port), lambda: [a for a in live if a != ADDRESSES[i]])


def test_every_node_names_the_same_coordinator_and_itself_first() -> None:
    nodes = [_node(i) for i in range(3)]
    for group in ("orders", "billing", "x" * 200, "ü"):
        coordinators = {n.coordinator(group) for n in nodes}
        assert len(coordinators) == 1
        assert sum(n.coordinates(group) for n in nodes) == 1
    for i, node in enumerate(nodes):
        brokers = node.brokers()
        assert brokers[0] == (broker_id(ADDRESSES[i]), *ADDRESSES[i].split(":")[:1],
                              9092)
        assert sorted(b[0] for b in brokers) == sorted(map(broker_id, ADDRESSES))


def test_a_single_node_coordinates_everything() -> None:
    node = Nodes("127.0.0.1", 9092)
    assert node.coordinates("any") and node.brokers() == [node.this]
    assert 0 <= node.this[0] < 2**31


def test_after_a_node_leaves_every_group_has_a_live_coordinator() -> None:
    after = [_node(i, ADDRESSES[:2]) for i in range(2)]
    for group in map(str, range(300)):
        assert after[0].coordinator(group) == after[1].coordinator(group)
        assert after[0].coordinator(group)[0] in set(map(broker_id, ADDRESSES[:2]))
