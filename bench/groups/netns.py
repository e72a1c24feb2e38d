"""Machines for the topic-groups benchmark: one network namespace per process, all on one
Ethernet segment.

A switch namespace holds a bridge; every machine namespace is joined to it by a veth pair,
and so is the host (where the load generator runs), so that every machine reaches every other
over veths and the bridge without forwarding on the host (its ``ip_forward`` and firewall are
left alone). Addresses are ``SUBNET.1`` for the host and ``SUBNET.10`` up for the machines;
nothing else on the host routes that /24 (checked before anything is made).

Each machine's veth gets ``tc qdisc ... netem delay`` on both of its ends (the machine's and
the switch's), so a packet to or from the host is delayed once each way, and one between two
machines twice (it crosses two machine links). A kernel without netem (``sch_netem`` neither
built in nor loadable) is recorded in :attr:`Network.delay_note` and the links carry no added
delay. :meth:`Network.close` deletes every namespace made here (their veths go with them) and
the host's veth; nothing else is touched. Root is required.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass, field

#: The /24 the machines live on (beside tests/netns.py's 10.231.0.0/16, never routed anywhere).
SUBNET = "10.232.0"
#: Host address on the segment.
HOST_IP = f"{SUBNET}.1"
#: The first machine's last octet.
FIRST_HOST = 10


def run(*args: str, namespace: str | None = None, check: bool = True) -> str:
    """Run ``args`` (in ``namespace`` when given); its output, or RuntimeError with stderr."""
    command = list(args) if namespace is None else ["ip", "netns", "exec", namespace, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Machine:
    """One namespace on the segment: its name, address and veth ends."""

    label: str
    namespace: str
    ip: str
    dev: str  # in the machine's namespace
    switch_dev: str  # in the switch namespace

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program in this machine's namespace (``ip netns
        exec`` execs the program in place: the child's PID is the program's)."""
        return ["ip", "netns", "exec", self.namespace]


@dataclass
class Network:
    """The switch, the host's link to it and the machines made so far."""

    delay_ms: float = 0.25
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    machines: list[Machine] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    host_dev: str = ""
    #: What the links' delay is: "netem 0.25 ms …", or why there is none.
    delay_note: str = ""
    _netem: bool | None = None

    @property
    def switch(self) -> str:
        return f"mgb-{self.tag}-sw"

    def open(self) -> None:
        """The switch namespace with its bridge, and the host's veth on it."""
        taken = run("ip", "-4", "route", "show", "to", "match", f"{SUBNET}.0/24")
        own = [line for line in taken.splitlines() if not line.startswith("default")]
        if own:
            raise RuntimeError(f"{SUBNET}.0/24 is already routed on this host ({own}): another "
                               "run of this benchmark? Remove its namespaces (ip netns list)")
        self._add_namespace(self.switch)
        run("ip", "link", "add", "br0", "type", "bridge", namespace=self.switch)
        run("ip", "link", "set", "br0", "up", namespace=self.switch)
        self.host_dev = f"mgbh{self.tag}"
        self._veth(self.host_dev, f"mgbs{self.tag}")
        run("ip", "addr", "add", f"{HOST_IP}/24", "dev", self.host_dev)
        run("ip", "link", "set", self.host_dev, "up")

    def machine(self, label: str) -> Machine:
        """A new namespace on the segment, its loopback up, its link delayed both ways."""
        k = len(self.machines)
        namespace = f"mgb-{self.tag}-{label}"
        self._add_namespace(namespace)
        run("ip", "link", "set", "lo", "up", namespace=namespace)
        dev, switch_dev = f"mgbm{self.tag}{k}", f"mgbp{self.tag}{k}"
        run("ip", "link", "add", dev, "type", "veth", "peer", "name", switch_dev)
        run("ip", "link", "set", dev, "netns", namespace)
        run("ip", "link", "set", switch_dev, "netns", self.switch)
        run("ip", "link", "set", switch_dev, "master", "br0", namespace=self.switch)
        run("ip", "link", "set", switch_dev, "up", namespace=self.switch)
        ip = f"{SUBNET}.{FIRST_HOST + k}"
        run("ip", "link", "set", dev, "name", "eth0", namespace=namespace)
        run("ip", "addr", "add", f"{ip}/24", "dev", "eth0", namespace=namespace)
        run("ip", "link", "set", "eth0", "up", namespace=namespace)
        machine = Machine(label, namespace, ip, "eth0", switch_dev)
        self.machines.append(machine)
        self._delay(machine.dev, namespace)
        self._delay(switch_dev, self.switch)
        return machine

    def _add_namespace(self, name: str) -> None:
        run("ip", "netns", "add", name)
        self.namespaces.append(name)

    def _veth(self, host_end: str, switch_end: str) -> None:
        run("ip", "link", "add", host_end, "type", "veth", "peer", "name", switch_end)
        run("ip", "link", "set", switch_end, "netns", self.switch)
        run("ip", "link", "set", switch_end, "master", "br0", namespace=self.switch)
        run("ip", "link", "set", switch_end, "up", namespace=self.switch)

    def _delay(self, dev: str, namespace: str) -> None:
        """netem's delay on ``dev``'s egress, once the kernel has shown it has netem."""
        if self._netem is False:
            return
        done = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev",
                               dev, "root", "netem", "delay", f"{self.delay_ms}ms"],
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0:
            self._netem = True
            self.delay_note = (f"netem delay {self.delay_ms} ms on both ends of every "
                               "machine's veth")
            return
        if self._netem:  # it worked on an earlier link: this one is a real failure
            raise RuntimeError(f"tc netem on {dev} in {namespace}: {done.stderr.strip()}")
        self._netem = False
        self.delay_note = (f"no added delay: `tc qdisc add ... netem delay {self.delay_ms}ms` "
                           f"failed ({done.stderr.strip()}): this kernel has no sch_netem "
                           "(CONFIG_NET_SCH_NETEM unset, no loadable modules)")

    def close(self) -> None:
        """Delete every namespace made here (their veths go too) and the host's veth."""
        for name in reversed(self.namespaces):
            run("ip", "netns", "del", name, check=False)
        self.namespaces.clear()
        if self.host_dev:
            run("ip", "link", "del", self.host_dev, check=False)
            self.host_dev = ""


#: A TCP connect timer run inside a namespace: SYN → SYN-ACK is one round trip.
_CONNECT_PROBE = """
import socket, statistics, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(count):
    started = time.perf_counter()
    with socket.create_connection((host, port), timeout=2):
        times.append(time.perf_counter() - started)
    time.sleep(0.01)
print(statistics.median(times) * 1000)
"""


def connect_rtt_ms(host: str, port: int, machine: Machine | None = None,
                   count: int = 20) -> float:
    """Median milliseconds of ``count`` TCP connects to ``host:port``, from the host or from
    ``machine``'s namespace: one round trip each (plus the kernels' work)."""
    out = run(sys.executable, "-c", _CONNECT_PROBE, host, str(port), str(count),
              namespace=machine.namespace if machine is not None else None)
    return float(out.strip())


def rtt_note(net: Network, target: Machine, peer: Machine, port: int) -> str:
    """The round trips the links give: host → ``target`` and ``peer`` → ``target``."""
    host = connect_rtt_ms(target.ip, port)
    between = connect_rtt_ms(target.ip, port, peer)
    return (f"TCP connect round trip (median of 20): host → machine {host:.3f} ms, machine → "
            f"machine {between:.3f} ms ({net.delay_note})")

