"""The intake lane beside the inline lane (``make bench-intake``): what etcd carries per payload
byte, the batch throughput of each, and the constants of a capacity model.

Every process on 127.0.0.1, sharing this machine's cores: 3 etcd members (the README's
settings), SeaweedFS (``weed mini``), and two clusters of 3 broker nodes on that one etcd, both
with ``--object-store`` on SeaweedFS (their rolled segments tier to it alike): the *inline*
cluster (``--intake-min-size 0``: every byte through etcd) and the *intake* cluster (the
default 64K threshold).
Both take the same load in turn, in A B B A order: SENDERS concurrent publishers of batches of
1,000 × 1 KiB messages (half random, half JSON events: zstd takes an inline entry to about
half),
spread over the three nodes. Per round: messages a second, the bytes etcd's members received
from clients (the sum of ``etcd_network_client_grpc_received_bytes_total``) per payload byte,
and the CPU of each group of processes.

Then the constants of the capacity model, each measured here: how many pointer-sized puts a
second this etcd takes (MAX_PUTS_IN_FLIGHT at once per writer, three writers, as three nodes
put), how many MB/s and PUTs a second SeaweedFS takes for intake-sized objects, and the broker
CPU per payload MB of the intake cluster (receiving, uploading, committing, fetching and
applying on three holders).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.harness.cluster_nodes import nodes_ready
from bench.harness.etcd_members import Etcd, etcd_cluster, etcd_healthy, wait_for_leader
from bench.harness.figures import Row
from bench.harness.loops import bounded_wait
from bench.harness.procs import Proc, broker, child_env
from bench.harness.publish_load import SENDERS, throughput, with_cpu
from bench.harness.results import add_to_json, command_line, report
from bench.harness.seaweedfs import BUCKET, SeaweedFS
from examples.generate_events import make_events
from messaging.log.etcd.writer import MAX_PUTS_IN_FLIGHT

MESSAGE = 1024
#: The issue's targets: etcd bytes per payload byte, and throughput against the inline lane.
ETCD_BYTES_TARGET = 0.02
THROUGHPUT_TARGET = 1.0
TOPIC = 1
#: What a pointer entry of one window is, about (the header and a pointer to one range).
POINTER_BYTES = 160
#: The capacity model's demand: 1 GiB/s of 1 KiB messages.
DEMAND = 1 << 30
#: etcd writes per intake object of one group: its ticket, the pointer, closing the
#: ticket, deleting it (each a revision).
ETCD_WRITES_PER_OBJECT = 4
#: Network crossings per payload byte over the cluster (R = 3): client to the receiving
#: node, up to the store, down to the two other holders, and the segment's tiering upload.
NIC_CROSSINGS = 5
#: An assumed NIC (not measurable on loopback): 10 Gbit/s.
NIC_BYTES = 10e9 / 8

_EVENTS = [json.dumps(e).encode() for e in make_events(4096, 60)]


def kib_event(k: int) -> bytes:
    """1 KiB: half random bytes, half JSON events (zstd takes an inline entry of them to
    about half, as measured on realistic 1 KiB messages)."""
    out = os.urandom(MESSAGE // 2)
    j = k
    while len(out) < MESSAGE:
        out += _EVENTS[j % len(_EVENTS)] + b"\n"
        j = j * 7 + 1
    return out[:MESSAGE]


@dataclass
class Lane:
    """One cluster of three nodes and what its rounds measured."""

    name: str
    procs: list[Proc] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    etcd_ratio: list[float] = field(default_factory=list)
    broker_cores: list[float] = field(default_factory=list)
    etcd_cores: list[float] = field(default_factory=list)
    store_cores: list[float] = field(default_factory=list)

    def pids(self) -> list[int | None]:
        return [p.pid for p in self.procs]


async def etcd_received(session: aiohttp.ClientSession, members: list[Etcd]) -> float:
    """Bytes every member received from clients since it started (its /metrics)."""
    total = 0.0
    for member in members:
        async with session.get(f"{member.client_url}/metrics") as resp:
            text = await resp.text()
        for line in text.splitlines():
            if line.startswith("etcd_network_client_grpc_received_bytes_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def start_lane(session: aiohttp.ClientSession, tmp: Path, members: list[Etcd],
                     lane: Lane, extra: list[str], env: dict[str, str]) -> None:
    await bounded_wait(lambda: etcd_healthy(session, members), 60, "etcd healthy", 0.2)
    for i in range(3):
        order = members[i:] + members[:i]
        proc, url = broker(tmp / f"{lane.name}{i}", "--etcd",
                           ",".join(m.client_url for m in order), "--cluster", lane.name,
                           *extra, log=tmp / f"{lane.name}{i}.log", env=env)
        lane.procs.append(proc)
        lane.urls.append(url)
    await bounded_wait(lambda: nodes_ready(session, lane.urls), 60, f"{lane.name} ready", 0.2)

    async def settled() -> bool:  # format 4; the intake cluster's lane open on every node
        for url in lane.urls:
            async with session.get(f"{url}/messaging/diagnostics") as resp:
                found = await resp.json()
            if found.get("entry_format") != 4 or (lane.name == "intake"
                                                   and not found.get("intake_open")):
                return False
        return True

    await bounded_wait(settled, 30, f"{lane.name} settled", 0.2)


async def measure(session: aiohttp.ClientSession, lane: Lane, members: list[Etcd],
                  weed: SeaweedFS, seconds: float) -> None:
    before = await etcd_received(session, members)
    started = time.perf_counter()
    rate, cpu = await with_cpu(
        {"brokers": lane.pids, "etcd": lambda: [m.pid for m in members],
         "store": lambda: [weed.process.pid if weed.process else None]},
        throughput(session, lane.urls, TOPIC, seconds, kib_event))
    wall = time.perf_counter() - started
    received = await etcd_received(session, members) - before
    payload = rate * wall * MESSAGE
    lane.rates.append(rate)
    lane.etcd_ratio.append(received / payload)
    lane.broker_cores.append(cpu.shares["brokers"])
    lane.etcd_cores.append(cpu.shares["etcd"])
    lane.store_cores.append(cpu.shares["store"])
    print(f"  {lane.name}: {rate:,.0f} msg/s ({rate * MESSAGE / 1e6:.1f} MB/s), etcd received "
          f"{received / payload:.4f} B per payload byte; {cpu.text()}", flush=True)


async def etcd_put_ceiling(members: list[Etcd], seconds: float) -> float:
    """Pointer-sized puts a second the etcd cluster takes from three writers with
    MAX_PUTS_IN_FLIGHT puts each in flight (as three nodes put)."""
    import grpc
    from aetcd import rpc

    value = os.urandom(POINTER_BYTES)
    count = 0
    deadline = time.perf_counter() + seconds

    async def writer(member: Etcd) -> None:
        nonlocal count
        async with grpc.aio.insecure_channel(member.client_url.removeprefix("http://")) as ch:
            stub = rpc.KVStub(ch)

            async def one() -> None:
                nonlocal count
                for _ in range(1_000_000):
                    if time.perf_counter() >= deadline:
                        return
                    await stub.Put(rpc.PutRequest(key=b"/bench/pointers", value=value),
                                   timeout=5)
                    count += 1
            await asyncio.gather(*(one() for _ in range(MAX_PUTS_IN_FLIGHT)))

    started = time.perf_counter()
    await asyncio.gather(*(writer(m) for m in members))
    return count / (time.perf_counter() - started)


async def store_put_ceiling(weed: SeaweedFS, size: int, seconds: float) -> tuple[float, float]:
    """PUTs a second and MB/s SeaweedFS takes for ``size``-byte objects, SENDERS at once
    (conditional, read back: as the intake uploads)."""
    from messaging.objects.s3 import S3Store
    from messaging.objects.s3_config import S3Settings

    os.environ.update(weed.broker_env())
    store = S3Store(BUCKET, f"ceiling-{os.getpid()}",
                    S3Settings(endpoint=weed.endpoint))
    data = os.urandom(size)
    count = 0
    deadline = time.perf_counter() + seconds

    async def sender(k: int) -> None:
        nonlocal count
        for n in range(1_000_000):
            if time.perf_counter() >= deadline:
                return
            await store.put_if_absent(f"intake/ceiling-{k}-{n:08d}", data[:-8] + n.to_bytes(8))
            count += 1

    started = time.perf_counter()
    await asyncio.gather(*(sender(k) for k in range(SENDERS)))
    wall = time.perf_counter() - started
    return count / wall, count * size / wall / 1e6


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-intake-") as scratch:
        tmp = Path(scratch)
        members = etcd_cluster(tmp)
        weed = SeaweedFS(tmp / "weed")
        inline, intake = Lane("inline"), Lane("intake")
        try:
            for member in members:
                member.start()
            await asyncio.to_thread(wait_for_leader, members)
            await asyncio.to_thread(weed.start)
            env = {**child_env(), **weed.broker_env()}
            async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0)) as session:
                # Both with the object store (segments tier to it alike); only the intake
                # lane differs.
                await start_lane(session, tmp, members, inline,
                                 ["--object-store", f"s3://{BUCKET}/inline-bench",
                                  "--s3-endpoint", weed.endpoint, "--intake-min-size", "0"],
                                 env)
                await start_lane(session, tmp, members, intake,
                                 ["--object-store", f"s3://{BUCKET}/intake-bench",
                                  "--s3-endpoint", weed.endpoint], env)
                for lane in (inline, intake):  # warm: topics made, connections open
                    await throughput(session, lane.urls, TOPIC, 1.0, kib_event)
                order = [inline, intake, intake, inline] * ((args.rounds + 1) // 2)
                for lane in order[:2 * args.rounds]:
                    await measure(session, lane, members, weed, args.seconds)
                diagnostics = []
                for url in intake.urls:
                    async with session.get(f"{url}/messaging/diagnostics") as resp:
                        diagnostics.append((await resp.json())["intake"])
                puts = await etcd_put_ceiling(members, 3.0)
                print(f"  etcd: {puts:,.0f} pointer-sized puts/s", flush=True)
                store_puts, store_mb = await store_put_ceiling(weed, 1 << 20, 3.0)
                print(f"  SeaweedFS: {store_puts:,.0f} PUTs/s of 1 MiB, {store_mb:,.0f} MB/s",
                      flush=True)
        finally:
            for proc in inline.procs + intake.procs:
                proc.stop()
            weed.stop()
            for member in members:
                member.stop()
    record(inline, intake, diagnostics, puts, store_puts, store_mb, args)


def record(inline: Lane, intake: Lane, diagnostics: list[dict[str, Any]], puts: float,
           store_puts: float, store_mb: float, args: argparse.Namespace) -> None:
    med = statistics.median
    ratio_intake, ratio_inline = med(intake.etcd_ratio), med(inline.etcd_ratio)
    rate_intake, rate_inline = med(intake.rates), med(inline.rates)
    mb_intake = rate_intake * MESSAGE / 1e6
    cpu_per_mb = med(intake.broker_cores) / mb_intake  # broker cores per payload MB/s
    objects = sum(d["objects_written"] for d in diagnostics)
    rows = [
        Row("etcd bytes received per KiB of payload, intake lane (1,000 × 1 KiB batches)",
            ratio_intake * 1024, "B", "inline lane", ratio_inline * 1024,
            f"≤ {ETCD_BYTES_TARGET * 1024:.1f} (0.02 per byte)",
            ratio_intake <= ETCD_BYTES_TARGET),
        Row("cluster batch throughput, intake lane", rate_intake, "msg/s", "inline lane",
            rate_inline, f"≥ {THROUGHPUT_TARGET:g}x inline",
            rate_intake >= THROUGHPUT_TARGET * rate_inline),
        Row("broker cores per payload MB/s, intake lane (3 nodes)", cpu_per_mb, "cores",
            "inline lane", med(inline.broker_cores) / (rate_inline * MESSAGE / 1e6)),
        Row("etcd cores, intake lane", med(intake.etcd_cores), "cores", "inline lane",
            med(inline.etcd_cores)),
        Row("pointer-sized puts etcd takes (3 writers × 8 in flight)", puts, "puts/s"),
        Row("SeaweedFS conditional PUTs of 1 MiB, 4 at once", store_puts, "PUT/s"),
        Row("SeaweedFS upload rate, 1 MiB objects", store_mb, "MB/s"),
    ]
    # The capacity model (bench/RESULTS.md explains it): every constant above.
    gib_mb = DEMAND / 1e6
    object_bytes = sum(d["bytes_written"] for d in diagnostics) / max(objects, 1)
    objects_for_gib = DEMAND / object_bytes
    model = {
        "pointer_puts_per_second_one_etcd": round(puts),
        "mean_object_bytes": round(object_bytes),
        "etcd_writes_per_object": ETCD_WRITES_PER_OBJECT,
        "objects_per_second_for_1_gib_s": round(objects_for_gib),
        "etcd_writes_per_second_for_1_gib_s": round(objects_for_gib * ETCD_WRITES_PER_OBJECT),
        "gib_s_one_etcd_carries": round(puts / ETCD_WRITES_PER_OBJECT * object_bytes / DEMAND,
                                        1),
        "broker_cores_per_payload_mb_s": round(cpu_per_mb, 4),
        "broker_cores_for_1_gib_s": round(cpu_per_mb * gib_mb, 1),
        "store_puts_per_second_for_1_gib_s_at_8_mib": round(DEMAND / (8 << 20)),
        "store_mb_s_one_seaweedfs_here": round(store_mb),
        "nic_crossings_per_payload_byte": NIC_CROSSINGS,
        "objects_written": objects,
    }
    notes = capacity_notes(model, rate_intake, rate_inline, ratio_intake, ratio_inline,
                           med(intake.broker_cores), med(inline.broker_cores), args)
    notes += cost_notes(inline, intake)
    report("intake", "Payload out of consensus: the intake lane beside the inline lane", rows,
           command_line(), notes)
    add_to_json("intake", {"model": model, "lanes": {
        lane.name: {"rates": lane.rates, "etcd_ratio": lane.etcd_ratio,
                    "broker_cores": lane.broker_cores, "etcd_cores": lane.etcd_cores,
                    "store_cores": lane.store_cores} for lane in (inline, intake)}})


def cost_notes(inline: Lane, intake: Lane) -> str:
    """Where each lane's CPU goes, per payload MB (medians over the rounds)."""
    def per_mb(lane: Lane, cores: list[float]) -> float:
        return 1000 * statistics.median(c / (r * MESSAGE / 1e6)
                                        for c, r in zip(cores, lane.rates, strict=True))

    parts = {lane.name: {what: per_mb(lane, cores) for what, cores in (
        ("brokers", lane.broker_cores), ("etcd", lane.etcd_cores),
        ("the store", lane.store_cores))} for lane in (inline, intake)}
    text = "; ".join(f"{name}: " + ", ".join(f"{what} {ms:.1f}" for what, ms in costs.items())
                     + f" (all {sum(costs.values()):.1f})" for name, costs in parts.items())
    return f"""
**Where the CPU goes** (ms of CPU per payload MB, medians; the store's includes both
clusters' tiering uploads, and SeaweedFS idling): {text}. The intake lane moves etcd's
work to the store: every payload byte is uploaded once and fetched by the two other
holders instead of passing through three etcd members and three watches. On this machine
the store shares the same two cores and spends more per byte than etcd did, so the two
lanes' throughputs are close and the intake lane's is lower in most rounds; with the store
elsewhere (S3), its share leaves the brokers' machines.
"""


