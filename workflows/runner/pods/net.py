"""The pod network of a Node, with iproute2: a bridge, one veth per pod, addresses.

Each Node takes its own subnet (default: the first free /22 of the pod CIDR 10.244.0.0/16, as
a Kubernetes node takes a slice of the cluster CIDR); the bridge gets the subnet's first
address (the node address, where shared services listen), pods the next ones, never reused
within a Node, so a retry gets a new IP. The bridge does not forward to anywhere else
(`forwarding=0` on it, no NAT), so pod traffic stays between the pods and the node.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import subprocess
import threading

from ckptflow.workflows.runner.pods.check import tool

__all__ = [
    "IpAllocator",
    "NetError",
    "Bridge",
    "POD_CIDR",
    "SUBNET_BITS",
    "connect_pod",
    "drop_pod_traffic",
    "links",
]

POD_CIDR = "10.244.0.0/16"
SUBNET_BITS = 22  # 1021 pod addresses per Node, 64 Nodes at once in the pod CIDR
LOCK_FILE = "/run/ckptflow-pods.lock"  # serialises subnet choice between concurrent runners
IP_TIMEOUT = 30


class NetError(RuntimeError):
    """An `ip` command failed, or the pod CIDR has no room; one line."""


def ip(*args: str, batch: list[str] | None = None, netns_pid: int | None = None) -> str:
    """Run `ip ARGS` (or `ip -batch -` with `batch`), in a pod's netns when `netns_pid`."""
    argv = [tool("ip"), *args] if batch is None else [tool("ip"), "-batch", "-"]
    if netns_pid is not None:
        argv = [tool("nsenter"), f"--net=/proc/{netns_pid}/ns/net", "--", *argv]
    done = subprocess.run(
        argv,
        input="\n".join(batch or []) + "\n" if batch is not None else None,
        capture_output=True,
        text=True,
        timeout=IP_TIMEOUT,
    )
    if done.returncode != 0:
        what = " | ".join(batch) if batch is not None else " ".join(args)
        raise NetError(f"ip {what}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def links() -> list[str]:
    """The names of every network interface of this (the host's) namespace."""
    return [entry["ifname"] for entry in json.loads(ip("-j", "link", "show") or "[]")]


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = []
    for entry in json.loads(ip("-j", "-4", "addr", "show") or "[]"):
        for a in entry.get("addr_info") or []:
            out.append(ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network)
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst")
        if dst and dst != "default" and "/" in dst:
            with contextlib.suppress(ValueError):
                out.append(ipaddress.ip_network(dst, strict=False))
    return out


def free_subnet(cidr: str, bits: int) -> ipaddress.IPv4Network:
    """The first /`bits` of `cidr` no address or route of this machine overlaps."""
    pool = ipaddress.ip_network(cidr)
    if not isinstance(pool, ipaddress.IPv4Network) or not pool.prefixlen <= bits <= 29:
        raise NetError(f"pod CIDR {cidr}: need an IPv4 network of at most /{bits} (bits <= 29)")
    used = _used_networks()
    for subnet in pool.subnets(new_prefix=bits):
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise NetError(f"pod CIDR {cidr} has no free /{bits} (other runs use them; see `ip addr`)")


class IpAllocator:
    """Hands out the addresses of a subnet after the node's, each one once."""

    def __init__(self, subnet: ipaddress.IPv4Network) -> None:
        self.subnet = subnet
        self._hosts = subnet.hosts()
        self.node = next(self._hosts)
        self._lock = threading.Lock()

    def next(self) -> ipaddress.IPv4Address:
        with self._lock:
            try:
                return next(self._hosts)
            except StopIteration:
                raise NetError(
                    f"the node's subnet {self.subnet} has no address left (addresses are never "
                    "reused within a run; give the Node a bigger subnet)"
                ) from None


def _sysctl(path: str, value: str) -> None:
    with contextlib.suppress(FileNotFoundError), open(path, "w") as f:
        f.write(value)


class Bridge:
    """The node's bridge `TAG + "b"` with the node address of a free subnet."""

    def __init__(self, tag: str, cidr: str = POD_CIDR, bits: int = SUBNET_BITS) -> None:
        self.name = tag + "b"
        with open(LOCK_FILE, "a") as lock:
            # Two runners starting at once would otherwise pick the same free subnet.
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = free_subnet(cidr, bits)
            self.ips = IpAllocator(subnet)
            ip("link", "add", self.name, "type", "bridge")
            try:
                # No routing out of the bridge, no IPv6 chatter: pods talk to pods and the node.
                _sysctl(f"/proc/sys/net/ipv4/conf/{self.name}/forwarding", "0")
                _sysctl(f"/proc/sys/net/ipv6/conf/{self.name}/disable_ipv6", "1")
                ip("addr", "add", f"{self.ips.node}/{bits}", "dev", self.name)
                ip("link", "set", self.name, "up")
            except BaseException:
                self.delete()
                raise
        self.address = str(self.ips.node)
        self.prefixlen = bits

    def delete(self) -> None:
        """Remove the bridge (its pod ports go when their pods' namespaces do)."""
        delete_link(self.name)


def delete_link(name: str) -> None:
    """Remove a link if it exists."""
    if os.path.exists(f"/sys/class/net/{name}"):
        with contextlib.suppress(NetError):
            ip("link", "del", name)


def connect_pod(bridge: Bridge, veth: str, pid: int, address: str) -> None:
    """Give the netns of process `pid` an `eth0` on the bridge with `address`, routed via the
    node, and its loopback."""
    ip(
        batch=[
            f"link add {veth} type veth peer name eth0 netns {pid}",
            f"link set {veth} master {bridge.name} up",
        ]
    )
    _sysctl(f"/proc/sys/net/ipv6/conf/{veth}/disable_ipv6", "1")
    ip(
        batch=[
            "link set lo up",
            f"addr add {address}/{bridge.prefixlen} dev eth0",
            "link set eth0 up",
            f"route add default via {bridge.address}",
        ],
        netns_pid=pid,
    )


def drop_pod_traffic(pid: int) -> None:
    """Make the pod of process `pid` silent, as a node that lost power or its NIC is: every
    route of its netns becomes a blackhole, so nothing it (or its kernel: SYN-ACK, ACK, RST,
    FIN, ICMP) sends leaves it, and what peers send gets no answer; they see only time passing.
    Its address stays and still answers ARP, so a peer's connect or recv times out instead of
    failing at once with "No route to host" (what a vanished neighbour on one L2 gives; across
    nodes, a dead peer is silent). Gone with the pod's netns: nothing to undo."""
    routes = json.loads(ip("-j", "-4", "route", "show", "table", "main", netns_pid=pid) or "[]")
    batch = [f"route replace blackhole {r['dst']}" for r in routes if r.get("dst")]
    ip(batch=batch or ["route replace blackhole default"], netns_pid=pid)
