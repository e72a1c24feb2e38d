"""Durable Streams benchmark: our broker's /v1/stream against its native API and the Node
reference server (@durable-streams/server, file-backed), all in one run on this machine.

1. Single appends: 50 aiohttp connections, each POSTing 100-byte messages one after another
   for a fixed time: /v1/stream (plain, and with Producer-Id/-Epoch/-Seq, one producer per
   connection), the native ``POST /messaging/messages?topicID=N`` and the reference server's
   /v1/stream (plain and with producer headers). Throughput, latency p50/p99, server CPU per
   append; runs interleaved, medians of the runs.
2. Catch-up reads: 100,000 JSON messages of 100 bytes written to one stream (and the same
   100,000 messages to a native topic), then the whole stream read from offset -1, following
   Stream-Next-Offset until Stream-Up-To-Date (native: one non-streaming GET of the topic).
3. SSE delivery latency: one ``live=sse`` reader (offset=now, a text/plain stream) while a
   publisher appends 1,000 messages/s for 10 s, each carrying its send time.
4. A finding of this benchmark: the /v1/stream append rate once 2,000 more (idle) streams
   exist, against part 1's figure (an append group journals only the streams it changed,
   so the figure should not move).

Our broker and the reference server each run in their own process on 127.0.0.1 and are
stopped by their PID; every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness import settings
from bench.harness.figures import Row, fmt, percentile
from bench.harness.loops import run_loop
from bench.harness.payloads import PAYLOAD
from bench.harness.peer_servers import ReferenceServer
from bench.harness.procs import broker
from bench.harness.results import (
    add_to_json,
    command_line,
    report,
    results_under,
    source_state,
)
from bench.harness.sampling import cpu_seconds, load_average, machine_busy
from bench.harness.v1_stream import (
    LATENCY_TOPIC,
    create,
    delivery_latency,
    group_commits,
    json_messages,
    preload_stream,
    read_stream,
)
from messaging.frames import FRAMES_CONTENT_TYPE, HEADER, HEADER_SIZE, encode_batch

CONNECTIONS = 50
OCTETS = "application/octet-stream"
NATIVE_TOPIC = 1
CATCHUP_TOPIC = 2
NATIVE_PRODUCER_TOPIC = 4
#: How long past its 10 s the paced publisher waits for answers (the reference server falls
#: far behind 1,000 appends/s with an SSE reader attached).
PUBLISH_GRACE = 50.0
#: Bound of one append run, per connection.
MAX_APPENDS_PER_CONNECTION = 200_000


@dataclass
class Settings(settings.Settings):
    """How long and how much each part runs (``--quick`` shrinks everything); ``rounds``
    append runs of ``seconds`` per target, interleaved."""

    rounds: int = 5
    warmup: float = 1.0
    messages: int = 100_000  # catch-up
    reads: int = 3
    sse_rate: int = 1000
    sse_seconds: float = 10.0
    idle_streams: int = 2000


@dataclass
class Load:
    """One append run against one target."""

    rate: float  # appends/s
    p50: float  # ms
    p99: float  # ms
    appends: int
    server_cpu_ms: float  # server CPU per append, ms
    server_cores: float
    client_cores: float
    machine_cores: float  # every process on the machine
    per_group: float = 0.0  # appends per group commit (our broker only)

    @property
    def other_cores(self) -> float:
        """Cores busy with neither the measured server nor the load generator."""
        return max(0.0, self.machine_cores - self.server_cores - self.client_cores)


@dataclass
class Target:
    """Where one kind of append goes."""

    key: str
    label: str
    url: str
    pid: int
    producer: bool = False
    ours: bool = True
    loads: list[Load] = field(default_factory=list)

    def median(self, attribute: str) -> float:
        return float(statistics.median(getattr(load, attribute) for load in self.loads))


# -- part 1: single appends --------------------------------------------------------------------

def append_path(target: Target) -> str:
    if target.key.startswith("native"):
        topic = NATIVE_PRODUCER_TOPIC if target.producer else NATIVE_TOPIC
        return f"{target.url}/messaging/messages?topicID={topic}"
    name = "bench-producer" if target.producer else "bench-append"
    return f"{target.url}/v1/stream/{name}"


async def append_run(target: Target, seconds: float, epoch: int) -> Load:
    """``CONNECTIONS`` loops of sequential single 100-byte appends for ``seconds``."""
    path = append_path(target)
    latencies: list[float] = []
    ours = target.ours
    groups = await group_commits(target.url) if ours else 0
    cpu, client, machine = cpu_seconds(target.pid), time.process_time(), machine_busy()
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS)) as session:

        async def connection(i: int) -> None:
            headers = {"Content-Type": OCTETS}
            for seq in range(MAX_APPENDS_PER_CONNECTION):
                if time.perf_counter() >= deadline:
                    return
                if target.producer:  # one producer per connection, a new epoch per run
                    headers = {"Content-Type": OCTETS, "Producer-Id": f"bench-{i}",
                               "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}
                sent = time.perf_counter()
                async with session.post(path, data=PAYLOAD, headers=headers) as resp:
                    await resp.read()
                    if resp.status not in (200, 204):
                        raise RuntimeError(f"POST {path}: HTTP {resp.status} "
                                           f"{resp.headers.get('X-Broker-Error', '')}")
                latencies.append(time.perf_counter() - sent)

        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(connection(i) for i in range(CONNECTIONS)))
        elapsed = time.perf_counter() - started
    server = cpu_seconds(target.pid) - cpu
    machine_cores = (machine_busy() - machine) / elapsed
    client_cores = (time.process_time() - client) / elapsed
    groups = await group_commits(target.url) - groups if ours else 0
    return Load(len(latencies) / elapsed, percentile(latencies, 50) * 1000,
                percentile(latencies, 99) * 1000, len(latencies),
                server / len(latencies) * 1000, server / elapsed, client_cores, machine_cores,
                len(latencies) / groups if groups else 0.0)


async def appends(targets: list[Target], s: Settings) -> None:
    for target in targets:  # connections, the JIT, first files: not measured
        await append_run(target, s.warmup, 0)
    for run in range(s.rounds):  # interleaved, so drift of the machine hits every target alike
        for target in targets:
            load = await append_run(target, s.seconds, run + 1)
            target.loads.append(load)
            print(f"  run {run + 1} {target.label}: {load.rate:,.0f}/s, p50 {load.p50:.2f} ms, "
                  f"p99 {load.p99:.2f} ms, server {load.server_cores:.2f} cores, "
                  f"generator {load.client_cores:.2f}, others {load.other_cores:.2f}",
                  flush=True)


# -- part 2: catch-up reads --------------------------------------------------------------------

async def preload_native(session: aiohttp.ClientSession, url: str, messages: list[bytes]) -> None:
    for start in range(0, len(messages), 10_000):
        body = encode_batch(CATCHUP_TOPIC, messages[start:start + 10_000])
        async with session.post(f"{url}/messaging/messages", data=body,
                                headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"native preload: HTTP {resp.status}")


async def read_native(session: aiohttp.ClientSession, url: str) -> tuple[float, list[bytes]]:
    """Seconds for one non-streaming GET of the whole topic, and the frames' data."""
    started = time.perf_counter()
    async with session.get(f"{url}/messaging/messages",
                           params={"topicID": str(CATCHUP_TOPIC), "index": "0"}) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"native catch-up read: HTTP {resp.status}")
    elapsed = time.perf_counter() - started
    datas = []
    offset = 0
    for _ in range(len(body) // HEADER_SIZE + 1):
        if offset >= len(body):
            break
        length = HEADER.unpack_from(body, offset)[-1]
        datas.append(body[offset + HEADER_SIZE:offset + HEADER_SIZE + length])
        offset += HEADER_SIZE + length
    return elapsed, datas


def stream_items(bodies: list[bytes]) -> list[bytes]:
    """The messages of a JSON stream's catch-up pages, re-encoded as sent."""
    return [json.dumps(value).encode() for body in bodies for value in json.loads(body)]


async def catch_up(url: str, ref_url: str, s: Settings) -> dict[str, dict[str, Any]]:
    messages = json_messages(s.messages)
    size = sum(len(m) for m in messages)
    figures: dict[str, dict[str, list[float]]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        await preload_stream(session, url, "catchup", messages)
        await preload_native(session, url, messages)
        await preload_stream(session, ref_url, "catchup", messages)
        print(f"  wrote {s.messages:,} messages to each in {time.perf_counter() - started:.1f} s",
              flush=True)
        readers: dict[str, Callable[[], Coroutine[Any, Any, tuple[float, list[bytes]]]]] = {
            "stream": lambda: read_stream(session, url, "catchup"),
            "native": lambda: read_native(session, url),
            "ref": lambda: read_stream(session, ref_url, "catchup"),
        }
        for _ in range(s.reads):
            for key, read in readers.items():
                elapsed, bodies = await read()
                got = bodies if key == "native" else stream_items(bodies)
                if got != messages:  # checked after the clock stopped
                    raise RuntimeError(f"catch-up read of {key}: {len(got)} messages, not the "
                                       f"{len(messages)} written")
                pages = 1 if key == "native" else len(bodies)
                wire = sum(len(b) for b in bodies) if key != "native" else (
                    size + HEADER_SIZE * len(messages))
                entry = figures.setdefault(key, {"seconds": [], "pages": [], "wire": []})
                entry["seconds"].append(elapsed)
                entry["pages"].append(pages)
                entry["wire"].append(wire)
                print(f"  {key}: {elapsed:.3f} s, {pages} request(s)", flush=True)
    result = {}
    for key, entry in figures.items():
        seconds = statistics.median(entry["seconds"])
        result[key] = {"seconds": seconds, "msg_per_s": s.messages / seconds,
                       "mb_per_s": size / seconds / 1e6, "pages": entry["pages"][0],
                       "wire_bytes": entry["wire"][0], "runs": entry["seconds"]}
    return result


# -- part 3: SSE delivery latency --------------------------------------------------------------

# -- part 4: many streams in the catalog -------------------------------------------------------

async def idle_streams(url: str, count: int) -> float:
    """Create ``count`` empty streams, 50 at a time; seconds it took."""
    started = time.perf_counter()
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS)) as session:
        names = iter(range(count))

        async def creator() -> None:
            for k in names:  # shared iterator: each name once; bounded by count
                await create(session, url, f"idle-{k}", OCTETS)

        await asyncio.gather(*(creator() for _ in range(CONNECTIONS)))
    return time.perf_counter() - started


