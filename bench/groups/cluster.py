"""The processes of one configuration, each in its own namespace: etcd members (one or two
3-member clusters) and broker nodes of a cluster of topic groups; when they are ready, where
the groups are, and how many messages each node applied.

Applied messages are exact: every held group's broker on a node counts the messages it applies
(``messaging_messages_published_total`` in ``GET /metrics?group=G``, served only by a node that
holds G; ``GET /metrics`` with one group). The counters are read when the cluster is quiet
(no load, every holder of a group at the same count on two reads in a row), before and after
the measured load, so the differences are exactly the messages each node applied in between.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.groups.netns import Machine, Network
from bench.harness.etcd_members import Etcd, etcd_healthy, etcd_status
from bench.harness.loops import bounded_wait
from bench.harness.procs import Proc

Session = aiohttp.ClientSession
BROKER_PORT = 8080
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
_COUNTER = re.compile(r"^messaging_messages_published_total (\S+)$", re.M)


class NsEtcd(Etcd):
    """An etcd member in a machine's namespace, its client and peer URLs on its address."""

    def __init__(self, name: str, data: Path, initial_cluster: str, machine: Machine,
                 token: str, snapshot_count: int = 2000) -> None:
        super().__init__(name, data, initial_cluster, ETCD_CLIENT_PORT, ETCD_PEER_PORT,
                         snapshot_count)
        self.machine = machine
        self.token = token
        self.client_url = f"http://{machine.ip}:{ETCD_CLIENT_PORT}"
        self.peer_url = f"http://{machine.ip}:{ETCD_PEER_PORT}"

    def start(self) -> None:
        """Start the member in its namespace (a new data directory makes a new cluster)."""
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd is not on PATH (make etcd, or apt-get install etcd-server)")
        with self.data.with_suffix(".log").open("ab") as log:
            self.proc = subprocess.Popen(
                [*self.machine.prefix, etcd, "--name", self.name, "--data-dir", str(self.data),
                 "--listen-client-urls", self.client_url,
                 "--advertise-client-urls", self.client_url,
                 "--listen-peer-urls", self.peer_url,
                 "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
                 "--initial-cluster-token", self.token,
                 "--snapshot-count", str(self.snapshot_count),
                 "--logger", "zap", "--log-level", "warn"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def etcd_members(tmp: Path, machines: list[Machine], label: str) -> list[NsEtcd]:
    """One new etcd cluster over ``machines`` (not started), data under ``tmp``."""
    names = [f"{label}{i}" for i in range(len(machines))]
    initial = ",".join(f"{n}=http://{m.ip}:{ETCD_PEER_PORT}"
                       for n, m in zip(names, machines, strict=True))
    return [NsEtcd(n, tmp / n, initial, m, f"bench-groups-{tmp.name}-{label}")
            for n, m in zip(names, machines, strict=True)]


def endpoints(members: list[NsEtcd], first: int = 0) -> str:
    """The members' client URLs, starting with member ``first`` (each node talks to another
    member first)."""
    order = members[first:] + members[:first]
    return ",".join(m.client_url for m in order)


@dataclass
class BrokerNode:
    """One broker node in its machine's namespace."""

    machine: Machine
    data: Path
    log: Path
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://{self.machine.ip}:{BROKER_PORT}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.proc.poll() is None \
            else None

    def start(self, args: list[str]) -> None:
        """Start ``messaging broker`` with ``args`` (cluster options) in the namespace."""
        self.proc = Proc([*self.machine.prefix, sys.executable, "-m", "messaging.cli", "broker",
                          "--data", str(self.data), "--bind", f"{self.machine.ip}:{BROKER_PORT}",
                          "--advertise", self.url, "--insecure", "--log-level", "WARNING",
                          *args], "listening on", timeout=90, log=self.log)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@dataclass
class Config:
    """One configuration: ``groups`` groups, ``replicas`` holders each, and the groups whose
    log lives in the second etcd cluster (none: one etcd cluster)."""

    groups: int
    replicas: int
    second_etcd: tuple[int, ...] = ()
    #: The load generator sends each request to a holder of its topic's group (as the Python
    #: client does once it has the map), not to any node.
    to_holders: bool = False

    @property
    def etcd_clusters(self) -> int:
        return 2 if self.second_etcd else 1

    @property
    def name(self) -> str:
        return (f"g{self.groups}" + ("x2" if self.second_etcd else "")
                + ("h" if self.to_holders else ""))

    @property
    def label(self) -> str:
        return (f"G={self.groups}" + (", 2 etcd" if self.second_etcd else "")
                + (", to holders" if self.to_holders else ""))

    def holders_per_group(self, nodes: int) -> int:
        """How many nodes apply each group (all of them with one group)."""
        return nodes if self.groups == 1 else min(self.replicas, nodes)

    def args(self, etcd: str, second: list[NsEtcd]) -> list[str]:
        """The broker options of this configuration (``etcd``: this node's endpoints)."""
        out = ["--etcd", etcd, "--cluster", f"bench-{self.name}", "--groups", str(self.groups)]
        if self.groups > 1:
            out += ["--replicas", str(self.replicas)]
        for group in self.second_etcd:
            out += ["--group-etcd", f"{group}={endpoints(second, group % len(second))}"]
        return out


async def get_json(session: Session, url: str, timeout: float = 5.0) -> Any:
    """The JSON answer of a GET (RuntimeError unless 200)."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {url}: HTTP {resp.status} {await resp.text()}")
        return await resp.json()


async def start_etcd(session: Session, members: list[NsEtcd]) -> None:
    """Start the members and wait until they elected a leader and answer."""
    for member in members:
        member.start()
    await bounded_wait(lambda: etcd_healthy(session, list[Etcd](members)), 60, "etcd healthy", 0.2)


async def etcd_revision(session: Session, members: list[NsEtcd]) -> int:
    """The cluster's revision (writes so far), from the first member that answers."""
    for member in members:
        status = await etcd_status(session, member)
        if status is not None:
            return int(status["header"]["revision"])
    raise RuntimeError("no etcd member answers")


@dataclass
class Placement:
    """Which groups each node holds (as every node agreed), and their holders."""

    holders: dict[int, list[str]]
    held: dict[str, list[int]] = field(default_factory=dict)


async def placement(session: Session, urls: list[str], config: Config) -> Placement | None:
    """The placement when every node agrees on it and every holder has caught up, else None.
    With one group every node holds group 0 once its watch is live and it sees quorum."""
    if config.groups == 1:
        for url in urls:
            d = await get_json(session, f"{url}/messaging/diagnostics")
            if not (d.get("watch", {}).get("live") and d.get("quorum")):
                return None
        return Placement({0: list(urls)}, {u: [0] for u in urls})
    views = [await get_json(session, f"{u}/messaging/groups") for u in urls]
    maps = [{g["group"]: g["holders"] for g in v["groups"]} for v in views]
    if any(m != maps[0] for m in maps) or any(sorted(v["members"]) != sorted(urls)
                                              for v in views):
        return None
    held: dict[str, list[int]] = {u: [] for u in urls}
    for url, view in zip(urls, views, strict=True):
        for group in view["groups"]:
            here = group["here"]
            if (url in group["holders"]) != (here is not None) or \
                    (here is not None and not here["caught_up"]):
                return None
            if here is not None:
                held[url].append(group["group"])
    return Placement(maps[0], held)


async def settled(session: Session, urls: list[str], config: Config,
                  timeout: float = 90.0) -> Placement:
    """Wait (bounded) until :func:`placement` is settled; it."""
    found: list[Placement] = []

    async def check() -> bool:
        try:
            p = await placement(session, urls, config)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
            return False
        if p is not None:
            found.append(p)
        return p is not None

    await bounded_wait(check, timeout, "every node agreeing on caught-up group holders", 0.25)
    return found[-1]


@dataclass
class Counts:
    """Per node, per group it holds: messages applied, and puts this node made to etcd."""

    applied: dict[str, dict[int, int]]
    puts: dict[str, dict[int, int]]


async def read_counts(session: Session, placed: Placement, config: Config) -> Counts:
    """Every node's counters for the groups it holds."""
    counts = Counts({}, {})
    for url, groups in placed.held.items():
        counts.applied[url], counts.puts[url] = {}, {}
        diagnostics = await get_json(session, f"{url}/messaging/diagnostics")
        for group in groups:
            params = {} if config.groups == 1 else {"group": str(group)}
            async with session.get(f"{url}/metrics", params=params,
                                   timeout=aiohttp.ClientTimeout(total=5)) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise RuntimeError(f"{url}/metrics?group={group}: HTTP {resp.status} {text}")
            match = _COUNTER.search(text)
            counts.applied[url][group] = int(float(match.group(1))) if match else 0
            log = diagnostics if config.groups == 1 else diagnostics["held"][str(group)]
            counts.puts[url][group] = int(log.get("groups", 0))
    return counts


async def quiet_counts(session: Session, urls: list[str], config: Config,
                       timeout: float = 60.0) -> tuple[Placement, Counts]:
    """Placement and counters once the cluster is quiet: the placement settled, every holder
    of a group at the same count, nothing changed over two reads 0.5 s apart."""
    last: list[tuple[Placement, Counts]] = []
    deadline = time.perf_counter() + timeout

    async def check() -> bool:
        placed = await settled(session, urls, config,
                               max(1.0, deadline - time.perf_counter()))
        counts = await read_counts(session, placed, config)
        same_group = all(
            len({counts.applied[u][g] for u in holders if g in counts.applied.get(u, {})}) == 1
            for g, holders in placed.holders.items())
        stable = bool(last) and last[-1][1] == counts and last[-1][0].held == placed.held
        last.append((placed, counts))
        return same_group and stable

    await bounded_wait(check, timeout, "the cluster quiet (every holder at the same count)", 0.5)
    return last[-1]


def difference(before: dict[str, dict[int, int]],
               after: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
    """Per node and group, after minus before."""
    return {u: {g: n - before.get(u, {}).get(g, 0) for g, n in groups.items()}
            for u, groups in after.items()}


def log_errors(logs: list[Path]) -> list[str]:
    """Per log with any so far: how many error and warning lines it has, and the first of
    them (etcd's warnings are left out: it warns of its own setup, such as simple tokens)."""
    found = []
    for log in logs:
        if not log.exists():
            continue
        for kind, marks in (("error", ("ERROR", "Traceback", '"level":"error"')),
                            ("warning", ("WARNING",))):
            lines = [line for line in log.read_text(errors="replace").splitlines()
                     if any(mark in line for mark in marks)]
            if lines:
                found.append(f"{log.name}: {len(lines)} {kind} lines, first: {lines[0][:300]}")
    return found


async def stop_all(nodes: list[BrokerNode], members: list[NsEtcd]) -> None:
    """Stop the broker nodes (together), then the etcd members, each by its PID."""
    await asyncio.gather(*(asyncio.to_thread(n.stop) for n in nodes))
    for member in members:
        await asyncio.to_thread(member.stop)


def network_machines(net: Network, nodes: int, etcd_clusters: int) -> dict[str, list[Machine]]:
    """The machines: ``nodes`` broker machines and 3 per etcd cluster."""
    out: dict[str, list[Machine]] = {"brokers": [net.machine(f"n{i}") for i in range(nodes)]}
    for c in range(etcd_clusters):
        out[f"etcd{c}"] = [net.machine(f"e{c}{i}") for i in range(3)]
    return out
