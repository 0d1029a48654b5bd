"""The chart twin's network: a bridge, one network namespace per node, Service IPs.

Each twin node is a Linux network namespace with one interface (a veth pair
into a bridge on this machine) and its own address, so that two nodes' agents
can bind the same ``hostPort`` and a pod on one node reaches another node's
pods at that node's address, as on a flat cluster network. The bridge holds
the address of the machine side (``gateway``: where the twin's API server,
kubelet and GPUs answer) and every Service's cluster IP (``add_service_ip``),
on which ``servicemesh`` listens: a node reaches a Service on-link, without
routes or iptables.

What it does not imitate: pods have no network namespace of their own (every
pod of a node shares the node's, as ``hostNetwork: true`` pods do), so two
pods of one node cannot listen on one port; there is no NetworkPolicy and no
DNS server (``runtime`` writes each container's ``/etc/hosts``).

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip`` (iproute2).
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
from dataclasses import dataclass, field


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    nets = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    return nets


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.0.0/16 that no interface of this machine is in."""
    used = _used_networks()
    for second in range(200, 256):
        net = ipaddress.IPv4Network(f"10.{second}.0.0/16")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.x.0.0/16 for the twin's network")


@dataclass
class Network:
    """``with Network() as net: ns = net.add_node("node-0")``: a bridge and namespaces,
    removed on exit. Names carry a random tag, so that two twins on one machine (two
    test processes) do not meet."""

    subnet: ipaddress.IPv4Network = field(default_factory=free_subnet)
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    nodes: dict[str, str] = field(default_factory=dict)
    """Node name -> its address."""
    namespaces: dict[str, str] = field(default_factory=dict)
    """Node name -> its network namespace's name (``ip netns``)."""
    services: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"pfb{self.tag}"

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def __enter__(self) -> Network:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add_node(self, node: str) -> str:
        """A namespace for ``node`` with the next address; returns the namespace's name."""
        index = len(self.nodes)
        address = str(self.subnet.network_address + 2 + index)
        ns, host_end, node_end = f"pf{self.tag}n{index}", f"pfv{self.tag}{index}", "eth0"
        _ip("netns", "add", ns)
        self.namespaces[node] = ns
        _ip("link", "add", host_end, "type", "veth", "peer", "name", f"pfp{self.tag}{index}")
        _ip("link", "set", f"pfp{self.tag}{index}", "netns", ns)
        _ip("-n", ns, "link", "set", f"pfp{self.tag}{index}", "name", node_end)
        _ip("link", "set", host_end, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", node_end)
        _ip("-n", ns, "link", "set", node_end, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.gateway)
        self.nodes[node] = address
        return ns

    def add_service_ip(self) -> str:
        """The next cluster IP (from the top of the subnet down), held by the bridge."""
        address = str(self.subnet.broadcast_address - 1 - len(self.services))
        _ip("addr", "add", f"{address}/32", "dev", self.bridge)
        self.services.append(address)
        return address

    def __exit__(self, *exc: object) -> None:
        for ns in self.namespaces.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
