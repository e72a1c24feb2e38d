"""The topic-groups benchmark's figures: one configuration's measurement (:class:`Measured`),
the table printed as the run goes, the capacity model fitted to the measured constants, the
plot, ``results/groups.json`` and the "Topic groups" section of RESULTS.md."""

from __future__ import annotations

import datetime
import os
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.groups.cluster import Config
from bench.groups.load import (
    BATCH,
    MESSAGE,
    SENDERS,
    SINGLES_EVERY,
    CpuWindow,
    Tally,
)
from bench.harness import results
from bench.harness.figures import Row
from bench.harness.plots import plt
from bench.harness.results import add_to_json, report, source_state
from messaging.placement import holders as rendezvous

US = 1e6


@dataclass
class Measured:
    """One configuration's measured load (its rounds added up) and what each node applied."""

    config: Config
    nodes: list[str]
    tally: Tally
    cpu: CpuWindow
    applied_groups: dict[str, dict[int, int]]  # node → group → messages applied
    puts_groups: dict[str, dict[int, int]]  # node → group → puts it made to etcd
    held: dict[str, list[int]]
    holders: dict[int, list[str]]
    placement_moved: bool = False
    log_errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    round_rates: list[float] = field(default_factory=list)
    idle: CpuWindow | None = None  # the settled cluster without load
    etcd_writes: dict[str, int] = field(default_factory=dict)  # etcd revisions in the window

    def add(self, other: Measured) -> None:
        """Add another round of the same configuration."""
        self.tally.add(other.tally)
        self.cpu.add(other.cpu)
        for mine, theirs in ((self.applied_groups, other.applied_groups),
                             (self.puts_groups, other.puts_groups)):
            for url, groups in theirs.items():
                for g, n in groups.items():
                    mine.setdefault(url, {})[g] = mine.get(url, {}).get(g, 0) + n
        self.placement_moved |= other.placement_moved or other.held != self.held
        self.log_errors += [e for e in other.log_errors if e not in self.log_errors]
        self.wall += other.wall
        self.round_rates += other.round_rates
        if self.idle is not None and other.idle is not None:
            self.idle.add(other.idle)
        for cluster, n in other.etcd_writes.items():
            self.etcd_writes[cluster] = self.etcd_writes.get(cluster, 0) + n

    def idle_cores(self, prefix: str) -> float:
        """Cores the processes named ``prefix``… used while the cluster was idle."""
        if self.idle is None or not self.idle.seconds:
            return 0.0
        return sum(v for k, v in self.idle.processes.items()
                   if k.startswith(prefix)) / self.idle.seconds

    @property
    def stacks(self) -> int:
        """Held groups summed over the nodes (each a command log, watch and broker)."""
        return sum(len(groups) for groups in self.held.values())

    @property
    def applied(self) -> dict[str, int]:
        """Per node, the messages it applied (summed over the groups it holds)."""
        return {u: sum(self.applied_groups.get(u, {}).values()) for u in self.nodes}

    @property
    def per_group(self) -> dict[int, int]:
        """Per group, its messages (all its holders applied the same: the largest count)."""
        totals: dict[int, int] = {}
        for groups in self.applied_groups.values():
            for g, n in groups.items():
                totals[g] = max(totals.get(g, 0), n)
        return totals

    @property
    def puts(self) -> int:
        return sum(n for groups in self.puts_groups.values() for n in groups.values())

    @property
    def published(self) -> int:
        """Messages the cluster stored in the measured windows (each group counted once)."""
        return sum(self.per_group.values())

    @property
    def rate(self) -> float:
        return self.tally.rate

    def fraction(self, url: str) -> float:
        return self.applied[url] / self.published if self.published else 0.0

    @property
    def busiest(self) -> float:
        return max(self.fraction(u) for u in self.nodes)

    @property
    def share(self) -> float:
        """R/N: the fraction of the messages each node applies when the groups are spread
        evenly (1 with one group: every node applies everything)."""
        return self.config.holders_per_group(len(self.nodes)) / len(self.nodes)

    def us(self, cpu_seconds: float) -> float:
        """CPU µs per acknowledged message."""
        return cpu_seconds / self.tally.messages * US if self.tally.messages else 0.0

    def cpu_of(self, prefix: str) -> float:
        return sum(v for k, v in self.cpu.processes.items() if k.startswith(prefix))

    def etcd_clusters(self) -> dict[str, list[str]]:
        """Each etcd cluster's member process names ("a", "b")."""
        out: dict[str, list[str]] = {}
        for name in self.cpu.processes:
            if name.startswith("etcd-"):
                out.setdefault(name[5], []).append(name)
        return out

    def in_cluster(self, group: int, cluster: str) -> bool:
        return (group in self.config.second_etcd) == (cluster == "b")

    def cluster_messages(self, cluster: str) -> int:
        """Messages whose group's log is in etcd cluster ``cluster``."""
        return sum(n for g, n in self.per_group.items() if self.in_cluster(g, cluster))

    def cluster_puts(self, cluster: str) -> int:
        """Puts the nodes made to etcd cluster ``cluster``."""
        return sum(n for groups in self.puts_groups.values() for g, n in groups.items()
                   if self.in_cluster(g, cluster))

    def etcd_member_us(self) -> dict[str, float]:
        """Each etcd member's CPU µs per message of its own cluster."""
        out = {}
        for cluster, names in self.etcd_clusters().items():
            messages = self.cluster_messages(cluster)
            for name in names:
                out[name] = self.cpu.processes[name] / messages * US if messages else 0.0
        return out

    def etcd_put_us(self, cluster: str) -> float:
        """CPU µs of all of ``cluster``'s members per put to it."""
        puts = self.cluster_puts(cluster)
        names = self.etcd_clusters().get(cluster, [])
        return sum(self.cpu.processes[n] for n in names) / puts * US if puts else 0.0

    def http_messages(self, url: str) -> int:
        """Messages that went through ``url``'s HTTP layer: sent to it by the load generator,
        or forwarded to it by another node."""
        return self.tally.entry[url] + self.tally.forwarded_in[url]

    def check(self) -> str:
        """Whether the counts add up: each group applied by all its holders alike, and the
        messages stored equal the messages acknowledged."""
        applied = self.applied
        expected = sum(n * len(self.holders.get(g, [])) for g, n in self.per_group.items())
        acked = self.tally.messages
        parts = [f"Σ applied {sum(applied.values()):,} "
                 f"{'=' if sum(applied.values()) == expected else '≠'} Σ group × holders "
                 f"{expected:,}",
                 f"stored {self.published:,} {'=' if self.published == acked else '≠'} "
                 f"acknowledged {acked:,}"]
        if self.placement_moved:
            parts.append("PLACEMENT CHANGED during the run")
        return "; ".join(parts)

    def summary(self) -> dict[str, Any]:
        """What goes to results/groups.json."""
        t = self.tally
        applied = self.applied
        return {
            "config": self.config.name, "groups": self.config.groups,
            "replicas": self.config.holders_per_group(len(self.nodes)),
            "etcd_clusters": self.config.etcd_clusters,
            "second_etcd_groups": list(self.config.second_etcd),
            "to_holders": self.config.to_holders,
            "msg_per_s": self.rate, "round_msg_per_s": self.round_rates,
            "seconds": t.seconds, "acknowledged": t.messages,
            "batch_messages": t.batch_messages, "single_messages": t.single_messages,
            "requests": t.requests, "forwarded_messages": t.forwarded,
            "errors": dict(t.errors),
            "batch_p50_ms": _pct(t.batch_latencies, 50),
            "batch_p99_ms": _pct(t.batch_latencies, 99),
            "single_p50_ms": _pct(t.single_latencies, 50),
            "single_p99_ms": _pct(t.single_latencies, 99),
            "per_second": t.per_second, "stored": self.published, "puts": self.puts,
            "per_group": {str(g): n for g, n in sorted(self.per_group.items())},
            "holders": {str(g): h for g, h in sorted(self.holders.items())},
            "nodes": {f"node{i}": {"url": u, "held": sorted(self.held[u]),
                                   "applied": applied[u],
                                   "applied_fraction": self.fraction(u),
                                   "puts": sum(self.puts_groups.get(u, {}).values()),
                                   "sent_to": t.entry[u], "served": t.served[u],
                                   "forwarded_in": t.forwarded_in[u],
                                   "cpu_s": self.cpu.processes[f"node{i}"],
                                   "cpu_us_per_msg": self.us(self.cpu.processes[f"node{i}"])}
                      for i, u in enumerate(self.nodes)},
            "etcd": {name: {"cpu_s": self.cpu.processes[name], "cpu_us_per_msg_of_cluster": us}
                     for name, us in self.etcd_member_us().items()},
            "etcd_us_per_put": {c: self.etcd_put_us(c) for c in self.etcd_clusters()},
            "cpu_us_per_msg": {"brokers": self.us(self.cpu_of("node")),
                               "etcd": self.us(self.cpu_of("etcd-")),
                               "load_generator": self.us(self.cpu.load_generator),
                               "machine": self.us(self.cpu.machine),
                               "interrupts": self.us(self.cpu.kernel),
                               "others": self.us(self.cpu.others)},
            "machine_cores_busy": self.cpu.machine / self.cpu.seconds,
            "other_cores": self.cpu.others / self.cpu.seconds,
            "idle_cores": {"brokers": self.idle_cores("node"), "etcd": self.idle_cores("etcd-")},
            "etcd_writes": self.etcd_writes, "held_groups_total": self.stacks,
            "check": self.check(), "log_errors": self.log_errors, "wall_s": self.wall,
        }


