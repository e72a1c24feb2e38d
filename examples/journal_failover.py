"""A primary/backup state machine on a journal topic: a secondary takes over from a killed
primary without losing or repeating a state change.

The state is a few counters; change ``n`` adds ``n`` to counter ``k{n % 5}``. The primary
commits each change to the journal *before* applying it, and checkpoints its state every 25
changes. The secondary follows the journal; when the primary's process ends (however it
ends: it watches a pidfd, no polling) it claims the journal with the next writer epoch
(fencing the old primary), catches up through its claim, and carries on as primary.

    .venv/bin/python examples/journal_failover.py primary --url http://127.0.0.1:8086 \\
        --changes 500 &
    .venv/bin/python examples/journal_failover.py secondary --url http://127.0.0.1:8086 \\
        --changes 500 --primary-pid $!
    # kill -9 the primary at any moment (once it printed "primary with epoch 1"): the
    # secondary prints the same final state it would have reached, each change applied once

Both print ``change N`` as they apply changes and the final state as JSON on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from messaging.client import Client
from messaging.errors import FencedError
from messaging.journal import CaughtUp, Checkpoint, Entry, Receiver, Writer

CHECKPOINT_EVERY = 25


def new_state() -> dict[str, Any]:
    """No change applied yet."""
    return {"changes": 0, "counters": {}}


def expected_state(changes: int) -> dict[str, Any]:
    """The state after changes 1..``changes``, each applied once."""
    state = new_state()
    for n in range(1, changes + 1):
        apply(state, change(n))
    return state


def change(n: int) -> bytes:
    """The journal entry of change ``n``."""
    return json.dumps({"n": n, "key": f"k{n % 5}", "add": n}).encode()


def apply(state: dict[str, Any], entry: bytes) -> None:
    """Apply one change; a lost or repeated change breaks the chain and raises."""
    op = json.loads(entry)
    if op["n"] != state["changes"] + 1:
        raise RuntimeError(f"change {op['n']} after change {state['changes']}: one was lost "
                           "or repeated")
    state["counters"][op["key"]] = state["counters"].get(op["key"], 0) + op["add"]
    state["changes"] = op["n"]
    print(f"change {op['n']}", flush=True)


def receive(state: dict[str, Any], item: Entry | Checkpoint) -> None:
    """Apply what a receiver fetched: an entry, or a checkpoint (which must agree)."""
    if isinstance(item, Checkpoint):
        if json.loads(item.state) != state:
            raise RuntimeError(f"checkpoint at {item.index} differs from the replayed state")
        return
    apply(state, item.data)


async def catch_up(receiver: Receiver, state: dict[str, Any], through: int = 0) -> None:
    """Apply every entry the broker has, at least through index ``through``."""
    while True:
        try:
            receive(state, await receiver.try_fetch_entry())
        except CaughtUp as caught:
            if max(caught.index, receiver.index) >= through:
                return
            await receiver.wait()  # the node asked has not applied ``through`` yet


async def become_primary(client: Client, topic: int, receiver: Receiver,
                         state: dict[str, Any]) -> Writer:
    """Claim the journal with the next epoch, then catch up through the claim."""
    for _attempt in range(10):
        writer = Writer(client, topic, epoch=receiver.epoch + 1)
        try:
            claim = await writer.claim()
        except FencedError:  # someone claimed a newer epoch: learn it from the journal
            await catch_up(receiver, state)
            continue
        await catch_up(receiver, state, through=claim)
        return writer
    raise RuntimeError("could not claim the journal")


async def run_primary(client: Client, topic: int, receiver: Receiver, state: dict[str, Any],
                      changes: int, delay: float) -> None:
    """Commit, then apply, every change up to ``changes``; checkpoint now and then."""
    writer = await become_primary(client, topic, receiver, state)
    print(f"primary with epoch {writer.epoch}", flush=True)
    for n in range(state["changes"] + 1, changes + 1):
        await writer.commit_entry(change(n))  # write ahead: committed, then applied
        apply(state, change(n))
        if n % CHECKPOINT_EVERY == 0:
            async with writer.prepared():  # no entry is committed while the state is taken
                await writer.checkpoint(json.dumps(state).encode())
        if delay:
            await asyncio.sleep(delay)


async def wait_for_exit(pid: int) -> None:
    """Return when process ``pid`` has ended (a pidfd becomes readable), at once when it had
    ended before this looked (no such process any more: it was killed before the secondary
    started, and reaped)."""
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop.add_reader(fd, ended.set)
    try:
        await ended.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def follow(receiver: Receiver, state: dict[str, Any]) -> None:
    """Apply entries as the primary commits them, forever."""
    while True:
        receive(state, await receiver.fetch_entry())


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=["primary", "secondary"])
    parser.add_argument("--url", default="http://127.0.0.1:8086")
    parser.add_argument("--topic", type=int, default=9)
    parser.add_argument("--changes", type=int, default=500)
    parser.add_argument("--delay", type=float, default=0.002, help="seconds between changes")
    parser.add_argument("--primary-pid", type=int, help="secondary: the primary to outlive")
    args = parser.parse_args(argv)
    state = new_state()
    async with Client(args.url) as client:
        receiver = Receiver(client, args.topic)
        if args.role == "secondary":
            if args.primary_pid is None:
                parser.error("a secondary needs --primary-pid")
            following = asyncio.ensure_future(follow(receiver, state))
            primary_gone = asyncio.ensure_future(wait_for_exit(args.primary_pid))
            await asyncio.wait([following, primary_gone], return_when=asyncio.FIRST_COMPLETED)
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            if not primary_gone.done():
                primary_gone.cancel()
                await asyncio.gather(primary_gone, return_exceptions=True)
                following.result()  # raises what stopped the follower
            print(f"primary {args.primary_pid} is gone: taking over", flush=True)
        try:
            await run_primary(client, args.topic, receiver, state, args.changes, args.delay)
        except FencedError as err:
            print(f"fenced: {err}", file=sys.stderr, flush=True)
            return 3
    print(json.dumps(state), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
