"""Tiering benchmark: segments uploaded to an S3 store, and reads that come back from it.

All against SeaweedFS (``weed mini``) on 127.0.0.1, each figure beside a baseline from the
same run:

1. upload: a broker started with ``--object-store`` over a backlog of rolled segments
   uploads, verifies (reads back, SHA-256) and records them; MB/s from its metric
   ``messaging_object_store_uploaded_bytes`` sampled until all are recorded, against reading
   the same segment files into memory (page cache not dropped: what the uploader finds) and
   against reading them and hashing them with SHA-256 (the uploader's own CPU per byte);
2. cold catch-up: the topic whose local copies ``--local-retention-size`` deleted, read from
   index 0 by a freshly started broker (empty read cache) through a non-streaming ``Conn``
   and through Spark's batch source, against the same data read from local disk by a broker
   without an object store (a copy of the same data directory);
3. the read cache: the same store read again by the same broker (``--object-cache-size``
   larger than the topic) against the cold read.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client.parser import text_string_to_metric_families

from bench.harness import settings
from bench.harness.client_load import consume, preload
from bench.harness.figures import Row
from bench.harness.procs import Proc, broker, child_env
from bench.harness.results import add_to_json, command_line, report, results_under, source_state
from bench.harness.seaweedfs import BUCKET, SeaweedFS
from messaging.topic.segment import SEGMENT_SUFFIX

TOPIC = 1
SEGMENT_SIZE = "8M"
CACHE_SIZE = "1G"  # above the topic's size: a second read is all hits
#: Seconds any wait (uploads recorded, local copies deleted) may take before the run fails.
WAIT_LIMIT = 120.0
POLL = 0.05


@dataclass
class Case(settings.Settings):
    """Messages of 100 B in the topic; rounds of Conn reads (``rounds``) and Spark reads."""

    messages: int = 1_000_000
    spark_rounds: int = 2


FULL = Case(messages=1_000_000, rounds=3, spark_rounds=2)
QUICK = Case(messages=100_000, rounds=1, spark_rounds=1)


# -- brokers and their metrics ------------------------------------------------------------


def store_options(server: SeaweedFS) -> list[str]:
    return ["--max-segment-size", SEGMENT_SIZE, "--object-store", f"s3://{BUCKET}/bench",
            "--s3-endpoint", server.endpoint, "--local-retention-size", "1M",
            "--truncation-interval", "0.5s", "--object-cache-size", CACHE_SIZE]


def metrics(url: str) -> dict[str, float]:
    """The broker's counters and gauges by sample name (unlabelled ones summed)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name] = found.get(sample.name, 0.0) + float(sample.value)
    return found


def wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {WAIT_LIMIT:.0f} s waiting for {what}")
        time.sleep(POLL)


def segment_files(data: Path) -> list[Path]:
    return sorted((data / "topics" / str(TOPIC)).glob(f"*{SEGMENT_SUFFIX}"))


# -- 1. upload ----------------------------------------------------------------------------


def disk_rates(files: list[Path]) -> tuple[float, float]:
    """MB/s reading ``files`` into memory, and reading them plus SHA-256, best of 3 each."""
    total = sum(f.stat().st_size for f in files)
    best_read = best_hash = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for f in files:
            f.read_bytes()
        best_read = min(best_read, time.perf_counter() - started)
        started = time.perf_counter()
        for f in files:
            hashlib.sha256(f.read_bytes()).digest()
        best_hash = min(best_hash, time.perf_counter() - started)
    return total / best_read / 1e6, total / best_hash / 1e6


def measure_upload(data: Path, server: SeaweedFS, log: Path, rolled: int,
                   ) -> tuple[Proc, str, dict[str, Any]]:
    """Start the broker with the object store over its backlog; time until all ``rolled``
    segments are recorded, sampling the uploaded bytes. The broker stays running."""
    env = child_env() | server.broker_env()
    started = time.perf_counter()
    proc, url = broker(data, *store_options(server), log=log, env=env)
    ready = time.perf_counter()
    samples: list[tuple[float, float]] = []

    def all_recorded() -> bool:
        m = metrics(url)
        samples.append((time.perf_counter() - ready,
                        m.get("messaging_object_store_uploaded_bytes_total", 0.0)))
        return m.get("messaging_object_store_uploaded_segments_total", 0.0) >= rolled

    wait_for(f"{rolled} segments uploaded", all_recorded)
    seconds, uploaded = samples[-1]
    first = next(t for t, b in samples if b > 0)
    # The rate between the first and the last recorded segment: each counts only once recorded,
    # so (last - first) spans all but the first segment's upload.
    per_segment = uploaded / rolled
    steady = (uploaded - per_segment) / (seconds - first) / 1e6 if seconds > first else 0.0
    return proc, url, {"bytes": uploaded, "segments": rolled, "seconds": seconds,
                       "start_seconds": ready - started, "first_recorded_at": first,
                       "mb_per_s": uploaded / seconds / 1e6, "steady_mb_per_s": steady,
                       "samples": samples}


