"""`firewall.yaml` as a typed model: each node's `inet llmgw` nftables table (issue 29), and its checks.

`build_firewall(data, found, file, control_planes)` turns the schema-valid mapping into `FirewallSettings` and adds
an error at file:line for each of: a network that is not one (`10.0.0.300/8`) or has host bits set (`10.0.0.1/8`:
write `10.0.0.0/8`), a port range whose first port is above its last, two rules of one name, and `enabled: true`
with no control-plane network at all (the table would cut every agent off its control plane) or with a listener of
llmgw.yaml on port 0 (any free port: no table can open it).

Networks are kept as `ipaddress` networks (IPv4 and IPv6 mixed, in file order, duplicates dropped): an address
without a prefix is its own /32 or /128. Ports are inclusive (first, last) ranges. Durations are in seconds.
The rendering (llmgw.plan.firewall) says what each key opens.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from llmgw.units import parse_duration

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_ROLLBACK_SECONDS = 60.0


@dataclass(frozen=True)
class FirewallRule:
    """Extra ports opened on a group of nodes. `ports`: inclusive (first, last) ranges in file order; `protocol`
    "tcp" or "udp"; `sources` the networks allowed (empty: every network); `labels` the node group: nodes whose
    agent labels hold all of these (empty: every node)."""

    name: str
    ports: tuple[tuple[int, int], ...]
    protocol: str = "tcp"
    sources: tuple[Network, ...] = ()
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def applies_to(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with agent labels `labels` is in this rule's group."""
        return all(labels.get(key) == value for key, value in self.labels.items())


@dataclass(frozen=True)
class FirewallSettings:
    """`firewall.yaml`. `control_planes`: networks of the control planes and gateway hosts, those of the file
    then the IP addresses of llmgw.yaml `control_planes`; `gateway_sources` (empty: every network),
    `admin_sources` (empty: the control planes only) and `ssh_sources` (empty: every network) as documented in
    schema/firewall.json; `rollback_after_seconds` how long an agent waits to reach a control plane afresh after
    applying a table before it restores the previous one."""

    enabled: bool = False
    control_planes: tuple[Network, ...] = ()
    gateway_sources: tuple[Network, ...] = ()
    admin_sources: tuple[Network, ...] = ()
    ssh_sources: tuple[Network, ...] = ()
    ssh_port: int = 22
    rollback_after_seconds: float = DEFAULT_ROLLBACK_SECONDS
    rules: tuple[FirewallRule, ...] = ()


def _networks(values: Iterable[str], found: Any, file: str, key: tuple[str | int, ...]) -> tuple[Network, ...]:
    out: dict[Network, None] = {}
    for index, text in enumerate(values):
        try:
            out[ipaddress.ip_network(text, strict=True)] = None
        except ValueError as exc:
            hint = ""
            try:
                hint = f": write {ipaddress.ip_network(text, strict=False)}"
            except ValueError:
                pass
            found.add(file, (*key, index), f"{text!r} is not a network ({exc}){hint}")
    return tuple(out)


def _ports(values: Iterable[int | str], found: Any, file: str, key: tuple[str | int, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for index, value in enumerate(values):
        if isinstance(value, int):
            out.append((value, value))
            continue
        first, last = (int(part) for part in value.split("-"))
        if not 1 <= first <= last <= 65535:
            found.add(file, (*key, index), f"port range {value!r} must run from a lower to a higher port, within "
                      "1-65535")
            continue
        out.append((first, last))
    return tuple(out)


def control_plane_addresses(control_planes: Iterable[str]) -> tuple[Network, ...]:
    """The IP addresses among llmgw.yaml `control_planes` ("host:port", "[v6]:port"), each as a /32 or /128
    network; host names are left out (they are not addresses a table can hold)."""
    out = []
    for entry in control_planes:
        host = entry.rsplit(":", 1)[0] if entry.count(":") == 1 or entry.startswith("[") else entry
        try:
            out.append(ipaddress.ip_network(host.strip("[]")))
        except ValueError:
            continue
    return tuple(out)


def build_firewall(data: Mapping[str, Any], found: Any, file: str, control_planes: Iterable[str] = (),
                   listener_ports: Mapping[str, int] | None = None) -> FirewallSettings:
    """`firewall.yaml` data (schema-valid) -> FirewallSettings; the checks (module docstring) added to `found`
    (building.Found) as errors. `control_planes`: llmgw.yaml's `control_planes` ("host:port"); `listener_ports`:
    llmgw.yaml's listeners by name ("gateway", "admin", "agents") -> port, where 0 (any free port) cannot be opened."""
    rules = []
    names: set[str] = set()
    for index, entry in enumerate(data.get("rules", [])):
        if entry["name"] in names:
            found.add(file, ("rules", index, "name"), f"rule {entry['name']!r} is defined twice; give each rule its "
                      "own name")
        names.add(entry["name"])
        rules.append(FirewallRule(
            entry["name"], _ports(entry["ports"], found, file, ("rules", index, "ports")), entry.get("protocol", "tcp"),
            _networks(entry.get("sources", []), found, file, ("rules", index, "sources")),
            MappingProxyType(dict(entry.get("labels", {})))))
    own = _networks(data.get("control_planes", []), found, file, ("control_planes",))
    settings = FirewallSettings(
        enabled=bool(data.get("enabled", False)),
        control_planes=tuple(dict.fromkeys(own + control_plane_addresses(control_planes))),
        gateway_sources=_networks(data.get("gateway_sources", []), found, file, ("gateway_sources",)),
        admin_sources=_networks(data.get("admin_sources", []), found, file, ("admin_sources",)),
        ssh_sources=_networks(data.get("ssh_sources", []), found, file, ("ssh_sources",)),
        ssh_port=int(data.get("ssh_port", 22)),
        rollback_after_seconds=parse_duration(data["rollback_after"]) if "rollback_after" in data
        else DEFAULT_ROLLBACK_SECONDS,
        rules=tuple(rules),
    )
    for name, port in (listener_ports or {}).items():
        if settings.enabled and port == 0:
            found.add(file, ("enabled",), f"enabled: true needs a fixed port for llmgw.yaml listeners.{name} (it has "
                      "port 0, any free port, which no table can open); give it one", of_key=True)
    if settings.enabled and not settings.control_planes:
        found.add(file, ("enabled",), "enabled: true needs the control planes' networks: list them in "
                  "`control_planes` (or give llmgw.yaml `control_planes` as IP addresses); without them the table "
                  "would cut every agent off its control plane", of_key=True)
    return settings
