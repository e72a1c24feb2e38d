"""Spark benchmark: one micro-batch of 1,000,000 × 100 B messages from the broker, beside an
in-memory synthetic Python data source producing the same rows in the same run."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness.client_load import preload
from bench.harness.figures import Row
from bench.harness.procs import broker, child_env
from bench.harness.results import command_line, report

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "1000000"))
RUNS = 3


def timed_query(spark, fmt: str, options: dict[str, str], checkpoint: Path) -> float:
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    started = time.perf_counter()
    query = (reader.load().writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == MESSAGES, f"{fmt}: {rows} rows"
    assert len(progress) == 1, "expected one micro-batch"
    return float(rows / elapsed)


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Spark's Python workers import bench.spark.synthetic_source (and messaging) by name.
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from bench.spark.synthetic_source import SyntheticDataSource
    from messaging.spark import MessagingDataSource

    with tempfile.TemporaryDirectory(prefix="bench-spark-", dir=os.environ.get("BENCH_DIR")) as t:
        tmp = Path(t)
        proc, url = broker(tmp / "data")
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(MessagingDataSource)
        spark.dataSource.register(SyntheticDataSource)
        try:
            asyncio.run(preload(url, 1, MESSAGES))
            ours, synthetic = [], []
            for run in range(RUNS):
                ours.append(timed_query(spark, "messaging", {
                    "url": url, "topics": "1", "partitionSize": "100000"}, tmp / f"m{run}"))
                synthetic.append(timed_query(spark, "synthetic_messages", {
                    "rows": str(MESSAGES), "partitionSize": "100000"}, tmp / f"s{run}"))
        finally:
            spark.stop()
            proc.stop()
    value, baseline = statistics.median(ours), statistics.median(synthetic)
    rows = [Row(f"micro-batch of {MESSAGES:,} × 100 B messages from the broker", value,
                "rows/s", "in-memory synthetic Python source, same rows", baseline,
                "≥ 70% of synthetic", value >= 0.7 * baseline)]
    report("spark", "Spark source", rows, command_line(), notes=(
        "local[2], one availableNow micro-batch into the `noop` sink, 10 input partitions of "
        "100,000 messages, timed from query start to termination, median of 3. Executors "
        "fetch frames with non-streaming GETs, verify every CRC and hand Spark Arrow batches."))


if __name__ == "__main__":
    main()
