"""``messaging topics`` and ``messaging ping``: print what the brokers answer, the topics they
hold and the URLs of the cluster's nodes."""

from __future__ import annotations

import argparse

from messaging.cli.connect import LEARN_TIMEOUT, connect, learn_nodes


async def run_topics(args: argparse.Namespace) -> int:
    """``messaging topics``: one line per topic (a Kafka topic's partitions as NAME/P)."""
    async with connect(args) as client:
        await learn_nodes(client)
        topics = await client.topics()
    print(f"{'TOPIC':>8} {'FIRST':>12} {'LAST':>12} {'SIZE':>14} {'SEGMENTS':>8}  SUBSCRIBERS")
    for t in topics:
        subscribers = t.get("subscribers")
        subs = "-"
        if isinstance(subscribers, dict) and subscribers:
            subs = ", ".join(f"{u}@{i}" for u, i in sorted(subscribers.items()))
        shown = t.get("name") or t.get("id", "?")
        if "kafka_topic" in t:  # a Kafka topic's partition: NAME/PARTITION
            shown = f"{t['kafka_topic']}/{t.get('kafka_partition', '?')}"
        print(f"{shown:>8} {t.get('first_index', '?'):>12} "
              f"{t.get('last_index', '?'):>12} {t.get('size', '?'):>14} "
              f"{t.get('segments', '?'):>8}  {subs}")
    return 0


async def run_ping(args: argparse.Namespace) -> int:
    """``messaging ping``: the cluster's URLs, one a line."""
    async with connect(args, retry_timeout=LEARN_TIMEOUT) as client:
        for url in await client.ping():
            print(url)
    return 0
