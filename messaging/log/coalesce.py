"""Work once, append many: publishes for one topic taken together go to the log as one command.

A node that takes many single publishes at once (a thousand a second over a few puts) would
otherwise hand every node of its cluster one command per publish, and every node would stage
each of them on its own: a state-machine step, a stamp and an append per message. Joined, the
consecutive plain publishes of one topic (bodies the receiving node validated:
:class:`~messaging.broker.commands.Command` with one topic) are one command of frames that
every node stamps with a few strided copies and appends in one piece. Their publishers still
get their own index ranges: the joined command's messages are theirs in order, and
:func:`spread` cuts its result back into one per publish.

What is joined is only ever what could have been sent as one batch: frames of one topic,
validated where they were taken. A command that fails as a whole (its topic deleted or
stopped between validation and apply) fails every publish it holds with the same error.
Commands of other kinds (stream operations, idempotent publishes, heartbeats) and publishes
whose frames span topics are never joined, and the order of everything else is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import cast

from messaging.broker.commands import ApplyResult, Command
from messaging.errors import MessagingError

#: Per command to put: the message counts of the publishes joined in it (None: not joined).
Parts = list[list[int] | None]


def _joinable(command: bytes) -> int | None:
    """The topic of a plain validated publish for one topic (None: anything else)."""
    if isinstance(command, Command) and command.topic is not None:
        return command.topic
    return None


def coalesce(commands: Sequence[bytes]) -> tuple[list[bytes], Parts | None]:
    """The commands to put, each run of consecutive plain publishes for one topic joined in
    one; and per command put, the message counts of the publishes it joins (None when nothing
    was joined: the commands go as they are)."""
    out: list[bytes] = []
    parts: Parts = []
    for topic, same in groupby(commands, key=_joinable):
        run = list(same)
        if topic is None or len(run) == 1:
            out.extend(run)
            parts.extend([None] * len(run))
        else:
            out.append(b"".join(run))
            parts.append([len(cast(Command, command).offsets) for command in run])
    return (out, parts) if len(out) < len(commands) else (list(commands), None)


def spread(results: Sequence[ApplyResult | MessagingError],
           parts: Parts) -> list[ApplyResult | MessagingError]:
    """One result per publish of :func:`coalesce`'s input, from one per command it put: a
    joined command's index range cut in its publishes' order, or its error for each."""
    out: list[ApplyResult | MessagingError] = []
    for result, counts in zip(results, parts, strict=True):
        if counts is None:
            out.append(result)
        elif isinstance(result, ApplyResult):
            first = result.first
            for count in counts:
                out.append(ApplyResult(first, first + count - 1, result.topics))
                first += count
        else:
            out.extend([result] * len(counts))
    return out