def held_text(m: Measured) -> str:
    """Which groups each node held."""
    return ", ".join(f"node{i} {sorted(m.held[u])}" for i, u in enumerate(m.nodes))


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * 1000


# -- the table ---------------------------------------------------------------------------------

COLUMNS = ("config", "msg/s", "× G=1", "fwd", "msg/put", "brokers µs/msg (per node)",
           "etcd µs/msg (busiest member)", "load gen µs/msg", "other processes, cores",
           "applied/published per node", "busiest", "R/N")


def table_header() -> str:
    """The table's Markdown header."""
    return "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)


def row_text(m: Measured, base: Measured | None) -> str:
    """One configuration as a Markdown table row."""
    ratio = f"{m.rate / base.rate:.2f}×" if base is not None and base.rate else "-"
    fwd = m.tally.forwarded / m.tally.messages if m.tally.messages else 0.0
    per_put = m.published / m.puts if m.puts else 0.0
    per_node = " ".join(f"{m.us(m.cpu.processes[f'node{i}']):.0f}" for i in range(len(m.nodes)))
    members = m.etcd_member_us()
    busiest_member = max(members.values(), default=0.0)
    fractions = " ".join(f"{m.fraction(u):.2f}" for u in m.nodes)
    return (f"| {m.config.label} | {m.rate:,.0f} | {ratio} | {fwd:.0%} | {per_put:,.0f} | "
            f"{m.us(m.cpu_of('node')):.0f} ({per_node}) | {m.us(m.cpu_of('etcd-')):.0f} "
            f"({busiest_member:.0f}) | {m.us(m.cpu.load_generator):.0f} | "
            f"{m.cpu.others / m.cpu.seconds:.2f} | {fractions} | {m.busiest:.2f} | "
            f"{m.share:.2f} |")


