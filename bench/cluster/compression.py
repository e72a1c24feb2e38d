"""How much zstd saves on the etcd log entry, and what it costs, for realistic payloads.

etcd's bandwidth is the ceiling of the whole cluster, so the entry (one put of the log key)
is compressed when that pays (:func:`messaging.log.etcd.entry.encode_entry`). This measures
the entries a cluster actually writes: one single publish, and a put of 1,000 messages, for
JSON events like the Spark example's, the benchmarks' 100-byte payload, and random bytes; each
at zstd levels 1 and 3, with the time to compress and decompress it. Run by
``make bench-cluster`` before the cluster starts; alone: ``python bench/cluster/compression.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness.figures import Row
from bench.harness.results import command_line, report
from examples.generate_events import make_events
from messaging.frames import encode_batch
from messaging.log.etcd.entry import COMPRESS_LEVEL, encode_entry

NODE = b"bench-01"


def _payloads() -> dict[str, Callable[[int], list[bytes]]]:
    events = [json.dumps(e).encode() for e in make_events(1000, 60)]
    return {
        "JSON events (Spark example)": lambda n: events[:n],
        "100 B benchmark payload": lambda n: [b"x" * 100] * n,
        "100 B random": lambda n: [os.urandom(100) for _ in range(n)],
        "4 KiB random": lambda n: [os.urandom(4096) for _ in range(max(1, n // 10))],
    }


def _timed(work: Callable[[], object], rounds: int = 20) -> float:
    """Median seconds of ``work``."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def measure() -> list[Row]:
    """Every payload × (one publish, a put of 1,000) × level: compressed bytes beside plain."""
    rows = []
    for name, make in _payloads().items():
        for count, shape in ((1, "one publish"), (1000, "put of 1,000 publishes")):
            commands = [encode_batch(1, [message]) for message in make(count)]
            plain = encode_entry(NODE, 1, commands, compress=False)
            used = encode_entry(NODE, 1, commands)
            body = plain[24:]
            for level in (1, 3):
                compressor = zstandard.ZstdCompressor(level=level)
                packed = compressor.compress(body)
                seconds = _timed(lambda: compressor.compress(body))  # noqa: B023
                unpack = _timed(lambda: zstandard.ZstdDecompressor().decompress(packed))  # noqa: B023
                rows.append(Row(
                    f"{name}, {shape}: zstd {level} ({seconds * 1e6:,.0f} µs to compress, "
                    f"{unpack * 1e6:,.0f} µs to decompress"
                    + ("; the broker sends it " + ("compressed" if used[:4] == b"MSZ1"
                                                   else "plain") if level == COMPRESS_LEVEL
                       else "") + ")",
                    len(packed) + 24, "B", "plain entry", len(plain)))
    return rows


def main() -> None:
    rows = measure()
    report("cluster_compression", "zstd on the etcd log entry (compressed / plain bytes)", rows,
           command_line(),
           notes="The ratio is the compressed entry's share of the plain one. The broker "
                 "compresses an entry's body when it is at least 512 bytes and zstd level 1 "
                 "brings it to 90 % or less; decompressed it is byte for byte the plain body "
                 "(frames and CRCs untouched).")


if __name__ == "__main__":
    main()
