"""``messaging consumers``: list the stored consumer positions (of a topic) with their lag, or
reset or delete one first."""

from __future__ import annotations

import argparse
from typing import Any

from messaging.cli.connect import connect, learn_nodes
from messaging.cli.runner import fail
from messaging.json_ids import dumps


async def run_consumers(args: argparse.Namespace) -> int:
    """``messaging consumers``: ``--reset`` or ``--delete`` one, then list them all."""
    async with connect(args) as client:
        await learn_nodes(client)
        if args.reset is not None:
            if args.topic is None or args.to is None:
                return fail("--reset NAME needs TOPIC and --to INDEX")
            await client.reset_consumer(args.reset, args.topic, args.to)
        elif args.delete is not None:
            await client.delete_consumer(args.delete, args.topic)
        elif args.to is not None:
            return fail("--to goes with --reset NAME")
        consumers = await client.consumers(args.topic)
    if args.format == "json":
        for row in consumers:
            print(dumps(row))
        return 0
    print(f"{'TOPIC':>8} {'INDEX':>12} {'LAST':>12} {'LAG':>10} {'LAG-TIME':>9} {'IDLE':>9}"
          "  NAME")
    for c in consumers:
        idle = c.get("idle")
        shown = f"{idle:.1f}s" if isinstance(idle, int | float) else "?"
        if c.get("live") is False:
            shown += "*"
        behind = _lag_time(c.get("lag_ms"))
        topic = c.get("topic", "?")
        if "kafka_topic" in c:  # a Kafka topic's partition (a group's offsets): NAME/PARTITION
            topic = f"{c['kafka_topic']}/{c.get('kafka_partition', '?')}"
        print(f"{topic:>8} {c.get('index', '?'):>12} {c.get('last_index', '?'):>12} "
              f"{c.get('lag', '?'):>10} {behind:>9} {shown:>9}  {c.get('name', '?')}")
    return 0


def _lag_time(lag_ms: Any) -> str:
    """How long ago a consumer's first unread message was appended, short (``-``: unknown)."""
    if not isinstance(lag_ms, int):
        return "-"
    seconds = lag_ms / 1000
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f}{unit}"
    return f"{seconds:.1f}s"