# -- 2 and 3. reads -----------------------------------------------------------------------


def conn_rate(url: str, count: int) -> float:
    return asyncio.run(consume(url, TOPIC, count, batches=True)).value


def spark_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from messaging.spark import MessagingDataSource

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MessagingDataSource)
    return spark


def spark_rate(spark: Any, url: str, count: int) -> float:
    """Rows/s of a batch read of the whole topic (``count()``: every row is read)."""
    started = time.perf_counter()
    rows = (spark.read.format("messaging").option("url", url).option("topics", str(TOPIC))
            .option("partitionSize", "100000").load().count())
    elapsed = time.perf_counter() - started
    if rows != count:
        raise RuntimeError(f"Spark read {rows} rows, not {count}")
    return float(rows / elapsed)


class Restartable:
    """A broker restarted before every round, so each round's reads start in a fresh
    process (for the store broker: an empty read cache)."""

    def __init__(self, data: Path, args: list[str], log: Path, env: dict[str, str],
                 proc: Proc | None = None, url: str = "") -> None:
        self.data, self.args, self.log, self.env = data, args, log, env
        self.proc, self.url = proc, url

    def restart(self) -> None:
        self.stop()
        self.proc, self.url = broker(self.data, *self.args, log=self.log, env=self.env)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def cache_counts(self) -> tuple[float, float, float]:
        """Cache hits, misses, bytes fetched from the store so far."""
        m = metrics(self.url)
        return (m.get("messaging_object_cache_hits_total", 0.0),
                m.get("messaging_object_cache_misses_total", 0.0),
                m.get("messaging_object_store_read_bytes_total", 0.0))


def measure_reads(store: Restartable, local: Restartable, count: int, rounds: int,
                  read: Callable[[str, int], float]) -> dict[str, Any]:
    """Per round: restart both brokers, a cold read from the store, a warm one (the same
    broker again), a read from local disk."""
    cold: list[float] = []
    warm: list[float] = []
    from_disk: list[float] = []
    counts: list[dict[str, float]] = []
    for _ in range(rounds):
        store.restart()
        local.restart()
        before = store.cache_counts()
        cold.append(read(store.url, count))
        after_cold = store.cache_counts()
        warm.append(read(store.url, count))
        after_warm = store.cache_counts()
        from_disk.append(read(local.url, count))
        counts.append({
            "cold_hits": after_cold[0] - before[0], "cold_misses": after_cold[1] - before[1],
            "cold_fetched_bytes": after_cold[2] - before[2],
            "warm_hits": after_warm[0] - after_cold[0],
            "warm_misses": after_warm[1] - after_cold[1],
            "warm_fetched_bytes": after_warm[2] - after_cold[2]})
        print(f"  cold {cold[-1]:,.0f}, warm {warm[-1]:,.0f}, local {from_disk[-1]:,.0f} "
              f"msg/s; cache {counts[-1]}", flush=True)
    return {"cold": cold, "warm": warm, "local": from_disk, "cache": counts}


# -- the run ------------------------------------------------------------------------------