def extras(m: Measured) -> str:
    """What else a configuration found: the checks, latencies, the machine, errors."""
    parts = [m.check(), m.tally.latency_text(),
             f"{m.cpu.machine / m.cpu.seconds:.2f} of {os.cpu_count()} cores busy "
             f"({m.cpu.kernel / m.cpu.seconds:.2f} in interrupts and softirqs)",
             f"rounds {', '.join(f'{r:,.0f}' for r in m.round_rates)} msg/s",
             f"idle cluster: brokers {m.idle_cores('node'):.2f} cores, etcd "
             f"{m.idle_cores('etcd-'):.2f} cores ({m.stacks} held groups)",
             f"etcd writes {sum(m.etcd_writes.values()):,} for {m.puts:,} log puts",
             f"groups held: {held_text(m)}"]
    if m.tally.errors:
        parts.append(f"errors {dict(m.tally.errors)}")
    if m.log_errors:
        parts.append(f"log errors: {m.log_errors}")
    return "; ".join(parts)


def print_row(m: Measured, base: Measured | None) -> None:
    """Print one configuration's row, and what else it found."""
    print(row_text(m, base), flush=True)
    print(f"    {extras(m)}; {m.wall:.0f} s", flush=True)


# -- the model ---------------------------------------------------------------------------------

@dataclass
class Fit:
    """Broker CPU of a node under load, beyond what it used idle = a·applied + p·revisions
    applied + h·HTTP messages, fitted by least squares (a coefficient that comes out negative
    is dropped, and the rest fitted again)."""

    apply_us: float
    revision_us: float
    http_us: float
    r2: float
    points: int
    dropped: list[str] = field(default_factory=list)


def revisions_applied(m: Measured, url: str) -> int:
    """Revisions (puts, by any node) of the groups ``url`` holds: each is a watch event it
    decodes and applies."""
    per_group: dict[int, int] = {}
    for groups in m.puts_groups.values():
        for g, n in groups.items():
            per_group[g] = per_group.get(g, 0) + n
    return sum(per_group.get(g, 0) for g in m.held[url])


def fit_brokers(rounds: list[Measured]) -> Fit:
    """Least squares over every node of every round of every configuration."""
    names = ["apply", "revision", "http"]
    xs, ys = [], []
    for m in rounds:
        for i, u in enumerate(m.nodes):
            idle = (m.idle.processes[f"node{i}"] / m.idle.seconds
                    if m.idle is not None and m.idle.seconds else 0.0)
            xs.append([m.applied[u], revisions_applied(m, u), m.http_messages(u)])
            ys.append(m.cpu.processes[f"node{i}"] - idle * m.cpu.seconds)
    full, y = np.array(xs, dtype=float), np.array(ys, dtype=float)
    keep = list(range(len(names)))
    coef = np.zeros(len(names))
    for _ in range(len(names)):
        found, *_ = np.linalg.lstsq(full[:, keep], y, rcond=None)
        coef = np.zeros(len(names))
        coef[keep] = found
        negative = [k for k in keep if coef[k] < 0]
        if not negative:
            break
        keep.remove(min(negative, key=lambda k: coef[k]))
    predicted = full @ coef
    total = float(((y - y.mean()) ** 2).sum()) or 1.0
    r2 = 1.0 - float(((y - predicted) ** 2).sum()) / total
    return Fit(float(coef[0]) * US, float(coef[1]) * US, float(coef[2]) * US, r2, len(ys),
               [n for k, n in enumerate(names) if k not in keep])


