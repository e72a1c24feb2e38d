"""The pure core of the state machine, in memory: stamping commands against a catalog.

A hypothesis model drives :func:`messaging.broker.commands.stamp` with native publishes,
idempotent producers (new, retried, from a fenced epoch), stream creates, appends and closes
and heartbeats, committing the catalog after each as the broker does, and checks the broker's
promises without a file: indexes are assigned ``previous + 1`` across all topics in command
order, a retried producer request stores nothing and answers the original range, frames land
in the topic their command names, and a stream's tail is its last stored index.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from messaging.broker.catalog import Catalog, stream_command
from messaging.broker.commands import Stamped, _stamp, heartbeat_command, stamp
from messaging.errors import MessagingError, ProducerFencedError
from messaging.frames import decode, encode_batch
from tests.examples import examples

NOW = 1_790_000_000.0
datas = st.lists(st.binary(max_size=8), min_size=1, max_size=4)


def messages_of(stamped: Stamped) -> list[tuple[int, int, bytes]]:
    """(topic, index, data) of every frame a command stages."""
    out = []
    for topic, run in stamped.runs:
        messages, _used = decode(bytes(run.frames), after=0)
        out += [(topic, m.index, m.data) for m in messages]
        assert all(m.topic == topic for m in messages)
    return out


class StampingModel(RuleBasedStateMachine):
    """The broker index, the stored messages and the producers, as a client would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.catalog = Catalog()
        self.index = 0
        self.stored: list[tuple[int, int, bytes]] = []  # (topic, index, data), apply order
        self.producers: dict[tuple[int, str], tuple[int, int, int, int]] = {}  # epoch, seq...
        self.streams: dict[str, tuple[int, bool]] = {}  # name -> (topic, closed)

    def apply(self, command: bytes) -> Stamped | MessagingError:
        mark = self.catalog.mark()
        try:
            stamped = stamp(command, self.index, self.catalog)
        except MessagingError as err:
            self.catalog.rollback(mark)
            return err
        self.catalog.commit()
        new = messages_of(stamped)
        assert [i for _t, i, _d in new] == list(range(self.index + 1, stamped.index + 1))
        assert stamped.first == (self.index + 1 if new else 0)
        self.index = stamped.index
        self.stored += new
        return stamped

    @rule(topic=st.integers(1, 3), payload=datas)
    def publish(self, topic: int, payload: list[bytes]) -> None:
        stamped = self.apply(encode_batch(topic, payload))
        assert isinstance(stamped, Stamped)
        assert {t for t, _run in stamped.runs} == {topic}

    @rule(topic=st.integers(1, 2), pid=st.sampled_from(["p", "q"]), payload=datas,
          retry=st.booleans())
    def produce(self, topic: int, pid: str, payload: list[bytes], retry: bool) -> None:
        known = self.producers.get((topic, pid))
        if retry and known is not None:
            epoch, seq, first, last = known
            stamped = self.apply(stream_command(
                {"op": "produce", "topic": topic, "producer": [pid, epoch, seq], "now": NOW},
                encode_batch(topic, payload)))
            assert isinstance(stamped, Stamped) and stamped.stream is not None
            assert stamped.stream.duplicate and not stamped.runs
            assert (stamped.stream.first, stamped.stream.last) == (first, last)
            return
        epoch, seq = (known[0], known[1] + 1) if known is not None else (0, 0)
        stamped = self.apply(stream_command(
            {"op": "produce", "topic": topic, "producer": [pid, epoch, seq], "now": NOW},
            encode_batch(topic, payload)))
        assert isinstance(stamped, Stamped) and stamped.stream is not None
        assert not stamped.stream.duplicate
        self.producers[(topic, pid)] = (epoch, seq, stamped.first, stamped.index)

    @precondition(lambda self: bool(self.producers))
    @rule(data=st.data())
    def fenced(self, data: st.DataObject) -> None:
        (topic, pid), (epoch, seq, _f, _l) = data.draw(st.sampled_from(sorted(
            self.producers.items())))
        if epoch == 0:
            self.producers[(topic, pid)] = (1, -1, 0, 0)  # the next produce starts epoch 1
            stamped = self.apply(stream_command(
                {"op": "produce", "topic": topic, "producer": [pid, 1, 0], "now": NOW},
                encode_batch(topic, [b"epoch 1"])))
            assert isinstance(stamped, Stamped)
            self.producers[(topic, pid)] = (1, 0, stamped.first, stamped.index)
            return
        before = self.index
        refused = self.apply(stream_command(
            {"op": "produce", "topic": topic, "producer": [pid, 0, seq + 1], "now": NOW},
            encode_batch(topic, [b"stale"])))
        assert isinstance(refused, ProducerFencedError)
        assert self.index == before

    @rule(name=st.sampled_from(["a", "b"]))
    def create(self, name: str) -> None:
        stamped = self.apply(stream_command({"op": "create", "name": name, "now": NOW,
                                             "content_type": "text/plain"}))
        if self.streams.get(name, (0, False))[1]:  # closed: an open one is another config
            assert isinstance(stamped, MessagingError) and stamped.status == 409
            return
        assert isinstance(stamped, Stamped) and stamped.stream is not None
        assert stamped.stream.created == (name not in self.streams)
        if name not in self.streams:
            stream = self.catalog.get(name)
            assert stream is not None
            self.streams[name] = (stream.topic, False)

    @precondition(lambda self: bool(self.streams))
    @rule(data=st.data(), payload=datas, close=st.booleans())
    def append(self, data: st.DataObject, payload: list[bytes], close: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.streams)))
        topic, closed = self.streams[name]
        op = {"op": "append", "name": name, "count": len(payload), "close": close,
              "content_type": "text/plain", "now": NOW}
        result = self.apply(stream_command(op, encode_batch(0, payload)))
        if closed:
            assert isinstance(result, MessagingError) and result.status == 409
            return
        assert isinstance(result, Stamped) and result.stream is not None
        assert {t for t, _run in result.runs} == {topic}
        assert result.stream.tail == (result.index, 0)
        self.streams[name] = (topic, close)

    @rule(topic=st.integers(1, 3), index=st.integers(0, 50), name=st.sampled_from(["r", "s"]))
    def heartbeat(self, topic: int, index: int, name: str) -> None:
        before = self.index
        stamped = self.apply(heartbeat_command(topic, index, name))
        assert isinstance(stamped, Stamped)
        assert not stamped.runs and self.index == before
        assert [(c.topic, c.index, c.name) for c in stamped.heartbeats] == [(topic, index, name)]

    @invariant()
    def indexes_count_every_stored_message(self) -> None:
        assert [i for _t, i, _d in self.stored] == list(range(1, self.index + 1))

    @invariant()
    def the_catalog_survives_its_own_json(self) -> None:
        copy = Catalog()
        copy.restore(json.loads(json.dumps(self.catalog.saved())))
        assert copy.saved() == self.catalog.saved()


