"""The rows Spark sees (:data:`SOURCE_SCHEMA`) and their Arrow form, built from verified
frames.

:func:`frames_to_arrow` turns a buffer of frames into one record batch with numpy, without a
Python object per row; the ``timestamp`` column comes from the partition's append times
(:class:`~messaging.spark.times.AppendTimes`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from messaging.frames import HEADER_SIZE

#: The columns a frame holds (what the Spark benchmark's in-memory baseline produces too).
SCHEMA = "topic long, index long, type int, data binary"
#: The source's rows: a frame's columns and the message's append time (null when unknown).
SOURCE_SCHEMA = SCHEMA + ", timestamp timestamp"
#: Rows per Arrow record batch handed to Spark.
ARROW_BATCH_ROWS = 65_536
_HEADER_COLUMNS = np.arange(HEADER_SIZE)


def frames_to_arrow(buffer: bytes, offsets: array[int],
                    timestamps: Callable[[np.ndarray], pa.Array]) -> pa.RecordBatch:
    """Arrow columns (topic, index, type, data, timestamp) from verified frames at
    ``offsets``; ``timestamps`` gives the last column from the rows' indexes."""
    raw = np.frombuffer(buffer, dtype=np.uint8)
    starts = np.frombuffer(offsets, dtype=np.int64)
    headers = raw[starts[:, None] + _HEADER_COLUMNS]  # (n, 26): every header, side by side
    index = headers[:, 0:8].copy().view(">u8").ravel().astype(np.int64)
    type_ = headers[:, 12:14].copy().view(">u2").ravel().astype(np.int32)
    topic = headers[:, 14:22].copy().view(">u8").ravel().astype(np.int64)
    lengths = headers[:, 22:26].copy().view(">u4").ravel().astype(np.int64)
    keep = np.ones(len(raw), dtype=bool)
    keep[(starts[:, None] + _HEADER_COLUMNS).ravel()] = False
    keep[int(starts[-1] + HEADER_SIZE + lengths[-1]):] = False
    values = raw[keep]
    value_offsets = np.zeros(len(starts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=value_offsets[1:])
    data = pa.Array.from_buffers(pa.binary(), len(starts),
                                 [None, pa.py_buffer(value_offsets), pa.py_buffer(values)])
    return pa.RecordBatch.from_arrays(
        [pa.array(topic), pa.array(index), pa.array(type_), data, timestamps(index)],
        names=["topic", "index", "type", "data", "timestamp"])