def busiest_by_chance(groups: int, nodes: int, replicas: int, trials: int = 400,
                      seed: int = 1) -> tuple[float, float]:
    """Median and 90th percentile, over random node URLs, of the busiest node's share of the
    groups (equally busy groups, rendezvous placement as the brokers do it)."""
    rng = random.Random(seed)
    shares = []
    for _ in range(trials):
        urls = [f"http://10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
                f":8080" for _ in range(nodes)]
        held = dict.fromkeys(urls, 0)
        for g in range(groups):
            for u in rendezvous(g, urls, replicas, groups):
                held[u] += 1
        shares.append(max(held.values()) / groups)
    ordered = sorted(shares)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


@dataclass
class Model:
    """The measured constants and the capacity they give."""

    fit: Fit
    per_put: float  # messages per etcd put
    etcd_sum_us: float  # all members of one cluster, per message of that cluster
    etcd_max_us: float  # its busiest member
    etcd_put_us: float  # all members of one cluster, per put
    etcd_from: str
    unevenness: float  # busiest node's fraction / (R/N) at the largest G measured
    uneven_from: str
    nodes: int
    replicas: int
    groups: int  # of the configuration the constants come from
    stack_cores: float  # broker CPU per held group, idle
    etcd_stack_cores: float  # etcd CPU per group, idle
    idle_seconds: float

    @property
    def holder_us(self) -> float:
        """Broker CPU a holder spends per message of a group it holds: a + p/m."""
        return self.fit.apply_us + (self.fit.revision_us / self.per_put if self.per_put else 0.0)

    def node_us(self, n: int, r: int, u: float | None = None) -> float:
        """Broker CPU one of n nodes spends per message of the whole cluster."""
        u = self.unevenness if u is None else u
        return (r * u * self.holder_us + self.fit.http_us * (2 - r / n)) / n

    def brokers(self, n: int, r: int, u: float | None = None, g: int | None = None) -> float:
        """msg/s that n broker nodes (one core each) carry with g groups."""
        g = self.groups if g is None else g
        free = 1.0 - self.stack_cores * g * min(r, n) / n
        per = self.node_us(n, r, u)
        return max(0.0, free) * US / per if per > 0 else float("inf")

    def etcd(self, m: int, cores: float = 1.0) -> float:
        """msg/s that m etcd clusters carry when their busiest member has ``cores`` cores."""
        return m * cores * US / self.etcd_max_us if self.etcd_max_us > 0 else float("inf")

    def group(self) -> float:
        """msg/s one group can take: each of its holders applies all of it and serves 1/R of
        its requests (clients sending to holders) on one event loop."""
        per = self.holder_us + self.fit.http_us / self.replicas
        return US / per if per > 0 else float("inf")

    def per_node(self, n: int, r: int, direct: bool = False) -> float:
        """msg/s of cluster throughput each broker node adds (u = 1, idle cost aside);
        ``direct``: clients send to a holder, nothing is forwarded."""
        passes = 1.0 if direct else 2 - r / n
        per = r * self.holder_us + self.fit.http_us * passes
        return US / per if per > 0 else float("inf")

    def predicted_us(self, m: Measured) -> float:
        """The brokers' CPU µs per message this model gives for a measured configuration."""
        if not m.tally.messages:
            return 0.0
        total = 0.0
        for i, u in enumerate(m.nodes):
            idle = (m.idle.processes[f"node{i}"] / m.idle.seconds
                    if m.idle is not None and m.idle.seconds else 0.0)
            total += (self.fit.apply_us * m.applied[u] + self.fit.revision_us
                      * revisions_applied(m, u) + self.fit.http_us * m.http_messages(u)) / US
            total += idle * m.cpu.seconds
        return total / m.tally.messages * US


def build_model(measured: list[Measured], rounds: list[Measured]) -> Model:
    """The constants: the broker fit over every round; etcd, messages per put, placement and
    the idle cost per group from the configuration with the most groups on one etcd cluster
    (the idle cost as its difference from G = 1, per group added)."""
    fit = fit_brokers(rounds)
    spread = [m for m in measured if m.config.groups > 1 and m.config.etcd_clusters == 1
              and not m.config.to_holders]
    widest = spread[-1] if spread else measured[-1]
    base = next((m for m in measured if m.config.groups == 1), None)
    members = widest.etcd_member_us()
    a_members = [v for k, v in members.items() if k.startswith("etcd-a")]
    if base is not None and widest.stacks > base.stacks:
        stack = (widest.idle_cores("node") - base.idle_cores("node")) / (
            widest.stacks - base.stacks)
        etcd_stack = (widest.idle_cores("etcd-") - base.idle_cores("etcd-")) / (
            widest.config.groups - 1)
    else:
        stack = widest.idle_cores("node") / max(1, widest.stacks)
        etcd_stack = widest.idle_cores("etcd-") / widest.config.groups
    idle_seconds = widest.idle.seconds if widest.idle is not None else 0.0
    return Model(fit, widest.published / widest.puts if widest.puts else 0.0,
                 sum(a_members), max(a_members, default=0.0), widest.etcd_put_us("a"),
                 widest.config.label, widest.busiest / widest.share if widest.share else 1.0,
                 widest.config.label, len(widest.nodes),
                 widest.config.holders_per_group(len(widest.nodes)), widest.config.groups,
                 max(0.0, stack), max(0.0, etcd_stack), idle_seconds)