# -- the run -----------------------------------------------------------------------------------

async def run(tmp: Path, s: Settings) -> tuple[list[Row], str, dict[str, Any]]:
    load_before = load_average()
    source = source_state()
    ours_proc, url = broker(tmp / "broker", log=tmp / "broker.log")
    ref = None
    try:
        ref = ReferenceServer(tmp / "reference", tmp / "reference.log")
        async with aiohttp.ClientSession() as session:
            for base in (url, ref.url):
                await create(session, base, "bench-append", OCTETS)
                await create(session, base, "bench-producer", OCTETS)
        stream = Target("stream", "/v1/stream (ours)", url, ours_proc.pid)
        producer = Target("producer", "/v1/stream + producer (ours)", url, ours_proc.pid,
                          producer=True)
        native = Target("native", "native POST (ours)", url, ours_proc.pid)
        native_producer = Target("native-producer", "native POST + producer (ours)", url,
                                 ours_proc.pid, producer=True)
        ref_plain = Target("ref", "reference /v1/stream", ref.url, ref.pid, ours=False)
        ref_producer = Target("ref-producer", "reference /v1/stream + producer", ref.url,
                              ref.pid, producer=True, ours=False)
        targets = [stream, producer, native, native_producer, ref_plain, ref_producer]
        print(f"1. single appends, {CONNECTIONS} connections, {s.rounds} × {s.seconds:.0f} s "
              "per target, interleaved", flush=True)
        await appends(targets, s)
        print(f"2. catch-up reads of {s.messages:,} JSON messages of 100 B", flush=True)
        reads = await catch_up(url, ref.url, s)
        print(f"3. SSE delivery latency at {s.sse_rate:,} msg/s for {s.sse_seconds:.0f} s",
              flush=True)
        sse = {}
        for key, base, kind in (("ours", url, "sse"), ("ref", ref.url, "sse"),
                                ("native", url, "native")):
            sse[key] = figures = await delivery_latency(base, kind, s.sse_rate, s.sse_seconds,
                                                        ours=base == url, grace=PUBLISH_GRACE)
            print(f"  {key}: p50 {figures['p50']:.2f} ms, p99 {figures['p99']:.2f} ms, "
                  f"{figures['received']}/{figures['sent']} received, publishing took "
                  f"{figures['publish_seconds']:.1f} s; after the answer p50 "
                  f"{figures['after_ack_p50']:.2f} ms", flush=True)
        print(f"4. /v1/stream appends after creating {s.idle_streams:,} idle streams",
              flush=True)
        created = await idle_streams(url, s.idle_streams)
        # The broker's state beside its topics: broker.json (folded in now and then) and the
        # state journal's lines since.
        state_size = sum(path.stat().st_size for path in (tmp / "broker" / "broker.json",
                                                          tmp / "broker" / "catalog.log")
                         if path.exists())
        crowded = await append_run(stream, s.seconds, 0)
        crowded_native = await append_run(native, s.seconds, 0)
        print(f"  created in {created:.1f} s; state {state_size:,} B; /v1/stream "
              f"{crowded.rate:,.0f}/s p50 {crowded.p50:.2f} ms (machine "
              f"{crowded.machine_cores:.2f} cores); native {crowded_native.rate:,.0f}/s "
              f"(machine {crowded_native.machine_cores:.2f} cores)", flush=True)
    finally:
        ours_proc.stop()
        if ref is not None:
            ref.stop()
    load_after = load_average()

    def m(target: Target, attribute: str) -> float:
        return target.median(attribute)

    rows = [
        Row("single appends, 50 connections: /v1/stream vs native", m(stream, "rate"),
            "msg/s", "native POST /messaging/messages", m(native, "rate")),
        Row("single appends: /v1/stream vs reference server", m(stream, "rate"), "msg/s",
            "reference /v1/stream", m(ref_plain, "rate")),
        Row("appends with Producer-Id/Epoch/Seq: /v1/stream vs native", m(producer, "rate"),
            "msg/s", "native POST /messaging/messages", m(native, "rate")),
        Row("appends with producer headers: /v1/stream vs reference server",
            m(producer, "rate"), "msg/s", "reference, same producer headers",
            m(ref_producer, "rate")),
        Row("appends with producer headers: /v1/stream vs native with them",
            m(producer, "rate"), "msg/s", "native POST + Producer-Id/Epoch/Seq",
            m(native_producer, "rate")),
        Row("native POST with producer headers vs without", m(native_producer, "rate"),
            "msg/s", "native POST without", m(native, "rate")),
        Row("append latency p50: /v1/stream vs native", m(stream, "p50"), "ms", "native POST",
            m(native, "p50")),
        Row("append latency p99: /v1/stream vs native", m(stream, "p99"), "ms", "native POST",
            m(native, "p99")),
        Row("append latency p50: /v1/stream vs reference server", m(stream, "p50"), "ms",
            "reference /v1/stream", m(ref_plain, "p50")),
        Row("append latency p99: /v1/stream vs reference server", m(stream, "p99"), "ms",
            "reference /v1/stream", m(ref_plain, "p99")),
        Row("append latency p50 with producer headers vs reference", m(producer, "p50"), "ms",
            "reference, same headers", m(ref_producer, "p50")),
        Row("append latency p99 with producer headers vs reference", m(producer, "p99"), "ms",
            "reference, same headers", m(ref_producer, "p99")),
        Row("server CPU per append: /v1/stream vs native", m(stream, "server_cpu_ms"), "ms",
            "native POST", m(native, "server_cpu_ms")),
        Row("server CPU per append: /v1/stream vs reference server",
            m(stream, "server_cpu_ms"), "ms", "reference server (Node)",
            m(ref_plain, "server_cpu_ms")),
        Row(f"catch-up read of {s.messages:,} × 100 B JSON messages: /v1/stream vs native",
            reads["stream"]["msg_per_s"], "msg/s", "native non-streaming GET",
            reads["native"]["msg_per_s"]),
        Row("catch-up read: /v1/stream vs reference server", reads["stream"]["msg_per_s"],
            "msg/s", "reference /v1/stream", reads["ref"]["msg_per_s"]),
        Row("catch-up read, message data: /v1/stream vs reference server",
            reads["stream"]["mb_per_s"], "MB/s", "reference /v1/stream",
            reads["ref"]["mb_per_s"]),
        Row(f"SSE delivery latency p50 at {s.sse_rate:,} msg/s: ours vs reference server",
            sse["ours"]["p50"], "ms", "reference server", sse["ref"]["p50"]),
        Row(f"SSE delivery latency p99 at {s.sse_rate:,} msg/s: ours vs reference server",
            sse["ours"]["p99"], "ms", "reference server", sse["ref"]["p99"]),
        Row(f"live delivery latency p50 at {s.sse_rate:,} msg/s: /v1/stream SSE vs native",
            sse["ours"]["p50"], "ms", "native streaming GET", sse["native"]["p50"]),
        Row(f"live delivery latency p99 at {s.sse_rate:,} msg/s: /v1/stream SSE vs native",
            sse["ours"]["p99"], "ms", "native streaming GET", sse["native"]["p99"]),
        Row(f"/v1/stream appends with {s.idle_streams:,} more idle streams vs part 1",
            crowded.rate, "msg/s", "part 1 (2 streams)", m(stream, "rate")),
        Row(f"/v1/stream append p50 with {s.idle_streams:,} more idle streams vs part 1",
            crowded.p50, "ms", "part 1 (2 streams)", m(stream, "p50")),
    ]
    names = [row.name for row in rows]
    assert len(set(names)) == len(names), "the plot needs every figure's name to differ"
    raw = ["| target | appends/s | p50 ms | p99 ms | server CPU/append | appends per group "
           "commit | server cores | generator cores | other processes' cores |",
           "|---|---|---|---|---|---|---|---|---|"]
    for t in targets:
        raw.append(f"| {t.label} | {fmt(m(t, 'rate'))} | {fmt(m(t, 'p50'))} | "
                   f"{fmt(m(t, 'p99'))} | {fmt(m(t, 'server_cpu_ms'))} ms | "
                   f"{fmt(m(t, 'per_group')) if t.ours else '-'} | "
                   f"{m(t, 'server_cores'):.2f} | {m(t, 'client_cores'):.2f} | "
                   f"{m(t, 'other_cores'):.2f} |")
    reads_table = ["| catch-up | msg/s | MB/s (data) | requests | bytes on the wire |",
                   "|---|---|---|---|---|"]
    for key, label in (("stream", "/v1/stream (ours)"), ("native", "native GET (ours)"),
                       ("ref", "reference /v1/stream")):
        r = reads[key]
        reads_table.append(f"| {label} | {fmt(r['msg_per_s'])} | {fmt(r['mb_per_s'])} | "
                           f"{r['pages']:.0f} | {r['wire_bytes']:,.0f} |")
    sse_table = [f"| live reader, {s.sse_rate:,} appends/s offered | p50 ms | p99 ms | max ms | "
                 "received | append answered p50 / p99 ms | delivery after the answer p50 / "
                 "p99 ms | publishing took | appends per group commit |",
                 "|---|---|---|---|---|---|---|---|---|"]
    for key, label in (("ours", "SSE, ours"), ("ref", "SSE, reference server"),
                       ("native", "native streaming GET, ours")):
        f = sse[key]
        sse_table.append(f"| {label} | {fmt(f['p50'])} | {fmt(f['p99'])} | {fmt(f['max'])} | "
                         f"{f['received']:,}/{f['sent']:,} | {fmt(f['ack_p50'])} / "
                         f"{fmt(f['ack_p99'])} | {f['after_ack_p50']:.2f} / "
                         f"{f['after_ack_p99']:.2f} | {f['publish_seconds']:.1f} s | "
                         f"{fmt(f['per_group']) if f['per_group'] else '-'} |")
    others = statistics.median(load.other_cores for t in targets for load in t.loads)
    ours_sse, ref_sse, native_sse = sse["ours"], sse["ref"], sse["native"]
    ref_kept_up = ref_sse["publish_seconds"] <= s.sse_seconds * 1.2
    summary = (
        f"**What the figures say.** Single appends to /v1/stream run at "
        f"{m(stream, 'rate') / m(native, 'rate'):.2f}x the native publish rate (with producer "
        f"headers {m(producer, 'rate') / m(native, 'rate'):.2f}x) and cost "
        f"{m(stream, 'server_cpu_ms') / m(native, 'server_cpu_ms'):.1f}x the broker CPU per "
        f"append. Group commit works on both paths ({m(stream, 'per_group'):.0f} vs "
        f"{m(native, 'per_group'):.0f} appends per group); a group that holds a stream append "
        f"also appends one line with the streams it changed to the catalog's journal and "
        f"fsyncs it (a second fsync per group), on the one writer thread. Native publishes "
        f"with producer headers change the catalog too (the producers' state) and pay the same: "
        f"they run at {m(native_producer, 'rate') / m(native, 'rate'):.2f}x plain native "
        f"publishes ({m(native_producer, 'per_group'):.0f} per group), and /v1/stream with "
        f"producer headers at {m(producer, 'rate') / m(native_producer, 'rate'):.2f}x of them. "
        f"With {s.idle_streams:,} more (idle) streams /v1/stream appends run at "
        f"{crowded.rate / m(stream, 'rate'):.2f}x of part 1 (p50 {crowded.p50:.0f} ms; "
        f"state {state_size / 1000:,.0f} kB in broker.json and the state journal, broker.json "
        f"rewritten only when the journal is folded in) while native publishes run at "
        f"{crowded_native.rate:,.0f}/s. Against the "
        f"reference server, "
        f"our /v1/stream takes {m(stream, 'rate') / m(ref_plain, 'rate'):.1f}x the appends/s "
        f"({m(producer, 'rate') / m(ref_producer, 'rate'):.1f}x with producer headers) at "
        f"{m(stream, 'server_cpu_ms') / m(ref_plain, 'server_cpu_ms'):.2f}x the server CPU "
        f"per append: it fsyncs every append alone, one after another (see durability below). "
        f"Catch-up reads of /v1/stream reach {reads['stream']['msg_per_s'] / 1e3:,.0f}k msg/s, "
        f"{reads['stream']['msg_per_s'] / reads['native']['msg_per_s']:.2f}x the native GET of "
        f"the same messages and {reads['stream']['msg_per_s'] / reads['ref']['msg_per_s']:.2f}x "
        f"the reference server (which answers the whole stream in one response; ours pages at "
        f"1 MiB, {reads['stream']['pages']:.0f} requests, and builds a Python object per "
        f"message). Live delivery: our SSE p50 is {ours_sse['p50']:.1f} ms against "
        f"{native_sse['p50']:.1f} ms for a native streaming GET under the same publisher: "
        f"the /v1/stream append itself is answered at p50 {ours_sse['ack_p50']:.1f} ms "
        f"({ours_sse['per_group']:.1f} appends per group commit) vs "
        f"{native_sse['ack_p50']:.1f} ms native ({native_sse['per_group']:.1f} per group), and "
        f"the SSE path delivers {ours_sse['after_ack_p50']:.2f} ms p50 after the answer vs "
        f"{native_sse['after_ack_p50']:.2f} ms for the native fan-out (which writes each "
        f"commit from memory; SSE wakes a task that reads the stream's files on a thread). "
        + ("The reference server did not keep up with "
           f"{s.sse_rate:,} appends/s with an SSE reader attached (publishing the "
           f"{ref_sse['sent']:,} messages took {ref_sse['publish_seconds']:.0f} s; its SSE loop "
           f"re-reads and re-parses the whole stream file on every wake-up), so its SSE "
           f"figures are mostly appends queueing; once an append is answered it delivers in "
           f"{ref_sse['after_ack_p50']:.2f} ms p50. " if not ref_kept_up else
           f"The reference server delivers {ref_sse['after_ack_p50']:.2f} ms p50 after an "
           f"append's answer. ")
        + f"Other work on the machine used a median {others:.2f} cores during the append runs "
        f"(load average {load_before} before, {load_after} after)"
        + ("; absolute figures are noisy, ratios come from interleaved runs." if others > 0.25
           else "."))
    notes = "\n".join([
        "Medians of the interleaved append runs (by target):", "", *raw, "",
        *reads_table, "", *sse_table, "",
        f"Part 4: {s.idle_streams:,} empty streams created ({created:.1f} s, 50 at a time); "
        f"broker.json and the state journal then held {state_size:,} bytes; one "
        f"{s.seconds:.0f}-s run each: "
        f"/v1/stream {crowded.rate:,.0f} appends/s (p50 {crowded.p50:.1f} ms, p99 "
        f"{crowded.p99:.1f} ms, {crowded.server_cpu_ms:.2f} ms broker CPU per append), native "
        f"{crowded_native.rate:,.0f}/s (p50 {crowded_native.p50:.1f} ms).",
        "",
        f"Load average before {load_before}, after {load_after}. Broker measured: {source}.",
    ])
    notes = summary + "\n\n" + notes
    extra = {"settings": asdict(s), "appends": {t.key: [asdict(x) for x in t.loads]
                                                for t in targets},
             "catch_up": reads, "sse": sse,
             "idle_streams": {"count": s.idle_streams, "create_seconds": created,
                              "broker_json_bytes": state_size, "stream": asdict(crowded),
                              "native": asdict(crowded_native)},
             "load_average": {"before": load_before, "after": load_after}}
    return rows, notes, extra


