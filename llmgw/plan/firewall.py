"""Each node's nftables table `inet llmgw`, rendered from firewall.yaml, llmgw.yaml, slurm.yaml and the fleet. Pure
and deterministic: the same settings and fleet give byte-identical text, so its digest changes only on a real change.

`firewall_table(settings, fleet, node_id)` is one node's `FirewallTable` (llmgw.plan.types; None when firewall.yaml is off), and
`firewall_tables(settings, fleet)` every alive node's. The table has one base chain, `input` (hook input, priority
filter), whose rules in order:

1. established and related traffic, loopback, ICMP and ICMPv6 (neighbour discovery), and DHCP/DHCPv6 replies pass;
2. the control planes and gateway hosts (firewall.yaml `control_planes` with llmgw.yaml's own) reach every port:
   engines and relays, whose ports the agents choose free, are open to them only;
3. a fabric test's client reaches its server's port while the test runs: the server's agent adds (client address,
   port) with a timeout to the set `fabric_test4` / `fabric_test6` (`llmgw.tools.nft.fabric_element`);
   the other nodes of a replica spread over several nodes reach this node (the ranks' rendezvous and NCCL ports,
   docs/security.md "An engine port");
4. ssh (`ssh_port`) from `ssh_sources` (every network when empty);
5. on a control plane (a node whose address is in `control_planes`): the gateway listener from `gateway_sources`
   (every network when empty), the admin listener from `admin_sources`, the agents' listener from the fleet's nodes;
6. on Slurm's controller and lendable nodes (slurm.yaml enabled): slurmctld's, slurmd's and slurmdbd's ports from
   those nodes; on the node of slurm.yaml `shared.export`, NFS (TCP 2049) from the other ones only;
7. each rule of `rules` whose node group holds this node;
8. anything else is refused: TCP with a reset (a client fails at once), the rest with an ICMP port-unreachable.

The chain's policy is accept and it refuses only what reaches its end: other programs' tables are never touched and
stay as they are; a packet another table drops stays dropped. Addresses are written from `ipaddress` values only (a
node address that is not an IP address is left out of every set and named in `FirewallTable.unknown`), and every
name is checked to be a word before it is written (GeneratedFileError otherwise): nothing of the settings or of an
agent's report can add syntax to the table. The nft syntax is not `Key=Value`, so `llmgw.plan.conf_lines` does not
apply; this module is the one writer of nft text.

The agent swaps a node's table in one `nft -f` transaction that names table `inet llmgw` only
(`llmgw.tools.nft.replace_script`, `REMOVE_SCRIPT`): atomic, and no other table is read or written.
Format: the nft(8) manual page, nftables 1.0.6 (Debian 12), checked by `nft -c -f` in tests/plan/test_firewall_render.py.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.errors import GeneratedFileError
from llmgw.plan.types import FirewallTable, Fleet, NodeState
from llmgw.settings.firewall import Network
from llmgw.settings.model import Settings
from llmgw.tools.nfs_export import NFS_PORT
from llmgw.tools.nft import FABRIC_SETS, TABLE

_WORD = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def _address(node: NodeState) -> Network | None:
    try:
        return ipaddress.ip_network(node.address.strip("[]"))
    except ValueError:
        return None


def _word(what: str, text: str) -> str:
    if not _WORD.fullmatch(text):
        raise GeneratedFileError(f"refusing to write {what} {text!r} into the nftables table: not a name of "
                                 "lower-case letters, digits, '.', '_' and '-'")
    return text


def _from(networks: Iterable[Network], rest: str) -> list[str]:
    """`rest` as rules from each family of `networks` (none for an empty family): `ip saddr { ... } rest`."""
    lines = []
    for family, version in (("ip", 4), ("ip6", 6)):
        chosen = sorted({n for n in networks if n.version == version}, key=lambda n: (n.network_address, n.prefixlen))
        if chosen:
            lines.append(f"{family} saddr {{ {', '.join(str(n) for n in chosen)} }} {rest}")
    return lines


def _ports(ranges: Iterable[tuple[int, int]]) -> str:
    parts = [str(first) if first == last else f"{first}-{last}" for first, last in ranges]
    return parts[0] if len(parts) == 1 else "{ " + ", ".join(parts) + " }"


def _comment(text: str) -> str:
    return f'comment "{text}"'


def _is_in(address: Network | None, networks: Iterable[Network]) -> bool:
    return address is not None and any(address.version == n.version and address.subnet_of(n) for n in networks)


@dataclass(frozen=True)
class _View:
    """What every node's table reads of the fleet, worked out once: each node by id, its address (None: not an IP
    address), the node ids holding each replica, the nodes whose address is not an IP address (sorted)."""

    nodes: Mapping[str, NodeState]
    addresses: Mapping[str, Network | None]
    holders: Mapping[str, frozenset[str]]
    unknown: tuple[str, ...]

    @classmethod
    def of(cls, fleet: Fleet) -> _View:
        addresses = {node.node_id: _address(node) for node in fleet.nodes}
        holders: dict[str, set[str]] = {}
        for node in fleet.nodes:
            for shard in node.shards:
                holders.setdefault(shard.replica_id, set()).add(node.node_id)
        return cls({node.node_id: node for node in fleet.nodes}, addresses,
                   {replica: frozenset(ids) for replica, ids in holders.items()},
                   tuple(sorted(n for n, a in addresses.items() if a is None)))


def firewall_table(settings: Settings, fleet: Fleet, node_id: str) -> FirewallTable | None:
    """`node_id`'s table (module docstring), or None when firewall.yaml is off. `fleet`: the nodes the control
    plane knows (their addresses, labels and shards); a node absent from it gets the table of a node that is
    neither a control plane nor holds a replica. Raises GeneratedFileError for a name that cannot be written."""
    if not settings.firewall.enabled:
        return None
    return _table(settings, _View.of(fleet), node_id)


def _table(settings: Settings, view: _View, node_id: str) -> FirewallTable:
    firewall = settings.firewall
    addresses = view.addresses
    node = view.nodes.get(node_id)
    mine = addresses.get(node_id)
    cluster, slurm = settings.cluster, settings.slurm
    lines = [
        "ct state established,related accept",
        "ct state invalid drop",
        'iifname "lo" accept',
        "meta l4proto { icmp, ipv6-icmp } accept",
        "udp dport { 68, 546 } accept " + _comment("DHCP and DHCPv6 replies"),
    ]
    lines += _from(firewall.control_planes, "accept " + _comment("control planes and gateways"))
    lines += [f"{family} saddr . tcp dport @{name} accept " + _comment("fabric test") for family, name in FABRIC_SETS]
    peers = {other for shard in (node.shards if node is not None else ()) for other in view.holders[shard.replica_id]}
    peers.discard(node_id)
    lines += _from([a for p in peers if (a := addresses.get(p)) is not None],
                   "accept " + _comment("nodes of this node's replicas"))
    ssh = f"tcp dport {firewall.ssh_port} accept " + _comment("ssh")
    lines += _from(firewall.ssh_sources, ssh) if firewall.ssh_sources else [ssh]
    if _is_in(mine, firewall.control_planes):
        gateway = f"tcp dport {cluster.gateway.port} accept " + _comment("gateway")
        lines += _from(firewall.gateway_sources, gateway) if firewall.gateway_sources else [gateway]
        lines += _from(firewall.admin_sources, f"tcp dport {cluster.admin.port} accept " + _comment("admin API"))
        lines += _from([a for a in addresses.values() if a is not None],
                       f"tcp dport {cluster.agents.port} accept " + _comment("agents"))
    if slurm.enabled and node_id in (slurm.controller, *slurm.nodes):
        members = [addresses.get(n) for n in dict.fromkeys((slurm.controller, *slurm.nodes))]
        ports = sorted(slurm.ports.values())
        lines += _from([m for m in members if m is not None],
                       f"tcp dport {_ports((p, p) for p in ports)} accept " + _comment("slurm"))
        if slurm.shared_path and node_id == slurm.shared_export:
            lines += _from([m for n, m in zip(dict.fromkeys((slurm.controller, *slurm.nodes)), members)
                            if m is not None and n != node_id],
                           f"tcp dport {NFS_PORT} accept " + _comment("nfs shared path"))
    labels = {**dict(node.labels if node is not None else ()), **settings.agent_settings_for(node_id).labels}
    for rule in firewall.rules:
        if rule.applies_to(labels):
            opened = f"{rule.protocol} dport {_ports(rule.ports)} accept " + _comment(f"rule {_word('rule', rule.name)}")
            lines += _from(rule.sources, opened) if rule.sources else [opened]
    lines += ["meta l4proto tcp reject with tcp reset " + _comment("refused"),
              "reject " + _comment("refused")]
    body = "".join(f"\t\t{line}\n" for line in lines)
    sets = "".join(f"\tset {name} {{\n\t\ttype {'ipv4_addr' if family == 'ip' else 'ipv6_addr'} . inet_service\n"
                   "\t\tflags timeout\n\t}\n" for family, name in FABRIC_SETS)
    text = (f"table {TABLE} {{\n{sets}\tchain input {{\n\t\ttype filter hook input priority filter; policy accept;\n"
            f"{body}\t}}\n}}\n")
    return FirewallTable(node_id, text, hashlib.sha256(text.encode()).hexdigest()[:16],
                         firewall.rollback_after_seconds, view.unknown)


def firewall_tables(settings: Settings, fleet: Fleet) -> dict[str, FirewallTable]:
    """Every alive node's table by node id ({} when firewall.yaml is off)."""
    if not settings.firewall.enabled:
        return {}
    view = _View.of(fleet)
    return {node.node_id: _table(settings, view, node.node_id) for node in fleet.nodes if node.alive}
