"""Spark reads and writes topics: the Python data source ``messaging`` (PySpark >= 4.2).

Synchronous code only (it runs on the driver and in executors' Python workers)::

    from messaging.spark import MessagingDataSource
    spark.dataSource.register(MessagingDataSource)
    spark.readStream.format("messaging").option("url", URL).option("topics", "1,2").load()

This module holds the data source itself, which hands out the readers of
:mod:`messaging.spark.source` and the writers of :mod:`messaging.spark.sink`; rows become
Arrow in :mod:`messaging.spark.arrow` (their append times come from
:mod:`messaging.spark.times`), options are parsed in :mod:`messaging.spark.options` and
brokers are reached through :mod:`messaging.spark.broker_http`. Registering it checks that
Spark's Python workers can run it (:mod:`messaging.spark.worker_python`).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from messaging.spark.arrow import SOURCE_SCHEMA
from messaging.spark.sink import MessagingBatchWriter, MessagingStreamWriter
from messaging.spark.source import MessagingBatchReader, MessagingStreamReader
from messaging.spark.worker_python import check_active_context

__all__ = ["MessagingDataSource"]


class MessagingDataSource(DataSource):
    """The ``messaging`` data source: ``spark.dataSource.register(MessagingDataSource)``."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("messaging")``.

        ``spark.dataSource.register`` asks for it first, on the driver: so registering the
        source checks that Spark's Python workers can import pyarrow and messaging, and fails
        with one line naming the fix (``PYSPARK_PYTHON``) when they cannot. Workers ask too,
        and check nothing (they have no SparkContext); an interpreter that passed is not
        asked again.
        """
        check_active_context()
        return "messaging"

    def schema(self) -> str:
        """Columns: topic long, index long, type int, data binary, timestamp timestamp (the
        message's append time; null for messages written before the broker kept times)."""
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> MessagingBatchReader:
        """``spark.read``: a range of one or more topics."""
        return MessagingBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> MessagingStreamReader:
        """``spark.readStream``: a Structured Streaming source."""
        return MessagingStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> MessagingBatchWriter:
        """``df.write``: publish every row."""
        return MessagingBatchWriter(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> MessagingStreamWriter:
        """``df.writeStream``: publish every micro-batch."""
        return MessagingStreamWriter(dict(self.options))