DURABILITY = (
    "Durability is not the same on both sides. Our broker runs with its defaults (`--fsync "
    "always`): an append is answered after its group of appends is written and fsynced "
    "(group commit), and, for /v1/stream, after the catalog's changes (tails, producer "
    "state) are appended to its journal and fsynced with it. The reference server "
    "(@durable-streams/server 0.3.7, `FileBackedStreamStore`) also fsyncs per append: each "
    "append writes its frame, awaits `fdatasync` on the stream's file and only then commits "
    "the metadata to LMDB and answers; a per-stream lock holds each append through all of "
    "that, so appends to one stream get one `fdatasync` each, one after another (its "
    "coalescing of concurrent fsyncs cannot take effect under that lock). Its LMDB metadata "
    "commit (offsets, producer state) is not flushed before the answer (lmdb-js "
    "`overlappingSync`, its default on Linux, flushes after the commit); on start-up it "
    "reconciles offsets from the data files. Data is durable on both sides when an append is "
    "acknowledged; the reference server's idempotent-producer state may lag a crash.")


def main() -> None:
    p = settings.parser(__doc__, "smoke run (1 s runs, 10,000 messages, 2 s of SSE)")
    args = p.parse_args()
    s = settings.with_rounds(
        Settings(rounds=1, seconds=1.0, warmup=0.2, messages=10_000, reads=1, sse_seconds=2.0,
                 idle_streams=200) if args.quick else Settings(), args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-durable-streams-",
                                     dir=os.environ.get("BENCH_DIR")) as t:
        rows, notes, extra = run_loop(run(Path(t), s))
    runtime = time.perf_counter() - started
    results_under(args.out, quick=args.quick, bench="durable-streams")
    summary, details = notes.split("\n\n", 1)
    method = (
        f"Our broker (`messaging broker`, defaults, uvloop) and the Node reference server "
        f"(`node conformance/reference-server.mjs --data-dir D`, file-backed) run side by side "
        f"on 127.0.0.1, each in its own process; the load generator is this Python process "
        f"(aiohttp on uvloop) on the same 2 cores. Part 1: {CONNECTIONS} connections each "
        f"POSTing 100-byte bodies one after another for {s.seconds:.0f} s, {s.rounds} runs per "
        f"target interleaved after a {s.warmup:.0f}-s warm-up; one octet-stream stream per "
        f"target; producer runs use Producer-Id bench-<connection>, a new epoch per run, "
        f"Producer-Seq 0, 1, 2…; native: topic {NATIVE_TOPIC} (with producer headers: topic "
        f"{NATIVE_PRODUCER_TOPIC}). Part 2: {s.messages:,} JSON "
        f"strings of 100 bytes written as appends of 1,000 (a JSON array is flattened: one "
        f"message per element; the reference server stores each such append as one record, "
        f"ours as 1,000 messages), read from offset -1 following Stream-Next-Offset until "
        f"Stream-Up-To-Date, median of {s.reads} reads, every read checked message by message "
        f"after the clock stopped; native: the same {s.messages:,} messages as frames in topic "
        f"{CATCHUP_TOPIC}, one non-streaming GET from index 0 (126 bytes a message on the "
        f"wire); MB/s counts message data (10^6 bytes). Part 3: one reader (SSE: "
        f"`offset=now&live=sse` on a new text/plain stream; native: `streaming=true` on topic "
        f"{LATENCY_TOPIC}) while an open-loop publisher POSTs {s.sse_rate:,} messages/s for "
        f"{s.sse_seconds:.0f} s, each carrying its send time; latency is receive time − send "
        f"time in the same process. Part 4 runs last, on the same broker. A ratio is value ÷ "
        f"baseline: above 1 is better for rates, worse for latencies and CPU.")
    report("durable_streams", "Durable Streams: /v1/stream against native and the reference "
           "server", rows, command_line(),
           notes=f"{summary}\n\n{method}\n\n{DURABILITY}\n\n{details}\n\n"
                 f"Runtime {runtime:.0f} s.")
    add_to_json("durable_streams", {"figures": extra | {"runtime_seconds": runtime}})
    print(f"runtime {runtime:.0f} s")


if __name__ == "__main__":
    main()
