"""What a commit mark costs a single publish, before and after lines first
(``make bench-commit-marks``).

Two brokers run at once, ``--fsync always``, on 127.0.0.1 with their own data: this checkout
("after") and a git worktree of ``--before`` (default a10359e, where every group wrote its
journal line after its frames and fsynced both: two fdatasyncs for one message). Rounds
alternate the sides; each round sends ``--count`` single 100 B publishes, one at a time over
one keep-alive connection (a minimal HTTP/1.1 client, so the figure is the broker's), and
times each from the request sent to the answer read. Figures: medians over the rounds of each
round's p50 and p99, and of the broker's CPU per publish.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.harness.ab_brokers import ab_brokers, round_order
from bench.harness.figures import Row, percentile
from bench.harness.results import add_to_json, command_line, report
from bench.harness.sampling import cpu_seconds

BEFORE = "a10359e"
TOPIC = 1


def publish_one_at_a_time(url: str, count: int) -> list[float]:
    """Seconds per publish, ``count`` single 100 B publishes in a row on one connection."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = os.urandom(100)
    request = (f"POST /messaging/messages?topicID={TOPIC} HTTP/1.1\r\nHost: {host}\r\n"
               f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
               "\r\n").encode() + body
    times: list[float] = []
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            started = time.perf_counter()
            conn.sendall(request)
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = conn.recv(65536)
                if not chunk:
                    raise RuntimeError("the broker closed the connection")
                answer += chunk
            head, _, rest = answer.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"publish: {head[:80]!r}")
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            while len(rest) < length:
                rest += conn.recv(65536)
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--before", default=BEFORE, help="the commit to compare with")
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="bench-commit-marks-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        with ab_brokers(args.before, tmp) as (codes, procs):
            for _proc, url in procs.values():
                publish_one_at_a_time(url, 100)  # warm-up: the topic exists
            for k in range(args.rounds):
                for arm in round_order(k):
                    proc, url = procs[arm]
                    cpu = cpu_seconds(proc.pid)
                    times = publish_one_at_a_time(url, args.count)
                    used = cpu_seconds(proc.pid) - cpu
                    side = figures[arm]
                    side.setdefault("p50", []).append(percentile(times, 50) * 1e3)
                    side.setdefault("p99", []).append(percentile(times, 99) * 1e3)
                    side.setdefault("cpu", []).append(used * 1e6 / args.count)
                    print(f"  round {k + 1} {arm:6} p50 {side['p50'][-1]:.3f} ms, p99 "
                          f"{side['p99'][-1]:.3f} ms, broker CPU {side['cpu'][-1]:.0f} "
                          "µs/publish", flush=True)

    def median(arm: str, key: str) -> float:
        return statistics.median(figures[arm][key])

    before = f"the code of {codes['before'].rev}: line after frames, two fdatasyncs"
    rows = [Row("single publish, one at a time: answer p50", median("after", "p50"), "ms",
                before, median("before", "p50")),
            Row("single publish, one at a time: answer p99", median("after", "p99"), "ms",
                before, median("before", "p99")),
            Row("broker CPU per single publish", median("after", "cpu"), "µs", before,
                median("before", "cpu"))]
    notes = (f"After: {codes['after'].rev}; before: {codes['before'].rev} (a git worktree, its "
             f"own broker). {args.rounds} rounds alternating the sides, each {args.count} "
             "single 100 B publishes one at a time over one keep-alive connection; medians "
             "of the rounds. Under `--fsync always` on one node a group of single-message "
             "publishes now writes no journal line (a message is whole or cut by its "
             "checksum), so it pays one fdatasync instead of two; a group that needs a line "
             "(a batch, producer headers, a stream operation) fsyncs it before writing its "
             "frames.")
    report("commit-marks", "A single publish's commit mark: before and after lines first",
           rows, command_line(), notes)
    add_to_json("commit-marks", {"rounds": figures})


if __name__ == "__main__":
    main()
