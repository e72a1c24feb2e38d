"""The wire between the split experiment's HTTP fronts and its log process, and the stats
request the experiment's run.py sends the log process.

Frames (one machine, so the offsets array travels in native byte order)::

    front → log   u32 body length | i64 topic | u32 stride | u32 offset count
                  | offset count × i64 offsets | body
                  topic -1: plain bytes, not a validated Command (count 0)
                  topic -2: a stats request (no body)
    log → front   u8 kind | u64 a | u64 b [| message]
                  kind 0, applied:  a = first index, b = last index
                  kind 1, an error: a = HTTP status, b = message length, then the UTF-8 message
                  kind 2, stats:    a = groups written, b = the broker's index
"""

from __future__ import annotations

import struct
from array import array

from messaging.broker.commands import Command

#: A command's header: body length, topic (or PLAIN / STATS), stride, offset count.
COMMAND = struct.Struct("=IqII")
#: An answer's header: kind, then two numbers whose meaning depends on the kind.
ANSWER = struct.Struct("=BQQ")
OFFSET_SIZE = array("q").itemsize
PLAIN, STATS = -1, -2
APPLIED, ERROR, STATS_KIND = 0, 1, 2


def command_frame(command: bytes) -> list[bytes]:
    """The pieces one command takes on the wire (a validated Command keeps its offsets)."""
    if isinstance(command, Command):
        offsets = command.offsets
        topic = PLAIN if command.topic is None else command.topic
        return [COMMAND.pack(len(command), topic, command.stride, len(offsets)),
                offsets.tobytes(), command]
    return [COMMAND.pack(len(command), PLAIN, 0, 0), command]


def stats_request() -> bytes:
    """The frame that asks the log process for its figures."""
    return COMMAND.pack(0, STATS, 0, 0)