def model_text(model: Model, measured: list[Measured]) -> str:
    """The capacity model in Markdown: the constants, the formula, examples, the bottleneck."""
    f, n, r = model.fit, model.nodes, model.replicas
    chance = {g: busiest_by_chance(g, n, r) for g in (4, 8, 16, 32, 64, 256)}
    ideal = r / n
    sizes = (4, 8, 16, 32)
    grid = [[min(model.brokers(nn, r, 1.0, 2 * nn), model.etcd(mm)) for mm in (1, 2, 4)]
            for nn in sizes]
    table = "\n".join(
        ["| broker nodes ↓, etcd clusters → | M = 1 | M = 2 | M = 4 |", "|---|---|---|---|"]
        + [f"| N = {nn} (G = {2 * nn}) | " + " | ".join(f"{v:,.0f}" for v in row) + " |"
           for nn, row in zip(sizes, grid, strict=True)])
    one = next((nn for nn in range(2, 4097)
                if model.brokers(nn, r, 1.0, 2 * nn) >= model.etcd(1)), None)
    apply_part = r * model.holder_us
    http_part = f.http_us * (2 - ideal)
    both = [m for m in measured if m.config.groups == 8 and not m.config.to_holders]
    two = (f"With 2 etcd clusters (G = 8, odd groups on the second) the etcd work per message "
           f"is split: {_etcd_split(both)}. " if len(both) == 2 else "")
    anywhere = next((m for m in both if m.config.etcd_clusters == 1), None)
    direct = next((m for m in measured if m.config.to_holders), None)
    forwarding = ""
    if anywhere is not None and direct is not None:
        forwarding = (
            f"Measured: at G = {anywhere.config.groups} with requests sent to any node "
            f"({anywhere.tally.forwarded / max(1, anywhere.tally.messages):.0%} forwarded) the "
            f"brokers used {anywhere.us(anywhere.cpu_of('node')):.0f} µs per message and the "
            f"cluster took {anywhere.rate:,.0f} msg/s; sent to a holder "
            f"({direct.tally.forwarded / max(1, direct.tally.messages):.0%} forwarded), "
            f"{direct.us(direct.cpu_of('node')):.0f} µs and {direct.rate:,.0f} msg/s. ")
    dropped = (f" ({', '.join(f.dropped)} came out negative and was left out)"
               if f.dropped else "")
    g1 = US / (model.holder_us + f.http_us / n) if model.holder_us + f.http_us else 0.0
    per_node_groups = model.groups * r / n
    return "\n".join([
        "**Constants** (measured in this run):",
        "",
        f"- `a` = {f.apply_us:.1f} µs of broker CPU per message applied (a holder's share: "
        "decoding it from the watch, writing it to its topic);",
        f"- `p` = {f.revision_us:.0f} µs of broker CPU per revision a holder applies (one watch "
        "event: one put of some node, decoded and applied as a batch, fsynced; the fit also "
        "puts here what the put cost the holder that made it, as puts go with revisions);",
        f"- `h` = {f.http_us:.1f} µs of broker CPU per message through a node's HTTP layer "
        "(the request from a client, the put to etcd, the answer; a forwarded request passes "
        "two nodes' HTTP layers);",
        f"- `a`, `p`, `h` fitted as `cpu(node) − idle(node) = a·applied + p·revisions applied "
        f"+ h·http` by least squares over the {f.points} (round, configuration, node) "
        f"points of this run, R² {f.r2:.2f}{dropped}: http(node) counts what the load "
        "generator sent it plus what other nodes forwarded to it (X-Messaging-Node), revisions "
        "applied are the puts (every node's writer's count, in diagnostics) of the groups it "
        "holds, idle(node) its CPU on the settled cluster without load;",
        f"- `s` = {model.stack_cores * 1000:.1f} millicores of broker CPU per held group "
        "without load (each held group's log: lease, registration, placement, quorum checks, "
        f"checkpoints) and {model.etcd_stack_cores * 1000:.1f} millicores of etcd's per group: "
        f"idle CPU at {model.etcd_from} less G=1's, per group added, over "
        f"{model.idle_seconds:.0f} s;",
        f"- `m` = {model.per_put:.0f} messages per etcd put at {model.etcd_from} (batches of "
        "100 plus single publishes; each node's writer puts per group, so more groups mean "
        "smaller puts);",
        f"- `e_max` = {model.etcd_max_us:.1f} µs of CPU of one etcd cluster's busiest member "
        f"(its leader) per message of that cluster, `e` = {model.etcd_sum_us:.1f} µs summed over "
        f"its 3 members ({model.etcd_put_us:,.0f} µs per put), at {model.etcd_from};",
        f"- `u` = {model.unevenness:.2f}: the busiest node's applied fraction over R/N at "
        f"{model.uneven_from} (`messaging.placement` over these {n} node URLs). Over random "
        "URLs the busiest node's share of equally busy groups is (median / 90th percentile) "
        + ", ".join(f"G = {g}: {a:.2f} / {b:.2f}" for g, (a, b) in chance.items())
        + f", against the even {ideal:.2f}.",
        "",
        "**Capacity** in messages/s, for N broker machines (each broker one event loop: about "
        "one core), G groups (G·R ≥ N) and M etcd clusters of 3 members with the groups spread "
        "evenly over them; clients send each request to any node, so a message crosses HTTP "
        "`2 − R/N` times on average:",
        "",
        "```",
        "one node, per message of the cluster:  c(N) = (R·u·(a + p/m) + h·(2 − R/N)) / N  µs",
        "brokers:    X_b(N, G) = (1 − s·G·R/N) · 1e6 / c(N)",
        "etcd:       X_e(M)    = M · c_e · 1e6 / e_max     (c_e: cores of each cluster's leader)",
        "one group:  X_g       = 1e6 / (a + p/m + h/R)      (each holder applies all of it)",
        "X(N, M, G) = min(X_b(N, G), X_e(M), G · X_g)",
        "```",
        "",
        f"With these constants a holder spends a + p/m = {model.holder_us:.1f} µs per message "
        "of the groups it holds"
        + (f" — almost all of it per revision, not per message (a = {f.apply_us:.1f} µs): a put "
           "of m messages is applied as one batch, so bigger puts are cheaper per message"
           if f.apply_us < 0.25 * model.holder_us else "")
        + f". **Per node**: each broker node adds 1e6 / (R·(a + p/m) + h·(2 − R/N)) = "
        f"{model.per_node(n, r):,.0f} msg/s (N = {n}, clients sending to any node; "
        f"{model.per_node(n, r, True):,.0f} when they send to a holder), less its idle cost "
        f"s per held group ({per_node_groups:.0f} groups per node here: "
        f"{model.stack_cores * per_node_groups:.2f} cores). **Per group**: X_g = 1e6 / "
        f"(a + p/m + h/R) = {model.group():,.0f} msg/s (a holder applies all of its group and "
        f"serves 1/R of its requests). **Per etcd cluster**: X_e(1) = {model.etcd(1):,.0f} "
        f"msg/s per core of its leader: {US / (model.etcd_max_us * model.per_put):,.0f} puts/s "
        f"of m = {model.per_put:.0f} messages. With one group (every node applies everything, "
        f"R = N) the brokers stop near 1e6 / (a + p/m + h/N) = {g1:,.0f} msg/s however many "
        "nodes there are; groups lift that towards N/R-fold. min(X_b, X_e) with u = 1, "
        "G = 2N (each node holds 4 groups) and one core per etcd leader:",
        "",
        table,
        "",
        (f"So one etcd cluster (one core for its leader) is the bound from N = {one} broker "
         "nodes on; past that each etcd cluster adds X_e(1) per leader core until the brokers "
         "bind again. " if one else "The brokers stay the bound up to N = 4,096. ") + two,
        "",
        "The model against this run (the brokers' CPU µs per message, measured / given by the "
        "constants): " + "; ".join(f"{m.config.label} {m.us(m.cpu_of('node')):.0f} / "
                                    f"{model.predicted_us(m):.0f}" for m in measured) + ".",
        "",
        "**Where the next bottleneck is.** Per message of the cluster a node spends "
        f"R·u·(a + p/m)/N on applying and h·(2 − R/N)/N on HTTP: at N = {n}, R = {r} "
        f"that is {apply_part / n:.1f} against {http_part / n:.1f} µs. "
        + ("HTTP is the larger part: it does not shrink as groups spread, and forwarding "
           "adds a second pass to 1 − R/N of the messages; clients that send each request to "
           "a holder of its group (the Python client does once it has the map from "
           "`GET /messaging/groups`) remove that pass. "
           if http_part >= apply_part else
           "Applying is the larger part and falls as R/N with more nodes; HTTP does not, and "
           "forwarding adds a second HTTP pass to 1 − R/N of the messages (clients that send "
           "to a holder of the group, as the Python client does once it has the map, save "
           "it). ")
        + forwarding
        + "As brokers are added, one etcd cluster binds first (its leader's CPU and fsyncs "
        "per put), relieved only by more etcd clusters (`--group-etcd`) or fuller puts; then a "
        "hot group (X_g: one group's messages are applied in order on each holder's one event "
        "loop, so more groups do not help a hot topic). Groups are not free: each held group "
        f"costs s = {model.stack_cores * 1000:.0f} millicores of broker CPU and "
        f"{model.etcd_stack_cores * 1000:.0f} of etcd's per group without load (each group's "
        "log polls etcd: leases, registrations, quorum checks, checkpoints), and more groups "
        "mean smaller puts (lower m: more p and more etcd work per message). So G far above "
        "what spreads the load costs CPU; with bounded-load placement a few groups per node "
        "(G·R/N of 2–8) already spread it evenly.",
    ])


