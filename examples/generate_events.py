"""Publish sample JSON events for the example pipeline.

    .venv/bin/python examples/generate_events.py --url http://127.0.0.1:8086 --topic 1 --count 10000

Each event is ``{"key": "sensor-3", "value": 12.5, "ts": "2026-11-21T08:00:17+00:00"}``,
with keys sensor-0..sensor-4 and timestamps spread over ``--minutes`` minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import random
from collections.abc import Sequence

from messaging.client import Client


def make_events(count: int, minutes: int, seed: int = 1,
                start: datetime.datetime | None = None) -> list[dict[str, object]]:
    """``count`` deterministic sample events."""
    rng = random.Random(seed)
    begin = start or datetime.datetime(2026, 11, 21, 8, 0, tzinfo=datetime.UTC)
    return [{"key": f"sensor-{rng.randrange(5)}", "value": round(rng.uniform(0, 100), 2),
             "ts": (begin + datetime.timedelta(seconds=rng.randrange(minutes * 60))).isoformat()}
            for _ in range(count)]


async def publish_events(url: str, topic: int, events: list[dict[str, object]]) -> None:
    """Publish events as JSON messages, in batches of 1000."""
    async with Client(url) as client:
        for i in range(0, len(events), 1000):
            await client.publish_batch(topic, [json.dumps(e).encode()
                                               for e in events[i:i + 1000]])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8086")
    parser.add_argument("--topic", type=int, default=1)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--minutes", type=int, default=5)
    args = parser.parse_args(argv)
    asyncio.run(publish_events(args.url, args.topic, make_events(args.count, args.minutes)))
    print(f"published {args.count} events to topic {args.topic}")


if __name__ == "__main__":
    main()
