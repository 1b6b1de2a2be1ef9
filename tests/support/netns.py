"""Hosts of their own on this machine: network namespaces joined by one bridge, for firewall, multi-node and
other-host tests. Needs root (`ip netns`), which the test machines have.

    from support.netns import open_lab

    with open_lab() as lab:                      # or the pytest fixture `netns_lab` (tests/conftest.py)
        node = lab.host("node")                  # a namespace with eth0 at lab.address(1) / lab.address6(1)
        client = lab.host("client")
        server = node.popen(["python3", "-m", "http.server", "--bind", node.address, "8000"])
        client.run(["curl", f"http://{node.address}:8000/"])        # argv run inside the client's namespace

The first thing a lab does (DESIGN.md, "Known traps") is make its address ranges unreachable from the root
namespace: `ip route add unreachable <range>` (IPv4 /24 and IPv6 /64), so a connection to a lab address made from
the root namespace fails at once instead of leaving the machine by the default route. Adding the route also claims
the range: a range another lab (another test worker, another checkout) holds already makes `ip route add` fail, and
the next range is tried. The bridge lives in a namespace of its own, so nothing of the lab is in the root namespace
but those routes. Closing the lab kills the processes started with `Host.popen`, deletes its namespaces (their
interfaces go with them) and then the routes.

Addresses: host N (1, 2, ... in creation order) is 10.<a>.<b>.N/24 and fd42:<a>:<b>::N/64; `Host.address` and
`Host.address6` are the bare addresses. IPv6 addresses are added without duplicate detection (usable at once).

`lab.join_root()` puts the test's own (root) namespace on the bridge too, at 10.<a>.<b>.254 (IPv4 only), so the
test process itself (ssh, an HTTP client, a listener the hosts call back) reaches the hosts without `ip netns exec`.
The hosts' part of the range, 10.<a>.<b>.0/25, is routed to that veth: a more specific route than the /24
unreachable claim, which stays underneath, so if the veth ever goes, its route goes with it and the range is
unreachable again (never the default route). Addresses .128-.253 stay unreachable from the root namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

_POOL = [(a, b) for a in range(200, 224) for b in range(256)]
"""Candidate ranges 10.a.b.0/24, tried from a start that depends on the process id."""


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class Host:
    """One namespace `netns` with eth0 at `address` (IPv4) and `address6` (IPv6) on the lab's bridge."""

    name: str
    netns: str
    address: str
    address6: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` prefixed to run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        """Run `argv` inside the namespace and wait (text output captured unless given otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(argv), check=check, timeout=timeout, **kwargs)

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `argv` inside the namespace; it is killed when the lab closes."""
        process = subprocess.Popen(self.argv(argv), **kwargs)
        self.processes.append(process)
        return process


class Lab:
    """Namespaces on one bridge, with claimed ranges `network` (IPv4 /24) and `network6` (IPv6 /64)."""

    def __init__(self, prefix: str, network: ipaddress.IPv4Network, network6: ipaddress.IPv6Network):
        self.prefix = prefix
        self.network = network
        self.network6 = network6
        self.switch = f"{prefix}-sw"
        self.hosts: dict[str, Host] = {}
        self.root_address: str | None = None

    def address(self, index: int) -> str:
        return str(self.network.network_address + index)

    def address6(self, index: int) -> str:
        return str(self.network6.network_address + index)

    def host(self, name: str) -> Host:
        """A new host `name` (a short word: it names the namespace and the bridge port), the next address."""
        index = len(self.hosts) + 1
        netns = f"{self.prefix}-{name}"
        port = f"v{self.prefix[-6:]}{index}"[:15]
        _ip("netns", "add", netns)
        host = Host(name, netns, self.address(index), self.address6(index))
        self.hosts[name] = host
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", netns, "addr", "add", f"{host.address}/{self.network.prefixlen}", "dev", "eth0")
        _ip("-n", netns, "-6", "addr", "add", f"{host.address6}/{self.network6.prefixlen}", "dev", "eth0", "nodad")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return host

    def join_root(self) -> str:
        """Join the root namespace to the bridge (module docstring) and return its address, 10.<a>.<b>.254;
        a second call returns the same address. Hosts 1-126 are then reachable from the test process."""
        if self.root_address is None:
            port = f"{self.prefix}-r"
            _ip("link", "add", port, "type", "veth", "peer", "name", "root", "netns", self.switch)
            self.root_address = self.address(254)
            _ip("-n", self.switch, "link", "set", "root", "master", "br0", "up")
            _ip("addr", "add", f"{self.root_address}/{self.network.prefixlen}", "dev", port, "noprefixroute")
            _ip("link", "set", port, "up")
            hosts = ipaddress.ip_network(f"{self.network.network_address}/25")
            _ip("route", "add", str(hosts), "dev", port, "src", self.root_address)
        return self.root_address

    def close(self) -> None:
        """Stop every host's processes (SIGTERM, so an agent stops its engines; SIGKILL after 5 s), then kill
        whatever still runs in a host's namespace (an engine an agent started in its own process group), then
        delete the namespaces."""
        if self.root_address is not None:
            _ip("link", "del", f"{self.prefix}-r", check=False)  # its /25 route goes with it; the /24 claim stays
        started = [p for host in self.hosts.values() for p in host.processes if p.poll() is None]
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        for host in self.hosts.values():
            for pid in _ip("netns", "pids", host.netns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", host.netns, check=False)
        _ip("netns", "del", self.switch, check=False)


def _claim() -> tuple[ipaddress.IPv4Network, ipaddress.IPv6Network]:
    """Add the unreachable routes of a free range in the root namespace (the claim), before any namespace exists."""
    start = (os.getpid() * 7) % len(_POOL)
    for offset in range(len(_POOL)):
        a, b = _POOL[(start + offset) % len(_POOL)]
        network = ipaddress.ip_network(f"10.{a}.{b}.0/24")
        network6 = ipaddress.ip_network(f"fd42:{a:x}:{b:x}::/64")
        if _ip("route", "add", "unreachable", str(network), check=False).returncode != 0:
            continue
        if _ip("-6", "route", "add", "unreachable", str(network6), check=False).returncode != 0:
            _ip("route", "del", "unreachable", str(network), check=False)
            continue
        return network, network6
    raise RuntimeError("no free 10.200-223.x.0/24 range for a network lab")


@contextlib.contextmanager
def open_lab() -> Iterator[Lab]:
    """A lab (module docstring): ranges claimed unreachable first, then a bridge namespace; all removed on exit."""
    network, network6 = _claim()
    lab = Lab(f"lg{network.network_address.packed[1]:02x}{network.network_address.packed[2]:02x}", network, network6)
    try:
        _ip("netns", "add", lab.switch)
        _ip("-n", lab.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", lab.switch, "link", "set", "br0", "up")
        yield lab
    finally:
        lab.close()
        _ip("route", "del", "unreachable", str(network), check=False)
        _ip("-6", "route", "del", "unreachable", str(network6), check=False)
