"""Memory of the scaling benchmark: broker RSS per idle streaming subscriber and per idle
topic, live and after a restart, each on a fresh broker."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness.loops import off_loop
from bench.harness.payloads import FRAME
from bench.harness.procs import Proc, broker
from bench.harness.sampling import descriptors, settled_rss
from bench.harness.stream_holder import Holder, publish_one, wait_streams
from bench.scaling.load import create_topics

Point = dict[str, Any]


async def memory_subscribers(tmp: Path, n: int) -> Point:
    """Broker RSS per caught-up streaming GET that reads normally (``n`` of them), on a fresh
    broker."""
    proc, url = broker(tmp / "memory-subscribers", "--fsync", "always")
    pid = proc.pid
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            last = 0
            for _ in range(20):  # warm: the write path, the connection, /metrics
                last = await publish_one(session, url, 1)
            await wait_streams(session, url, 0)
            before = await off_loop(lambda: settled_rss(pid))
            fds_before = descriptors(pid)
            holder = await off_loop(partial(Holder, url, 1, n, index=last + 1))
            try:
                await wait_streams(session, url, n)
                for _ in range(10):  # the streams read: each gets these ten as they come
                    await publish_one(session, url, 1)
                got = 0
                for _ in range(200):
                    got, _closed, _p50, _p99, _timed = await off_loop(holder.delivery)
                    if got >= 10 * FRAME * n:
                        break
                    await asyncio.sleep(0.1)
                after = await off_loop(lambda: settled_rss(pid))
                fds_after = descriptors(pid)
            finally:
                await off_loop(holder.stop)
    finally:
        proc.stop()
    point = {"subscribers": n, "empty_rss_kib": before, "rss_kib": after,
             "per_subscriber_kib": (after - before) / n,
             "fds_per_subscriber": (fds_after - fds_before) / n,
             "all_read": got >= 10 * FRAME * n}
    print(f"  {n:,} idle subscribers: RSS {before / 1024:.1f} → {after / 1024:.1f} MiB, "
          f"{point['per_subscriber_kib']:.1f} KiB each", flush=True)
    return point


def started_broker(data: Path) -> tuple[Proc, str, float]:
    """A broker on ``data``, its URL and the seconds it took to say it listens."""
    began = time.perf_counter()
    proc, url = broker(data, "--fsync", "always")
    return proc, url, time.perf_counter() - began


async def memory_topics(tmp: Path, n: int) -> Point:
    """Broker RSS per idle topic (``n`` topics, one message each): grown live, and after a
    restart."""
    empty, _url, empty_start = await off_loop(partial(started_broker, tmp / "memory-empty"))
    try:
        empty_rss = await off_loop(lambda: settled_rss(empty.pid))
    finally:
        empty.stop()
    data = tmp / "memory-topics"
    proc, url, _ = await off_loop(partial(started_broker, data))
    try:
        await create_topics(url, 1, 1)  # warm: the write path and one connection
        before = await off_loop(lambda: settled_rss(proc.pid))
        began = time.perf_counter()
        await create_topics(url, 2, n + 1)
        created = time.perf_counter() - began
        after = await off_loop(lambda: settled_rss(proc.pid))
    finally:
        proc.stop()
    proc, url, restart = await off_loop(partial(started_broker, data))
    try:
        restarted = await off_loop(lambda: settled_rss(proc.pid))
        fds = descriptors(proc.pid)
    finally:
        proc.stop()
    point = {"topics": n, "empty_rss_kib": empty_rss, "before_kib": before, "after_kib": after,
             "restart_rss_kib": restarted, "per_topic_kib": (after - before) / n,
             "per_topic_restart_kib": (restarted - empty_rss) / n, "create_s": created,
             "start_s": restart, "empty_start_s": empty_start, "restart_fds": fds}
    print(f"  {n:,} idle topics: RSS {before / 1024:.1f} → {after / 1024:.1f} MiB live "
          f"({point['per_topic_kib']:.1f} KiB each); after restart {restarted / 1024:.1f} MiB "
          f"vs {empty_rss / 1024:.1f} MiB empty ({point['per_topic_restart_kib']:.1f} KiB each),"
          f" start-up {restart:.2f} s vs {empty_start:.2f} s", flush=True)
    return point
