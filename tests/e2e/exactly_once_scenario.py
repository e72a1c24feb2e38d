"""One of every command that changes state beside frames, each a group of its own, for the
kill-at-every-boundary test (tests/e2e/test_exactly_once.py).

Every group is one a client retries after a lost answer: idempotent producers (native and
stream appends, a close), stream create, fork create, TTL, delete, heartbeats, consumer
resets and deletes, a group of several commands over two topics, a segment roll, and a
stream written and deleted in one group. Run as
a script it opens a broker on ``argv[1]``, applies the groups from ``argv[2]`` on (arming
the fault points after the first) and exits without closing, as a crash would; ``serve``
does so once per line of its input, in forked children.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from messaging.broker.broker import ApplyResult, Broker
from messaging.broker.catalog import stream_command
from messaging.broker.commands import heartbeat_command
from messaging.broker.subscribers import DELETE, RESET, consumer_command
from messaging.errors import MessagingError, StreamNotFoundError
from messaging.frames import decode, encode_batch

NOW = 1_790_000_000.0
MAX_SEGMENT_SIZE = 4096


def _produce(topic: int, pid: str, seq: int, *datas: bytes) -> bytes:
    return stream_command({"op": "produce", "topic": topic, "producer": [pid, 0, seq],
                           "now": NOW}, encode_batch(topic, list(datas)))


def _stream(op: dict[str, Any], *datas: bytes) -> bytes:
    return stream_command({"now": NOW, **op}, encode_batch(0, list(datas)) if datas else b"")


def _append(name: str, seq: int, *datas: bytes, close: bool = False) -> bytes:
    op = {"op": "append", "name": name, "count": len(datas), "close": close,
          "producer": ["w", 0, seq]}
    if datas:
        op["content_type"] = "application/octet-stream"
    return _stream(op, *datas)


#: (name, the group's commands). The first is set-up, applied before the points are armed.
GROUPS: list[tuple[str, list[bytes]]] = [
    ("setup: native producer, seq 0", [_produce(1, "p", 0, b"a0")]),
    ("native producer publish", [_produce(1, "p", 1, b"a1", b"a2", b"a3")]),
    ("native producer publish creating a topic", [_produce(2, "q", 0, b"b0")]),
    ("stream create", [_stream({"op": "create", "name": "s",
                                "content_type": "application/octet-stream"})]),
    ("stream append with producer", [_append("s", 0, b"s0", b"s1")]),
    ("fork create", [_stream({"op": "create", "name": "f",
                              "content_type": "application/octet-stream",
                              "fork": {"source": "s", "at": [7, 0], "offset": None,
                                       "sub": 0}})]),
    ("fork append with producer", [_append("f", 0, b"f0")]),
    ("heartbeat", [heartbeat_command(1, 3, "reader")]),
    ("consumer reset", [consumer_command(RESET, 1, "reader", 2)]),
    ("stream close by producer", [_append("s", 1, b"s2", close=True)]),
    ("stream create with TTL and data", [_stream({"op": "create", "name": "t",
                                                  "content_type": "text/plain", "ttl": 60},
                                                 b"t0")]),
    ("stream delete", [_stream({"op": "delete", "name": "t"})]),
    ("consumer delete", [consumer_command(DELETE, None, "reader")]),
    ("two topics and a heartbeat in one group", [_produce(1, "p", 2, b"a4"),
                                                 _produce(2, "q", 1, b"b1"),
                                                 heartbeat_command(2, 1, "r2")]),
    ("segment roll", [_produce(1, "p", 3, b"x" * 3000, b"y" * 3000)]),
    ("stream create (written and deleted in the next group)", [
        _stream({"op": "create", "name": "u", "content_type": "application/octet-stream"})]),
    ("a stream written and deleted in one group, beside a producer", [
        _append("u", 0, b"u0"), _produce(2, "q", 2, b"b2"),
        _stream({"op": "delete", "name": "u"})]),
    ("plain batch across segment rolls", [
        encode_batch(1, [b"plain %d " % k + b"p" * 1200 for k in range(8)])]),
    ("plain batches to two topics", [encode_batch(1, [b"c0", b"c1"]), encode_batch(2, [b"d0"])]),
]


def plain(group: int) -> bool:
    """Whether a group holds plain publishes (no producer: a client cannot retry them
    blindly, so a test checks they are all there or all gone)."""
    return GROUPS[group][0].startswith("plain")


def present(broker: Broker, group: int) -> int:
    """How many of a plain group's messages the broker holds."""
    wanted = [m.data for command in GROUPS[group][1] for m in decode(command)[0]]
    held = 0
    for topic in broker.topics():
        with topic.reader(topic.first_index) as reader:
            held += sum(m.data in wanted for m in decode(reader.read_all(), after=0)[0])
    return held


