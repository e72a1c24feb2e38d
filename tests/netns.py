"""Simulated machines for partition tests: network namespaces joined to the host by veth links.

A :class:`Namespace` is a separate network stack (its own loopback, its own addresses); a
process started with :attr:`Namespace.prefix` runs in it. Each :class:`Link` is a veth pair,
one end in the namespace and one on the host, with a /30 of 10.231.0.0/16 (never routed
anywhere else). :meth:`Link.cut` takes the namespace's end down (the host keeps its address,
so host processes bound to it keep talking to each other); :meth:`Link.heal` brings it back.
Only namespaces and links made here carry traffic, and :meth:`Namespace.close` removes them.
Root is required (the tests run as root, and so does CI).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import uuid
from dataclasses import dataclass

_subnets = itertools.count(os.getpid() % 200 * 64)


def _ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace,
                                                        "ip", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


@dataclass
class Link:
    """A veth pair between the host (``host_ip``) and a namespace (``ns_ip``)."""

    namespace: str
    host_dev: str
    ns_dev: str
    host_ip: str
    ns_ip: str

    def cut(self) -> None:
        """Take the namespace's end down: nothing passes until :meth:`heal`."""
        _ip("link", "set", self.ns_dev, "down", namespace=self.namespace)

    def heal(self) -> None:
        """Bring the namespace's end up again (the address and routes come back with it)."""
        _ip("link", "set", self.ns_dev, "up", namespace=self.namespace)


class Namespace:
    """A network namespace with its loopback up; links to the host are added by :meth:`link`."""

    def __init__(self) -> None:
        self.name = f"msg-{uuid.uuid4().hex[:8]}"
        self.links: list[Link] = []
        _ip("netns", "add", self.name)
        _ip("link", "set", "lo", "up", namespace=self.name)

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program in this namespace."""
        return ["ip", "netns", "exec", self.name]

    def link(self) -> Link:
        """A new veth link to the host, addressed from its own /30."""
        n = next(_subnets) % (256 * 64)
        base = f"10.231.{n // 64}.{n % 64 * 4}"
        prefix, last = base.rsplit(".", 1)
        host_ip, ns_ip = f"{prefix}.{int(last) + 1}", f"{prefix}.{int(last) + 2}"
        tag = uuid.uuid4().hex[:6]
        link = Link(self.name, f"vh{tag}", f"vn{tag}", host_ip, ns_ip)
        _ip("link", "add", link.host_dev, "type", "veth", "peer", "name", link.ns_dev)
        _ip("link", "set", link.ns_dev, "netns", self.name)
        _ip("addr", "add", f"{host_ip}/30", "dev", link.host_dev)
        _ip("link", "set", link.host_dev, "up")
        _ip("addr", "add", f"{ns_ip}/30", "dev", link.ns_dev, namespace=self.name)
        _ip("link", "set", link.ns_dev, "up", namespace=self.name)
        self.links.append(link)
        return link

    def close(self) -> None:
        """Delete the namespace (its veth ends, and with them the host's, go too)."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30,
                       check=False)
        for link in self.links:
            subprocess.run(["ip", "link", "del", link.host_dev], capture_output=True,
                           timeout=30, check=False)
