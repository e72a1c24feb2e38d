"""Soak test: one broker process under a steady mixed load for minutes, checked for leaks and
wrong data.

The broker runs as a child process on 127.0.0.1 (small segments, a small topic size and a 5 s
retention timer, so retention deletes segments all through the run). At the same time:
publishers POST single messages and frame batches to several topics at a bounded rate;
streaming subscribers (:class:`messaging.client.client.Conn`, heartbeating) come and go — followers
that read everything, laggards that read slowly and whose registration lapses, and slow ones
that never read; range readers make non-streaming reads with ``index``/``end``/``limit``;
a churner creates, configures, fills, reads back and deletes scratch topics.

Every ``--sample-interval`` seconds the broker's RSS, descriptors, threads and CPU, and the
load generator's publish latency, throughput and errors are sampled. At the end
(:mod:`bench.soak.checks`): every message a subscriber or a range read got is checked against
what publishers were acknowledged (order, gaps, content, 410s), the broker log for errors,
and RSS / descriptors / p99 for levelling off. Writes ``results/soak.json``, ``soak.png`` and
the ``soak`` section of RESULTS.md; exits 1 if any criterion fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness.cluster_nodes import nodes_ready
from bench.harness.etcd_members import Etcd, etcd_cluster
from bench.harness.figures import ms
from bench.harness.loops import bounded_wait
from bench.harness.procs import Proc, broker, free_port
from bench.harness.results import results_under
from bench.harness.sampling import cpu_seconds, descriptors, rss_bytes, threads
from bench.soak import kafka_load
from bench.soak.checks import evaluate, publish_results
from bench.soak.ledger import TOPICS, Ledger, RangeRead, Session
from messaging.cli.main import event_loop_factory
from messaging.client.client import Client
from messaging.errors import (
    MessagingError,
    PublishOutcomeUnknownError,
    TopicDeletedError,
    TopicTruncatedError,
)
from messaging.frames import Message

SUBSCRIBER_TIMEOUT = 20.0
BROKER_OPTIONS = ["--max-segment-size", "256K", "--max-topic-size", "4M",
                  "--truncation-interval", "5s", "--subscriber-timeout",
                  f"{SUBSCRIBER_TIMEOUT:.0f}s"]
SINGLE_PUBLISHERS, SINGLE_RATE = 4, 40.0  # tasks, requests/s each
BATCH_PUBLISHERS, BATCH_RATE, BATCH_SIZES = 2, 5.0, (20, 200)  # tasks, requests/s, messages
FOLLOWERS, LAGGARDS, SLOW_SUBSCRIBERS, RANGE_READERS = 4, 2, 2, 2
#: Topics the churner creates, configures, fills, reads back and deletes, over and over
#: (none of the checked TOPICS), and how long it rests between rounds.
SCRATCH_TOPICS, CHURN_PAUSE = (901, 902, 903), 1.0
LAGGARD_PACE = 0.01  # seconds per message: a third of one topic's publish rate
REQUEST_TIMEOUT = 30.0  # no single request of the load generator waits longer
MAX_SESSIONS = 10_000  # per subscriber slot: every loop is bounded in count and time


class ClientEvents(logging.Handler):
    """Counts what the client and Conn log: stream reconnects, failed heartbeats."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "heartbeat failed" in message:
            self.counts["heartbeat failed"] += 1
        elif "retrying" in message or "reconnecting" in message:
            self.counts["stream reconnect"] += 1


def payload(topic: int, tag: int, rng: random.Random) -> bytes:
    """Data that names its topic and publisher tag, padded to a random length."""
    return b"%d:%d:" % (topic, tag) + b"." * rng.randint(40, 400)


def parse_tag(message: Message) -> int:
    """The publisher tag in a message's data; -1 if its data does not name its own topic."""
    topic, tag, _pad = message.data.split(b":", 2)
    return int(tag) if int(topic) == message.topic else -1


# -- the broker process -------------------------------------------------------------------


#: With --tiered: closed segments go to a file:// object store in the run's directory and
#: the disk keeps a quarter of what total retention keeps, so range readers and laggards
#: read the store.
TIERED_OPTIONS = ["--local-retention-size", "1M", "--object-sweep-grace", "30s",
                  "--object-cache-size", "8M"]