def _etcd_split(both: list[Measured]) -> str:
    one, two = both
    a1 = one.us(one.cpu_of("etcd-"))
    a2 = two.us(two.cpu_of("etcd-a"))
    b2 = two.us(two.cpu_of("etcd-b"))
    return (f"{a1:.0f} µs per message in the one cluster against {a2:.0f} + {b2:.0f} µs in the "
            "two (per message of the whole run)")


# -- the plot and the record -------------------------------------------------------------------

def plot(measured: list[Measured]) -> None:
    """Three panels: msg/s per configuration; each node's applied fraction beside R/N; CPU
    per message by process kind."""
    labels = [m.config.label.replace(", ", "\n") for m in measured]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    ax.bar(labels, [m.rate for m in measured], color="tab:blue")
    ax.set_ylabel("messages/s (acknowledged)")
    ax.set_title("throughput (4 nodes, 2 cores shared)")
    ax = axes[1]
    width = 0.8 / max(len(m.nodes) for m in measured)
    for i in range(len(measured[0].nodes)):
        xs = [k + (i - 1.5) * width for k in range(len(measured))]
        ax.bar(xs, [m.fraction(m.nodes[i]) for m in measured], width, label=f"node{i}")
    ax.plot(range(len(measured)), [m.share for m in measured], "k_", markersize=30,
            markeredgewidth=2, label="R/N (1 with G=1)")
    ax.set_xticks(range(len(measured)), labels)
    ax.set_ylabel("messages applied / messages published")
    ax.set_title("apply work per node")
    ax.set_ylim(0, 1.3)
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    ax = axes[2]
    kinds = [("brokers", lambda m: m.us(m.cpu_of("node"))),
             ("etcd", lambda m: m.us(m.cpu_of("etcd-"))),
             ("load generator", lambda m: m.us(m.cpu.load_generator))]
    bottom = [0.0] * len(measured)
    for name, value in kinds:
        values = [value(m) for m in measured]
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("CPU µs per published message")
    ax.set_title("CPU per message, all processes")
    ax.legend(fontsize=8)
    for a in axes:
        a.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    results.RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(results.RESULTS / "groups.png", dpi=90)
    plt.close(fig)