def size(group: int) -> int:
    """How many messages a group publishes."""
    return sum(len(decode(command)[0]) for command in GROUPS[group][1])


def apply(broker: Broker, group: int) -> list[ApplyResult | MessagingError]:
    """Apply one group, as the log's writer does (durable)."""
    return broker.write_group(GROUPS[group][1], durable=True)


def retry(broker: Broker, group: int) -> list[ApplyResult | MessagingError]:
    """Apply a group again as a client that lost the answer would; raise on any error but
    the "already gone" of a repeated delete."""
    results = apply(broker, group)
    for result in results:
        if isinstance(result, MessagingError) and not isinstance(result, StreamNotFoundError):
            raise result
    return results


def open_broker(path: Path, lines_first: bool = False) -> Broker:
    """The broker the scenario runs on: journal lines after frames (a cluster node's way,
    and ``--fsync interval``'s) or ``lines_first`` (``--fsync always`` on one node)."""
    return Broker.open(path, max_segment_size=MAX_SEGMENT_SIZE, lines_first=lines_first)


def run(data: Path, first_group: int, lines_first: bool) -> None:
    """Apply the groups from ``first_group`` on (arming the fault points after the first
    group) and exit without closing, as a crash would (fault points installed already)."""
    from tests import faultpoint

    broker = open_broker(data, lines_first)
    for group in range(first_group, len(GROUPS)):
        if group == 1 and os.environ.get("FAULT_ARM"):
            Path(os.environ["FAULT_ARM"]).touch()
        faultpoint.mark(str(group))
        for result in retry(broker, group):
            assert isinstance(result, ApplyResult), result
    os._exit(0)  # no close: broker.json is not saved again, as after a crash


def serve() -> None:
    """Run the scenario once per line of standard input (``DATA<TAB>WORK<TAB>KILL<TAB>first|
    after``), each in a child forked from this process (its imports done once, not per run),
    with the fault points of that line; print each child's exit code (``-9``: killed), its
    standard error in ``WORK/stderr``."""
    from tests import faultpoint

    for line in sys.stdin:
        data, work, kill, way = line.rstrip("\n").split("\t")
        pid = os.fork()
        if pid == 0:
            err = os.open(os.path.join(work, "stderr"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.dup2(err, 2)
            os.environ.update(FAULT_ROOT=data, FAULT_ARM=os.path.join(work, "arm"),
                              FAULT_TRACE=os.path.join(work, "trace"), FAULT_KILL=kill)
            try:
                faultpoint.install()
                run(Path(data), 0, way == "first")
            except BaseException:
                import traceback
                traceback.print_exc()
                os._exit(1)
        _pid, status = os.waitpid(pid, 0)
        print(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status),
              flush=True)


def main() -> None:
    """``DATA FIRST_GROUP first|after``: one run (fault points from the environment);
    ``serve``: see :func:`serve`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
    if sys.argv[1:2] == ["serve"]:
        serve()
        return
    from tests import faultpoint

    faultpoint.install()
    run(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:4] == ["first"])


if __name__ == "__main__":
    main()
