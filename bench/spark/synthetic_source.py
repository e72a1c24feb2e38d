"""The Spark benchmark's baseline: an in-memory Python data source producing the same rows.

Same schema, same partitioning, same Arrow batches as the messaging source — but built in
memory, with no broker, no HTTP and no CRC checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from messaging.spark.arrow import ARROW_BATCH_ROWS, SCHEMA


@dataclass(frozen=True)
class Range(InputPartition):
    start: int
    end: int
    size: int


def batch(start: int, end: int, size: int) -> pa.RecordBatch:
    n = end - start
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
    data = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(b"x" * (n * size))])
    return pa.RecordBatch.from_arrays(
        [pa.array(np.ones(n, dtype=np.int64)), pa.array(np.arange(start, end, dtype=np.int64)),
         pa.array(np.ones(n, dtype=np.int32)), data],
        names=["topic", "index", "type", "data"])


class SyntheticReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options.get("rows", "1000000"))
        self.partition_rows = int(options.get("partitionsize", "100000"))
        self.size = int(options.get("size", "100"))

    def initialOffset(self) -> dict[str, int]:
        return {"1": 1}

    def latestOffset(self, start: dict[str, int], limit: object) -> dict[str, int]:
        return {"1": self.rows + 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Range]:
        bounds = range(start["1"], end["1"], self.partition_rows)
        return [Range(b, min(b + self.partition_rows, end["1"]), self.size) for b in bounds]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Range)
        for s in range(partition.start, partition.end, ARROW_BATCH_ROWS):
            yield batch(s, min(s + ARROW_BATCH_ROWS, partition.end), partition.size)


class SyntheticDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "synthetic_messages"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> SyntheticReader:
        return SyntheticReader(dict(self.options))