@dataclass
class Context:
    """How the run was set up, for the record."""

    topics: list[int]
    rtt: str
    delay_note: str
    seconds: float
    warmup: float
    load_at_start: tuple[float, float, float]
    took: float
    rounds: int
    discarded: list[dict[str, Any]]
    source_at_start: str = ""
    noisy: float = 0.5  # cores of other processes that make a round run again


def write_results(measured: list[Measured], rounds: list[Measured], ctx: Context) -> None:
    """Rows, notes (the table, the model), results/groups.json and .png, RESULTS.md."""
    base = next((m for m in measured if m.config.groups == 1), None)
    rows = []
    for m in measured:
        rows.append(Row(f"{m.config.label}: publish throughput", m.rate, "msg/s",
                        "G=1" if base is not None else "",
                        base.rate if base is not None else None))
    for m in measured:
        rows.append(Row(f"{m.config.label}: busiest node applies (fraction of published; "
                        f"R/N = {m.share:.2f})", m.busiest, "", "G=1: every node all", 1.0))
    for m in measured:
        rows.append(Row(f"{m.config.label}: CPU of all processes per message", m.us(
            m.cpu.machine), "µs", "G=1" if base is not None else "",
            base.us(base.cpu.machine) if base is not None else None))
    table = "\n".join([table_header(), *(row_text(m, base) for m in measured)])
    checks = "\n".join(f"- {m.config.label}: {extras(m)}" for m in measured)
    model = build_model(measured, rounds)
    l1, l5, l15 = ctx.load_at_start
    cores = os.cpu_count() or 1
    now = datetime.datetime.now().astimezone().strftime("%a %d %b %Y %H:%M:%S %Z")
    notes = "\n".join([
        f"Run {now}, {source_state()}"
        + (f" (at the start: {ctx.source_at_start}: messaging/ changed during the run)"
           if ctx.source_at_start and ctx.source_at_start != source_state() else "")
        + f", {ctx.took / 60:.1f} minutes; load average at the start {l1:.2f}, {l5:.2f}, "
        f"{l15:.2f}.",
        "",
        f"**Setup.** 4 broker nodes (`--fsync always`, R = 2 for G > 1) and 3 etcd 3.4 "
        f"members (`--snapshot-count 2000`; 3 more for the second etcd cluster), each in a "
        f"network namespace of its own on one bridge; the load generator (one Python process) "
        f"on the host. {ctx.rtt}. For each configuration and round a new etcd cluster and "
        f"new broker nodes; the placement settles, {ctx.warmup:.0f} s of warm-up load, then "
        f"{ctx.seconds:.0f} s measured; {ctx.rounds} rounds in the order A B … B A, added up. "
        f"Load: {SENDERS} closed-loop senders (sender k always to node k mod 4, going round "
        f"the {len(ctx.topics)} topics), each sending {SINGLES_EVERY} batches of {BATCH} × "
        f"{MESSAGE} B random messages, then one single {MESSAGE} B publish, and so on: "
        f"1 request in {SINGLES_EVERY + 1} is a single publish, 1 message in "
        f"{SINGLES_EVERY * BATCH + 1} is. Topics "
        f"{ctx.topics[0]}…{ctx.topics[-1]} ({len(ctx.topics)} ids chosen so that each of 8 "
        "groups has 4: every group equally busy at G = 2, 4, 8). A request sent to a node that "
        "does not hold its group is forwarded to a holder (`fwd`: the share of messages "
        "forwarded); `msg/put`: messages per etcd put (each node's writer puts per group). "
        "G=1 is the baseline of the same run: every node holds the one group. `to holders`: "
        "G = 8 with sender k sending each request to holder k mod 2 of its topic's group "
        "(as the Python client does once it has the group map) instead of to node k mod 4.",
        "",
        "**Applied per node** is exact: each held group's `messaging_messages_published_total` "
        "(`GET /metrics?group=G` on a node that holds G, `GET /metrics` with one group), read "
        "while the cluster is quiet (no load; every holder of a group at the same count on two "
        "reads 0.5 s apart) before and after the measured load; `published` is the sum over "
        "groups. **CPU** is each process's user + system time from /proc over the measured "
        "load, per acknowledged message: brokers summed (each node in parentheses), etcd "
        "summed over all members (the busiest member per message of its own cluster in "
        "parentheses) and the load generator; `other processes` is the machine's busy time "
        "(/proc/stat) beyond those processes and beyond interrupts and softirqs (where the "
        "veths' and the bridge's packets are handled), in cores: other work on this shared "
        "machine.",
        "",
        table,
        "",
        checks,
        "",
        f"Rounds run again because other processes on the machine kept more than {ctx.noisy} "
        "cores busy "
        "during them (at most 3 runs of a round, within 3 minutes of waiting and re-running "
        "per benchmark): "
        + (", ".join(f"{d['config']} ({d['msg_per_s']:,.0f} msg/s, {d['other_cores']:.2f} "
                     "cores of other work)" for d in ctx.discarded) or "none") + ".",
        "",
        f"**What 2 shared cores mean.** Every process here shares this machine's {cores} "
        "cores and one disk, and the machine was busy for most of each run: the aggregate "
        "msg/s cannot grow with more groups or more etcd clusters (adding processes only "
        "divides the same 2 cores), and falls where the work per message grows (forwarding "
        "adds an HTTP pass to about half the requests; more groups mean more, smaller puts "
        "and more watches). What transfers to separate machines is the work per node: the "
        "applied fraction per node (it falls from 1 towards R/N as groups spread) and the CPU "
        "µs per message of each process kind, which the model below turns into capacity.",
        "",
        model_text(model, measured),
    ])
    report("groups", "Topic groups", rows, "make bench-groups (python bench/groups/run.py)",
           notes=notes)
    plot(measured)
    add_to_json("groups", {
        "configs": [m.summary() for m in measured],
        "setup": {"topics": ctx.topics, "rtt": ctx.rtt, "delay": ctx.delay_note,
                  "seconds": ctx.seconds, "warmup": ctx.warmup, "batch": BATCH,
                  "message_bytes": MESSAGE, "senders": SENDERS,
                  "singles_every": SINGLES_EVERY, "rounds": ctx.rounds,
                  "rounds_run_again": ctx.discarded, "source": source_state(),
                  "source_at_start": ctx.source_at_start,
                  "load_at_start": list(ctx.load_at_start),
                  "took_s": ctx.took},
        "model": {"apply_us": model.fit.apply_us, "http_us": model.fit.http_us,
                  "revision_us": model.fit.revision_us, "messages_per_put": model.per_put,
                  "etcd_put_us": model.etcd_put_us, "fit_dropped": model.fit.dropped,
                  "stack_cores": model.stack_cores, "etcd_stack_cores": model.etcd_stack_cores,
                  "fit_r2": model.fit.r2,
                  "etcd_sum_us": model.etcd_sum_us, "etcd_max_us": model.etcd_max_us,
                  "unevenness": model.unevenness, "X_group": model.group(),
                  "X_etcd_1": model.etcd(1),
                  "X_brokers_G_2N": {str(n): model.brokers(n, model.replicas, 1.0, 2 * n)
                                for n in (4, 8, 16, 32)}},
    })
    print(model_text(model, measured))
