"""An example Spark pipeline over messaging topics.

Reads JSON events (``{"key", "value", "ts"}``) from a topic, counts and sums them per key and
per minute, and writes the result both to Parquet and, as JSON, to another topic:

    .venv/bin/python examples/generate_events.py --url http://127.0.0.1:8086 --topic 1
    .venv/bin/python examples/spark_pipeline.py --url http://127.0.0.1:8086 --source 1 --target 2 \\
        --parquet ./out/aggregates --checkpoint ./out/checkpoint --available-now

Without ``--available-now`` it keeps running, one micro-batch every ``--interval``. It needs
the ``spark`` extra (``make spark`` adds it to .venv) and Java 17.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.query import StreamingQuery
except ModuleNotFoundError as err:  # make run's core install has no Spark
    raise SystemExit(f"{err}: this example needs the spark extra; make spark adds it to .venv "
                     "(pyspark, pyarrow, numpy: about 735 MB)") from err

from messaging.spark import MessagingDataSource

EVENT_SCHEMA = "key string, value double, ts timestamp"


def aggregates(spark: SparkSession, url: str, source: int) -> DataFrame:
    """The streaming aggregate: events and total value per key per minute."""
    events = (spark.readStream.format("messaging").option("url", url)
              .option("topics", str(source)).option("startingIndex", "earliest").load()
              .select(F.from_json(F.col("data").cast("string"), EVENT_SCHEMA).alias("e"))
              .select("e.*").where(F.col("key").isNotNull()))
    return (events.groupBy(F.window("ts", "1 minute").alias("minute"), "key")
            .agg(F.count("*").alias("events"), F.round(F.sum("value"), 2).alias("total")))


def start(spark: SparkSession, url: str, source: int, target: int, parquet: str,
          checkpoint: str, available_now: bool = False,
          interval: str = "10 seconds") -> StreamingQuery:
    """Start the pipeline; every micro-batch rewrites the Parquet table and publishes rows."""

    def write(batch: DataFrame, batch_id: int) -> None:
        table = batch.select(F.col("minute.start").alias("minute"), "key", "events", "total")
        table.write.mode("overwrite").parquet(parquet)
        (table.select(F.lit(target).cast("long").alias("topic"),
                      F.to_json(F.struct("minute", "key", "events", "total"))
                      .cast("binary").alias("data"))
         .write.format("messaging").option("url", url).mode("append").save())

    writer = (aggregates(spark, url, source).writeStream.outputMode("complete")
              .foreachBatch(write).option("checkpointLocation", checkpoint))
    trigger = {"availableNow": True} if available_now else {"processingTime": interval}
    return writer.trigger(**trigger).start()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8086")
    parser.add_argument("--source", type=int, default=1, help="topic of JSON events")
    parser.add_argument("--target", type=int, default=2, help="topic for the aggregates")
    parser.add_argument("--parquet", default="./out/aggregates")
    parser.add_argument("--checkpoint", default="./out/checkpoint")
    parser.add_argument("--available-now", action="store_true",
                        help="process what is there, then stop")
    parser.add_argument("--interval", default="10 seconds")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.appName("messaging-pipeline").master("local[2]")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.dataSource.register(MessagingDataSource)
    query = start(spark, args.url, args.source, args.target, args.parquet, args.checkpoint,
                  args.available_now, args.interval)
    query.awaitTermination()
    spark.read.parquet(args.parquet).orderBy("minute", "key").show(50, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
