"""Kafka's v2 records and the broker's frames, one pass in C each way (``_records.c``)."""

from typing_extensions import Buffer

#: The frame type of a plain message (data only), as HTTP publishes it by default.
PLAIN_TYPE: int
#: The frame type of a message that holds a Kafka record's envelope (key and headers).
KAFKA_RECORD_TYPE: int
#: The largest offset delta a batch holds (an int32): a fetch's batch ends before it.
MAX_OFFSET_DELTA: int
#: Whether checksums use the CPU's CRC-32C instruction (SSE 4.2).
HARDWARE_CRC: int

def frames_of_records(records: Buffer, count: int, topic: int, /,
                      ) -> tuple[bytes, bytes, int, int, bool]: ...
def batch_of_frames(frames: Buffer, firsts: Buffer, stamps: Buffer, /) -> tuple[bytes, int]: ...
def index_range(frames: Buffer, /) -> tuple[int, int]: ...
def crc32c(data: Buffer, portable: bool = ..., /) -> int: ...