def start_broker(directory: Path, tiered: bool = False,
                 kafka: str | None = None) -> tuple[Proc, str]:
    """``messaging broker`` with the soak's options as a child process, its log (INFO and up)
    in ``directory/broker.log``; stopped by its PID. ``kafka``: its Kafka listener's
    address."""
    extra: list[str] = [] if kafka is None else ["--kafka-bind", kafka]
    if tiered:
        store = directory / "store"
        store.mkdir()
        extra += ["--object-store", f"file://{store}", *TIERED_OPTIONS]
    return broker(directory / "data", *BROKER_OPTIONS, *extra, log=directory / "broker.log",
                  log_level="INFO")


#: With --cluster --tiered: the nodes share a file:// object store, their segments tier to it
#: and every batch of 4K or more takes the intake lane (singles stay inline).
INTAKE_OPTIONS = [*TIERED_OPTIONS, "--intake-min-size", "4K"]


def start_cluster(directory: Path, groups: int = 1, tiered: bool = False,
                  ) -> tuple[list[Etcd], list[tuple[Proc, str]]]:
    """Three etcd members and three broker nodes of one cluster (of ``groups`` topic groups,
    two holders each), each node with the soak's options and its own log (INFO and up);
    stopped by their PIDs. ``tiered``: with a shared object store and the intake lane."""
    extra: list[str] = []
    if tiered:
        store = directory / "store"
        store.mkdir()
        extra = ["--object-store", f"file://{store}", *INTAKE_OPTIONS]
    members = etcd_cluster(directory)
    for member in members:
        member.start()
    endpoints = [m.client_url for m in members]
    nodes = []
    for i in range(3):
        port = free_port()
        order = endpoints[i:] + endpoints[:i]
        nodes.append(broker(directory / f"node{i}", *BROKER_OPTIONS, "--etcd", ",".join(order),
                            "--cluster", "soak", "--advertise", f"http://127.0.0.1:{port}",
                            *(("--groups", str(groups), "--replicas", "2") if groups > 1
                              else ()), *extra,
                            port=port, log=directory / f"node{i}.log", log_level="INFO"))
    return members, nodes


async def _cluster_ready(urls: list[str], groups: int) -> None:
    """Wait until every node's watch is live (with groups: it is ready) and it acknowledges
    a publish."""
    async with aiohttp.ClientSession() as session:
        ready = nodes_ready if groups == 1 else _groups_ready
        await bounded_wait(lambda: ready(session, urls), 60, "cluster nodes ready", 0.2)


async def _intake_objects(urls: list[str]) -> int:
    """How many intake objects the nodes wrote (their diagnostics)."""
    total = 0
    async with aiohttp.ClientSession() as session:
        for url in urls:
            async with session.get(f"{url}/messaging/diagnostics") as resp:
                total += int(((await resp.json()).get("intake") or {})["objects_written"])
    return total