def run(case: Case, tmp: Path) -> tuple[list[Row], dict[str, Any]]:
    server = SeaweedFS(tmp / "seaweedfs").start()
    procs: list[Proc] = []
    brokers: list[Restartable] = []
    try:
        data, local_data = tmp / "store-broker", tmp / "local-broker"
        print(f"preloading {case.messages:,} × 100 B messages", flush=True)
        proc, url = broker(data, "--max-segment-size", SEGMENT_SIZE)
        try:
            asyncio.run(preload(url, TOPIC, case.messages))
        finally:
            proc.stop()
        shutil.copytree(data, local_data)
        files = segment_files(data)[:-1]  # the last is the active one: never uploaded
        read_mb, hash_mb = disk_rates(files)
        total = sum(f.stat().st_size for f in files)
        print(f"{len(files)} rolled segments, {total / 1e6:.0f} MB: disk read {read_mb:,.0f} "
              f"MB/s, read + SHA-256 {hash_mb:,.0f} MB/s", flush=True)

        proc, url, upload = measure_upload(data, server, tmp / "store-broker.log", len(files))
        procs.append(proc)
        print(f"uploaded {upload['bytes'] / 1e6:.0f} MB in {upload['seconds']:.2f} s: "
              f"{upload['mb_per_s']:.1f} MB/s (steady {upload['steady_mb_per_s']:.1f})",
              flush=True)
        wait_for("local copies deleted", lambda: len(segment_files(data)) <= 1)
        procs.remove(proc)
        store = Restartable(data, store_options(server), tmp / "store-broker.log",
                            child_env() | server.broker_env(), proc, url)
        local = Restartable(local_data, ["--max-segment-size", SEGMENT_SIZE],
                            tmp / "local-broker.log", child_env())
        brokers = [store, local]

        print(f"Conn reads from index 0, {case.rounds} rounds", flush=True)
        conn = measure_reads(store, local, case.messages, case.rounds, conn_rate)
        print(f"Spark batch reads, {case.spark_rounds} rounds (after one untimed read)",
              flush=True)
        spark = spark_session()
        try:
            spark_rate(spark, local.url, case.messages)  # Spark's first job starts its workers
            sparks = measure_reads(store, local, case.messages, case.spark_rounds,
                                   lambda u, n: spark_rate(spark, u, n))
        finally:
            spark.stop()
    finally:
        for b in brokers:
            b.stop()
        for p in procs:
            p.stop()
        server.stop()

    med = statistics.median
    n = f"{case.messages:,} × 100 B"
    rows = [
        Row(f"upload of a {total / 1e6:.0f} MB backlog ({len(files)} segments of "
            f"{SEGMENT_SIZE}B): uploaded, verified, recorded", upload["mb_per_s"], "MB/s",
            "reading the same files into memory", read_mb),
        Row("upload (the same figure)", upload["mb_per_s"], "MB/s",
            "reading the same files + SHA-256", hash_mb),
        Row(f"cold catch-up from the store, Conn, {n}", med(conn["cold"]), "msg/s",
            "same read from local disk", med(conn["local"])),
        Row(f"warm catch-up from the store (read cache), Conn, {n}", med(conn["warm"]), "msg/s",
            "cold read from the store", med(conn["cold"])),
        Row("warm catch-up from the store (read cache), Conn", med(conn["warm"]), "msg/s",
            "same read from local disk", med(conn["local"])),
        Row(f"cold catch-up from the store, Spark batch count(), {n}", med(sparks["cold"]),
            "rows/s", "same read from local disk", med(sparks["local"])),
        Row(f"warm catch-up from the store (read cache), Spark, {n}", med(sparks["warm"]),
            "rows/s", "cold read from the store", med(sparks["cold"])),
        Row("warm catch-up from the store (read cache), Spark", med(sparks["warm"]), "rows/s",
            "same read from local disk", med(sparks["local"])),
    ]
    return rows, {"upload": upload, "conn": conn, "spark": sparks,
                  "disk_read_mb_per_s": read_mb, "disk_read_sha256_mb_per_s": hash_mb}


def main() -> None:
    p = settings.parser(__doc__ or "", "100,000 messages, one round")
    args = p.parse_args()
    case = settings.with_rounds(QUICK if args.quick else FULL, args)
    results_under(args.out, quick=args.quick, bench="tiering")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-tiering-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        rows, record = run(case, Path(t))
    elapsed = time.perf_counter() - started
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    upload = record["upload"]
    notes = (
        f"Run finished {when}, {elapsed:.0f} s in all; {source_state()}. SeaweedFS `weed "
        "mini` (master, volume, filer and S3 gateway in one process) on 127.0.0.1 of the same "
        "machine, so the store's own disk and CPU share the machine with the broker, the "
        "client and Spark. Upload: the topic was filled by a broker without an object store, "
        f"which was then restarted with `--object-store` (`--max-segment-size {SEGMENT_SIZE}`,"
        " `--local-retention-size 1M`, `--truncation-interval 0.5s`); the figure is the "
        "metric's bytes divided by the time from the broker's start to the last segment "
        f"recorded ({upload['seconds']:.2f} s; the offload pass runs once a second, each "
        "topic's segments one after another, each fsynced, hashed, PUT, read back and "
        "recorded through the log before the next); between the first and last segment "
        f"recorded it ran at {upload['steady_mb_per_s']:.1f} MB/s. The disk baselines read "
        "the same files with the page cache as the uploader finds it (just written, not "
        "dropped): memory-speed reads, so they bound what the store path could reach, not "
        "what a cold disk gives. Reads: a non-streaming `Conn` from index 0 in batches, and "
        "`spark.read.format(\"messaging\")...count()` (local[2], partitionSize 100,000, after "
        "one untimed read that starts Spark's workers). Each round restarts both brokers; "
        "cold = the store broker's first read (empty read cache; SeaweedFS's own files may "
        f"be in the page cache), warm = the same broker read again (`--object-cache-size "
        f"{CACHE_SIZE}`), local = a broker without an object store on a copy of the data "
        "directory taken before the upload, its first read after the restart (its files in "
        "the page cache). Medians of "
        f"{case.rounds} Conn and {case.spark_rounds} Spark rounds; cache hits and misses of "
        "each round in the JSON. A Spark partition starts mid-segment, and the store reader "
        "begins each object at its first byte and skips the frames below the partition's "
        "first index (messaging/tiered/reader.py), so Spark's store reads fetch and verify "
        "more chunks than the Conn read, warm ones too.")
    report("tiering", "Tiering", rows, command_line(), notes=notes)
    add_to_json("tiering", record)


if __name__ == "__main__":
    main()