def capacity_notes(model: dict[str, Any], rate_intake: float, rate_inline: float,
                   ratio_intake: float, ratio_inline: float, cores_intake: float,
                   cores_inline: float, args: argparse.Namespace) -> str:
    return f"""
3 etcd members, SeaweedFS and two clusters of 3 broker nodes on 127.0.0.1 (one etcd for
both), {args.rounds} round(s) of {args.seconds:g} s per lane in A B B A order, medians;
{SENDERS} senders of 1,000 × 1 KiB batches (half random bytes, half JSON events) spread over
each cluster's nodes.

**What etcd carries.** Inline, etcd received {ratio_inline:.3f} bytes per payload byte (zstd
on the entry); through the intake lane {ratio_intake:.4f}: a pointer entry of about
{POINTER_BYTES} bytes per log per object, the ticket, and the quorum reads and lease
renewals every node makes anyway. Inline the cluster took {rate_inline:,.0f} msg/s with its
brokers using {cores_inline:.2f} cores; through the intake lane {rate_intake:,.0f} msg/s
with {cores_intake:.2f} cores.

**Capacity model (1 GiB/s of 1 KiB messages, three copies of each group).** Each constant
is this run's unless said otherwise:
- **etcd**: one etcd cluster (3 members, on this machine) took
  {model['pointer_puts_per_second_one_etcd']:,} pointer-sized puts a second. An intake
  object of one group costs etcd {ETCD_WRITES_PER_OBJECT} writes (its ticket, the pointer,
  the ticket closed, the ticket deleted); this run's objects held
  {model['mean_object_bytes'] / 1e6:.2f} MB on average, so 1 GiB/s is
  {model['objects_per_second_for_1_gib_s']:,} objects and
  {model['etcd_writes_per_second_for_1_gib_s']:,} etcd writes a second: one etcd cluster
  carries about {model['gib_s_one_etcd_carries']} GiB/s in pointers, and full 8 MiB windows
  carry eight times more per write. etcd stops being the bottleneck: one small etcd cluster
  is enough (Bufstream runs 1 GiB/s on 3 small etcd nodes).
- **The store**: at 8 MiB objects 1 GiB/s is
  {model['store_puts_per_second_for_1_gib_s_at_8_mib']} PUTs a second for the whole cluster
  (S3 takes thousands a second per prefix) and twice that in GETs; one SeaweedFS on this
  machine took {model['store_mb_s_one_seaweedfs_here']} MB/s of 1 MiB uploads.
- **The brokers**: they spent {model['broker_cores_per_payload_mb_s']:.4f} cores per payload
  MB/s (receiving, uploading, committing; on each of three holders fetching and applying;
  tiering), so 1 GiB/s needs about {model['broker_cores_for_1_gib_s']:,} cores of this
  machine's kind. A node is one Python process, about one core under its GIL, so that is
  about {model['broker_cores_for_1_gib_s']:.0f} broker processes (Bufstream: 6 brokers of
  many cores each): the holders' CPU is the next bottleneck.
- **The network** (assumed, not measured on loopback: 10 Gbit/s NICs): each payload byte
  crosses {NIC_CROSSINGS} NICs over the cluster (in from the client, up to the store, down
  to the two other holders, up again as a tiered segment), {NIC_CROSSINGS} GiB/s for 1 GiB/s:
  at least {NIC_CROSSINGS * DEMAND / NIC_BYTES:.1f} machines' NICs, fewer than the cores
  need.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per lane, in A B B A order (default 3)")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="seconds of load per lane per round (default 8)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