async def _groups_ready(session: aiohttp.ClientSession, urls: list[str]) -> bool:
    """Every node of a cluster of groups is ready and acknowledges a publish."""
    for url in urls:
        try:
            async with session.get(f"{url}/readyz",
                                   timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    return False
            async with session.post(f"{url}/messaging/messages", params={"topicID": "99"},
                                    data=b"ready?",
                                    timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status != 200:
                    return False
        except (aiohttp.ClientError, TimeoutError):
            return False
    return True


def proc_status(pids: list[int]) -> dict[str, float]:
    """The largest RSS (MiB), descriptors and threads of the processes, from /proc, and the
    CPU seconds of all of them."""
    return {"rss_mib": max(rss_bytes(pid) for pid in pids) / 2**20,
            "fds": max(descriptors(pid) for pid in pids),
            "threads": max(threads(pid) for pid in pids),
            "cpu_s": sum(cpu_seconds(pid) for pid in pids)}


# -- the load -----------------------------------------------------------------------------


def _paced(loop: asyncio.AbstractEventLoop, next_at: float, period: float) -> float:
    """The next start time: one period on, but never a burst to catch up after a stall."""
    return max(next_at + period, loop.time())


async def single_publisher(client: Client, ledger: Ledger, number: int, deadline: float,
                           rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    for seq in range(int(SINGLE_RATE * (deadline - loop.time())) + 1):
        if loop.time() >= deadline:
            return
        topic = rng.choice(TOPICS)
        tag = number * 1_000_000_000 + seq
        started = time.perf_counter()
        try:
            index = await asyncio.wait_for(client.publish(topic, payload(topic, tag, rng)),
                                           REQUEST_TIMEOUT)
        except (PublishOutcomeUnknownError, TimeoutError) as err:
            ledger.unknown.add(tag)
            ledger.error("publish", err)
        except MessagingError as err:
            ledger.error("publish", err)
        else:
            ledger.window_single.append(time.perf_counter() - started)
            ledger.ack(topic, index, tag)
        next_at = _paced(loop, next_at, 1 / SINGLE_RATE)
        await asyncio.sleep(next_at - loop.time())


async def batch_publisher(client: Client, ledger: Ledger, number: int, deadline: float,
                          rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    seq = 0
    for _ in range(int(BATCH_RATE * (deadline - loop.time())) + 1):
        if loop.time() >= deadline:
            return
        topic = rng.choice(TOPICS)
        tags = [number * 1_000_000_000 + seq + i for i in range(rng.randint(*BATCH_SIZES))]
        seq += len(tags)
        started = time.perf_counter()
        try:
            first, last = await asyncio.wait_for(client.publish_batch(
                topic, [payload(topic, tag, rng) for tag in tags]), REQUEST_TIMEOUT)
        except (PublishOutcomeUnknownError, TimeoutError) as err:
            ledger.unknown.update(tags)
            ledger.error("publish-batch", err)
        except MessagingError as err:
            ledger.error("publish-batch", err)
        else:
            ledger.window_batch.append(time.perf_counter() - started)
            if last - first + 1 != len(tags):
                ledger.anomalies.append(f"batch of {len(tags)} to topic {topic} was answered "
                                        f"with the range {first}..{last}")
            for offset, tag in enumerate(tags):
                ledger.ack(topic, first + offset, tag)
        next_at = _paced(loop, next_at, 1 / BATCH_RATE)
        await asyncio.sleep(next_at - loop.time())


async def _bounds(client: Client, topic: int) -> tuple[int, int]:
    """The topic's first and last committed index."""
    info = await asyncio.wait_for(client.topic(topic), REQUEST_TIMEOUT)
    return max(int(info["first_index"]), 1), int(info["last_index"])


async def _register(client: Client, topic: int, url: str, where: str,
                    rng: random.Random) -> int:
    """Heartbeat ``start - 1`` for ``url`` and make sure retention had not passed ``start``.

    ``where`` the subscription starts: ``earliest``, ``latest`` or ``random`` in between.

    After this, retention never deletes what the subscriber still needs while it heartbeats,
    so any 410 it gets is a defect (a retention run that started before the heartbeat was
    applied is given half a second to finish first).
    """
    for _ in range(5):
        first, last = await _bounds(client, topic)
        start = {"earliest": first, "latest": last + 1,
                 "random": rng.randint(first, max(first, last))}[where]
        await client.heartbeat(topic, start - 1, url)
        await asyncio.sleep(0.5)
        first, _last = await _bounds(client, topic)
        if first <= start:
            return start
    raise RuntimeError(f"could not register a subscriber on topic {topic}")


async def subscriber(client: Client, ledger: Ledger, kind: str, slot: int, deadline: float,
                     rng: random.Random) -> None:
    """Subscriptions of one kind, one after the other, each open for a random while.

    Half of a follower's sessions resume where its previous one stopped (same subscriber id,
    from its last heartbeated index + 1, well within the subscriber timeout), as a consumer
    that restarts does.
    """
    loop = asyncio.get_running_loop()
    previous: Session | None = None
    for number in range(MAX_SESSIONS):
        lifetime = min(rng.uniform(*{"follower": (3, 30), "laggard": (30, 90),
                                     "slow": (5, 25)}[kind]), deadline - loop.time())
        if lifetime < 2:
            return
        resume = (kind == "follower" and previous is not None and not previous.error
                  and rng.random() < 0.5
                  and loop.time() - previous.closed_at < SUBSCRIBER_TIMEOUT / 2)
        try:
            previous = await asyncio.wait_for(
                _session(client, ledger, kind, f"soak-{kind}-{slot}-{number}", lifetime, rng,
                         previous if resume else None),
                lifetime + 3 * REQUEST_TIMEOUT)
        except (MessagingError, TimeoutError, RuntimeError) as err:
            ledger.error(f"{kind}-setup", err)
            previous = None
        await asyncio.sleep(rng.uniform(0.2, 2.0))


async def _session(client: Client, ledger: Ledger, kind: str, url: str, lifetime: float,
                   rng: random.Random, resume: Session | None) -> Session:
    loop = asyncio.get_running_loop()
    topic = rng.choice(TOPICS)
    data_url: str | None = url
    if resume is not None:
        topic, url, start = resume.topic, resume.url, resume.next_index
    elif kind == "slow":
        # Never reads: half heartbeat (holding retention back), half are anonymous readers.
        data_url = url if rng.random() < 0.5 else None
        start = (await _bounds(client, topic))[0]
    else:
        where = "earliest" if kind == "laggard" else rng.choice(["latest", "random", "random"])
        start = await _register(client, topic, url, where, rng)
    session = Session(kind, topic, url, start, resumed=resume is not None)
    ledger.sessions.append(session)
    # A laggard heartbeats once, on open: its registration lapses after SUBSCRIBER_TIMEOUT.
    interval = 1.0 if kind != "laggard" else 10 * SUBSCRIBER_TIMEOUT
    conn = client.conn(topic, data_url=data_url, heartbeat_interval=interval)
    session.opened_at = loop.time()
    await conn.open(start, streaming=True)
    ledger.open_sessions += 1
    try:
        if kind == "slow":
            await asyncio.sleep(lifetime)
        else:
            async with asyncio.timeout(lifetime):
                async for message in conn:
                    session.indexes.append(message.index)
                    session.tags.append(parse_tag(message))
                    ledger.delivered += 1
                    if kind == "laggard":
                        await asyncio.sleep(LAGGARD_PACE)
    except TimeoutError:
        pass  # the session's time is up
    except TopicTruncatedError as err:
        session.error, session.error_at = "410", loop.time()
        session.truncated_first = err.first_index
        (ledger.expected if kind == "laggard" else ledger.errors)[f"{kind} 410"] += 1
    except MessagingError as err:
        session.error, session.error_at = f"{err.status} {err}", loop.time()
        ledger.error(kind, err)
    finally:
        ledger.open_sessions -= 1
        session.reconnects = conn.reconnects
        try:
            await asyncio.wait_for(conn.close(), REQUEST_TIMEOUT)
        except TimeoutError as err:
            ledger.error(f"{kind}-close", err)
        session.closed_at = loop.time()
        session.next_index = conn.index + 1
    return session


async def range_reader(client: Client, ledger: Ledger, deadline: float,
                       rng: random.Random) -> None:
    """Non-streaming reads of random ranges below the committed end (10 % below retention)."""
    loop = asyncio.get_running_loop()
    for _ in range(100_000):
        if loop.time() >= deadline:
            return
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        topic = rng.choice(TOPICS)
        try:
            first, last = await _bounds(client, topic)
        except (MessagingError, TimeoutError) as err:
            ledger.error("topic-info", err)
            continue
        if last == 0:
            continue
        below = first > 1 and rng.random() < 0.1
        index = rng.randint(0, first - 1) if below else rng.randint(first, last)
        end: int | None = min(last + 1, index + rng.randint(1, 3000))
        limit = rng.randint(1, 1000) if rng.random() < 0.5 else None
        if limit is not None and rng.random() < 0.5:
            end = None
        read = RangeRead(topic, index, end, limit, last)
        try:
            messages = await asyncio.wait_for(client.read(topic, index, end, limit),
                                              REQUEST_TIMEOUT)
        except TopicTruncatedError as err:
            read.truncated_first = err.first_index
            ledger.expected["range-read 410"] += 1
            ledger.reads.append(read)
            continue
        except (MessagingError, TimeoutError) as err:
            ledger.error("range-read", err)
            continue
        read.indexes.extend(m.index for m in messages)
        read.tags.extend(parse_tag(m) for m in messages)
        ledger.range_messages += len(messages)
        ledger.reads.append(read)


async def time_reader(client: Client, ledger: Ledger, deadline: float,
                      rng: random.Random) -> None:
    """Reads of the newest messages with their append times (every one has a time, never
    going back), then a read ``since=`` one of those times (it starts at the first message
    appended at or after it)."""
    loop = asyncio.get_running_loop()
    for _ in range(100_000):
        if loop.time() >= deadline:
            return
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        topic = rng.choice(TOPICS)
        try:
            first, last = await _bounds(client, topic)
            if last == 0:
                continue
            start = max(first, last - rng.randint(1, 5000))
            messages = await asyncio.wait_for(client.read(topic, start, limit=500, times=True),
                                              REQUEST_TIMEOUT)
            if not messages:
                continue
            times = [m.time for m in messages]
            if None in times:
                ledger.time_problems.append(f"topic {topic}: a message from {start} without a "
                                            "time")
                continue
            known = [t for t in times if t is not None]
            if known != sorted(known):
                ledger.time_problems.append(f"topic {topic}: times go back from {start}")
            pick = rng.randrange(len(messages))
            moment = known[pick]
            since = await asyncio.wait_for(client.read(topic, since=moment, limit=1),
                                           REQUEST_TIMEOUT)
        except TopicTruncatedError:
            continue  # retention moved past the range between the two requests
        except (MessagingError, TimeoutError) as err:
            ledger.error("time-read", err)
            continue
        ledger.time_reads += 1
        expected = next(m.index for m, t in zip(messages, known, strict=True) if t >= moment)
        if pick and known[0] < moment and (not since or since[0].index != expected):
            got = since[0].index if since else None
            ledger.time_problems.append(f"topic {topic}: since={moment} started at {got}, "
                                        f"not {expected}")


async def topic_churner(client: Client, ledger: Ledger, deadline: float,
                        rng: random.Random) -> None:
    """Topic management through the log, all through the run: a scratch topic is given
    settings, filled, read back exactly, deleted, and then read from its old start (410)."""
    loop = asyncio.get_running_loop()
    for round_ in range(100_000):
        if loop.time() >= deadline:
            return
        topic = SCRATCH_TOPICS[round_ % len(SCRATCH_TOPICS)]
        datas = [b"churn %d %d " % (round_, n) + rng.randbytes(rng.randint(0, 300))
                 for n in range(rng.randint(1, 400))]
        try:
            await asyncio.wait_for(client.create_topic(
                topic, max_segment_size=rng.choice(["4K", "16K", "64K"])), REQUEST_TIMEOUT)
            first, last = await asyncio.wait_for(client.publish_batch(topic, datas),
                                                 REQUEST_TIMEOUT)
            back = await asyncio.wait_for(client.read(topic, first), REQUEST_TIMEOUT)
            if [m.data for m in back] != datas or back[-1].index != last:
                ledger.anomalies.append(f"scratch topic {topic} round {round_}: read back "
                                        f"{len(back)} messages, published {len(datas)}")
            await asyncio.wait_for(client.delete_topic(topic), REQUEST_TIMEOUT)
            try:
                gone = await asyncio.wait_for(client.read(topic, first), REQUEST_TIMEOUT)
            except TopicDeletedError:
                ledger.expected["deleted-topic 410"] += 1
            else:
                if gone:
                    ledger.anomalies.append(f"scratch topic {topic} round {round_}: "
                                            f"{len(gone)} messages read after its deletion")
        except (MessagingError, TimeoutError) as err:
            ledger.error("topic-churn", err)
        await asyncio.sleep(CHURN_PAUSE)


async def sampler(client: Client, ledger: Ledger, pids: list[int], started: float,
                  deadline: float, interval: float, events: ClientEvents,
                  samples: list[dict[str, Any]]) -> None:
    """Every ``interval``: the broker's resources and the load's figures over the window."""
    loop = asyncio.get_running_loop()
    published = delivered = 0
    cpu = sum(cpu_seconds(pid) for pid in pids)
    errors: Counter[str] = Counter()
    for k in range(1, int((deadline - started) / interval) + 1):
        await asyncio.sleep(max(started + k * interval - loop.time(), 0))
        single, ledger.window_single = ledger.window_single, []
        batch, ledger.window_batch = ledger.window_batch, []
        status = proc_status(pids)
        sample: dict[str, Any] = {
            "t": round(loop.time() - started, 1), "rss_mib": round(status["rss_mib"], 1),
            "fds": status["fds"], "threads": status["threads"],
            "cpu_pct": round(100 * (status["cpu_s"] - cpu) / interval, 1),
            "p50_ms": _ms(single, 50), "p99_ms": _ms(single, 99),
            "batch_p50_ms": _ms(batch, 50), "batch_p99_ms": _ms(batch, 99),
            "published_per_s": round((ledger.published - published) / interval, 1),
            "delivered_per_s": round((ledger.delivered - delivered) / interval, 1),
            "published_total": ledger.published, "delivered_total": ledger.delivered,
            "range_read_messages_total": ledger.range_messages,
            "open_subscriptions": ledger.open_sessions,
            "errors": dict(ledger.errors - errors), "expected_410s": dict(ledger.expected),
            "client_events": dict(events.counts),
        }
        cpu, published, delivered = status["cpu_s"], ledger.published, ledger.delivered
        errors = Counter(ledger.errors)
        try:
            topics = await asyncio.wait_for(client.topics(), REQUEST_TIMEOUT)
            sample["topic_bytes"] = sum(t["size"] for t in topics)
            sample["segments"] = sum(t["segments"] for t in topics)
            sample["registered_subscribers"] = sum(len(t["subscribers"]) for t in topics)
        except (MessagingError, TimeoutError) as err:
            ledger.error("topics", err)
        samples.append(sample)
        print(f"t={sample['t']:6.1f}s rss={sample['rss_mib']:6.1f} MiB fds={sample['fds']:3d} "
              f"threads={sample['threads']:2d} cpu={sample['cpu_pct']:5.1f}% "
              f"p50={sample['p50_ms']:6.2f} p99={sample['p99_ms']:7.2f} ms "
              f"pub={sample['published_per_s']:7.1f}/s del={sample['delivered_per_s']:7.1f}/s "
              f"topics={sample.get('topic_bytes', 0) / 2**20:5.1f} MiB "
              f"subs={sample.get('registered_subscribers', '-')} "
              f"errors={sum(ledger.errors.values())}", flush=True)


def _ms(values: list[float], p: float) -> float:
    return round(ms(values, p), 3)


async def run_load(urls: list[str], pids: list[int], seconds: float, interval: float,
                   seed: int) -> tuple[Ledger, list[dict[str, Any]], ClientEvents, int]:
    """Run the whole load for ``seconds``; the ledger, the samples, client events, hung tasks.

    With one URL everything goes to it; with three (a cluster), publishers use the first
    node, subscribers the second and range readers and the sampler the third, so that every
    message is published through one node and streamed from another."""
    urls = urls if len(urls) >= 3 else urls * 3
    events = ClientEvents()
    for name in ("messaging.client.client", "messaging.client.conn"):
        client_log = logging.getLogger(name)
        client_log.addHandler(events)
        client_log.setLevel(logging.INFO)
        client_log.propagate = False
    ledger = Ledger()
    samples: list[dict[str, Any]] = []
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    async with Client(urls[0], timeout=REQUEST_TIMEOUT) as publishers, \
            Client(urls[1], timeout=REQUEST_TIMEOUT) as readers, \
            Client(urls[2], timeout=REQUEST_TIMEOUT) as observer:
        started = loop.time()
        deadline = started + seconds
        tasks = [asyncio.create_task(sampler(observer, ledger, pids, started, deadline,
                                             interval, events, samples))]
        tasks += [asyncio.create_task(single_publisher(
            publishers, ledger, n, deadline, random.Random(rng.random())))
            for n in range(SINGLE_PUBLISHERS)]
        tasks += [asyncio.create_task(batch_publisher(
            publishers, ledger, 100 + n, deadline, random.Random(rng.random())))
            for n in range(BATCH_PUBLISHERS)]
        await asyncio.sleep(min(2.0, seconds / 10))  # every topic exists before subscribers
        for kind, count in (("follower", FOLLOWERS), ("laggard", LAGGARDS),
                            ("slow", SLOW_SUBSCRIBERS)):
            tasks += [asyncio.create_task(subscriber(readers, ledger, kind, slot, deadline,
                                                     random.Random(rng.random())))
                      for slot in range(count)]
        tasks += [asyncio.create_task(range_reader(observer, ledger, deadline,
                                                   random.Random(rng.random())))
                  for _ in range(RANGE_READERS)]
        tasks.append(asyncio.create_task(topic_churner(publishers, ledger, deadline,
                                                       random.Random(rng.random()))))
        tasks.append(asyncio.create_task(time_reader(observer, ledger, deadline,
                                                     random.Random(rng.random()))))
        done, pending = await asyncio.wait(tasks, timeout=seconds + 4 * REQUEST_TIMEOUT)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                ledger.anomalies.append(f"load task {task.get_name()} died: "
                                        f"{task.exception()!r}")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*pending, return_exceptions=True)
    return ledger, samples, events, len(pending)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="how long the load runs (default 300)")
    parser.add_argument("--sample-interval", type=float, default=10.0,
                        help="seconds between samples (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the load")
    parser.add_argument("--out", type=Path, help="write results/ and RESULTS.md under this "
                        "directory instead of bench/")
    parser.add_argument("--cluster", action="store_true",
                        help="run the load against 3 broker nodes on a 3-member etcd cluster "
                        "(needs etcd on PATH)")
    parser.add_argument("--tiered", action="store_true",
                        help="one broker with a file:// object store: rolled segments are "
                        "offloaded and the disk keeps a quarter of the topic (with --cluster: "
                        "the nodes share it, and batches take the intake lane)")
    parser.add_argument("--groups", type=int, default=1,
                        help="with --cluster: the cluster's topic groups (two holders each)")
    parser.add_argument("--kafka", action="store_true",
                        help="one broker with a Kafka listener: an idempotent librdkafka "
                        "producer and a consumer group whose members come and go run beside "
                        "the HTTP load (bench/soak/kafka_load.py)")
    args = parser.parse_args()
    if args.kafka and args.cluster:
        parser.error("--kafka runs against one broker: leave out --cluster")
    kafka = f"127.0.0.1:{free_port()}" if args.kafka else None
    kafka_ledger = kafka_load.KafkaLedger()
    with tempfile.TemporaryDirectory(prefix="soak-", dir=os.environ.get("BENCH_DIR")) as tmp:
        members: list[Etcd] = []
        if args.cluster:
            members, nodes = start_cluster(Path(tmp), args.groups, args.tiered)
            logs = [Path(tmp) / f"node{i}.log" for i in range(3)]
        else:
            nodes = [start_broker(Path(tmp), args.tiered, kafka)]
            logs = [Path(tmp) / "broker.log"]
        procs, urls = [proc for proc, _ in nodes], [url for _, url in nodes]
        if args.cluster:
            asyncio.run(_cluster_ready(urls, args.groups))
        print(f"broker pids {[p.pid for p in procs]} at {urls}; load for {args.seconds:.0f} s",
              flush=True)
        kafka_thread = None if kafka is None else threading.Thread(
            target=kafka_load.run, args=(kafka, kafka_ledger, args.seconds, args.seed),
            name="soak-kafka")
        try:
            if kafka_thread is not None:
                kafka_thread.start()
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                ledger, samples, events, hung = runner.run(
                    run_load(urls, [p.pid for p in procs], args.seconds, args.sample_interval,
                             args.seed))
                intake = (runner.run(_intake_objects(urls)) if args.cluster and args.tiered
                          else None)
            if kafka_thread is not None:
                kafka_thread.join(args.seconds + 600)
        finally:
            codes = [proc.stop(grace=30) for proc in procs]
            for member in members:
                member.stop()
        exit_code = next((code for code in codes if code), 0)
        log_text = "\n".join(log.read_text(errors="replace") for log in logs)
    results_under(args.out)
    ledger.anomalies += kafka_ledger.anomalies
    kafka_text = "" if kafka is None else (
        f"Kafka clients beside it (`--kafka-bind`): an idempotent librdkafka producer sent "
        f"{len(kafka_ledger.acked):,} records at {kafka_load.RATE}/s to a topic of "
        f"{kafka_load.PARTITIONS} partitions (retention ran on them too), "
        f"{kafka_ledger.members} members of one consumer group came and went, reading "
        f"{kafka_ledger.consumed:,} records in order, and every record acknowledged at or "
        "after each partition's log start was read back once at the end "
        f"({len(kafka_ledger.anomalies)} Kafka anomalies).")
    if kafka_text:
        print(kafka_text)
    checks, summary = evaluate(ledger, samples, log_text, exit_code, hung,
                               SUBSCRIBER_TIMEOUT)
    cluster = ("Three broker nodes on a 3-member etcd cluster (3.4, `--snapshot-count 2000`)"
               + (f" with {args.groups} topic groups, two holders each" if args.groups > 1
                  else "") + ", "
               "all on this machine: publishers use node 0, subscribers node 1, range readers "
               "node 2; resources are the largest of the three nodes (CPU: their sum), the "
               "log check reads all three logs." if args.cluster else "")
    if args.cluster and args.tiered:
        cluster += (" The nodes share a file:// object store: rolled segments tier to it "
                    "and every batch of 4K or more goes through the intake lane (the store "
                    f"once, a pointer through etcd; {intake} intake objects written); singles "
                    "stay inline.")
    publish_results(samples, checks, summary, ledger, events.counts, args,
                    procs[0].args[3:], BROKER_OPTIONS, cluster, kafka_text)
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