TestStamping = StampingModel.TestCase
TestStamping.settings = settings(max_examples=examples(30), stateful_step_count=25, deadline=None)


# -- stamping a plain command with strided copies ------------------------------------------------


@settings(max_examples=examples(200), deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=40),
       same=st.booleans(), topic=st.integers(1, 5), other=st.integers(1, 5),
       index=st.integers(0, 2**40), kind=st.sampled_from([1, 2, 0x7FFF]))
def test_a_plain_command_stamps_as_the_per_frame_walk_does(
        sizes: list[int], same: bool, topic: int, other: int, index: int, kind: int) -> None:
    """Commands from the cluster's log arrive as plain bytes: those of uniform frames for one
    topic are stamped with strided copies, everything else frame by frame; both give the same
    indexes, runs and frames (the walk is the reference)."""
    datas = [b"d" * (sizes[0] if same else size) for size in sizes]
    body = encode_batch(topic, datas, kind)
    if other != topic and len(datas) > 1:  # the last frame for another topic: not uniform
        body = encode_batch(topic, datas[:-1], kind) + encode_batch(other, datas[-1:], kind)
    fast = stamp(body, index, Catalog())
    slow = _stamp(body, index, Catalog())
    assert (fast.first, fast.index) == (slow.first, slow.index)
    assert b"".join(bytes(r.frames) for _t, r in fast.runs) == b"".join(
        bytes(r.frames) for _t, r in slow.runs)
    assert [t for t, _r in fast.runs] == [t for t, _r in slow.runs]
    assert [m.index for m in decode(b"".join(bytes(r.frames) for _t, r in fast.runs))[0]] \
        == list(range(index + 1, index + 1 + len(datas)))
