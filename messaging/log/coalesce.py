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
    joined = False
    run: list[Command] = []
    run_topic: int | None = None

    def close_run() -> None:
        nonlocal joined
        if len(run) == 1:
            out.append(run[0])
            parts.append(None)
        elif run:
            out.append(b"".join(run))
            parts.append([len(command.offsets) for command in run])
            joined = True
        run.clear()

    for command in commands:
        topic = _joinable(command)
        if topic is not None and topic == run_topic:
            assert isinstance(command, Command)
            run.append(command)
            continue
        close_run()
        run_topic = topic
        if topic is not None:
            assert isinstance(command, Command)
            run.append(command)
        else:
            out.append(command)
            parts.append(None)
    close_run()
    return (out, parts) if joined else (list(commands), None)


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
