"""Each node's nftables table (llmgw.plan.firewall), as a pure function on seeded fleets.

Rules checked on 40 seeds, each varying what the real world varies (addresses of both families and host names,
control planes among the nodes or apart, Slurm on or off, replicas spread over nodes, rules on node groups, empty
and full source lists):
- every table passes `nft -c -f` against this kernel, in the one-transaction script the agent runs;
- the table is a function of its inputs: the fleet in another order renders byte-identical text;
- every table lets the control planes in, and ends by refusing TCP with a reset;
- the gateway, admin and agents' listeners are opened on the control planes only, the agents' one from nodes only;
- Slurm's ports are opened on Slurm's nodes only, from Slurm's nodes only; NFS (2049) on the node of
  slurm.yaml `shared.export` only, from the other Slurm nodes only;
- a spread replica's nodes let each other in; a node sharing no replica is not let in for that reason;
- an address that is not an IP address (a host name, or worse) never reaches the text; off renders nothing.
"""

from __future__ import annotations

import ipaddress
import random
import shutil
import subprocess
from dataclasses import replace
from types import MappingProxyType

import pytest

from llmgw.plan import ActionKind, agent_settings_fingerprint, make_plan
from llmgw.plan.firewall import firewall_table, firewall_tables
from llmgw.plan.types import Fleet, NodeState, ObservedShard, ShardState
from llmgw.settings.firewall import FirewallRule, FirewallSettings
from llmgw.settings.model import AgentSettings, ClusterSettings, Settings
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings
from llmgw.tools.nft import REMOVE_SCRIPT, replace_script, table_refusal

net = ipaddress.ip_network


def nft_check(script: str) -> subprocess.CompletedProcess:
    assert shutil.which("nft"), "nft is missing: make system-packages (Debian nftables)"
    return subprocess.run(["nft", "-c", "-f", "-"], input=script, capture_output=True, text=True, timeout=10)


def seeded(seed: int) -> tuple[Settings, Fleet]:
    rng = random.Random(seed)
    count = rng.randint(2, 7)
    six = rng.random() < 0.4
    nodes = []
    for index in range(count):
        kind = rng.random()
        address = (f"fd00::{index + 1:x}" if six and kind < 0.5 else "node-x.example" if kind > 0.92
                   else f"10.20.{rng.randint(0, 3)}.{index + 1}")
        labels = (("pool", rng.choice(["gpu", "cpu"])),)
        nodes.append(NodeState(f"n{index}", address, alive=rng.random() > 0.1, labels=labels))
    for replica in range(rng.randint(0, 2)):  # replicas spread over 1-3 nodes
        holders = rng.sample(range(count), rng.randint(1, min(3, count)))
        for rank, index in enumerate(holders):
            shard = ObservedShard(f"r{replica}-s{rank}", f"m-{replica}", "m", ShardState.READY, rank=rank)
            nodes[index] = replace(nodes[index], shards=nodes[index].shards + (shard,))
    control = [nodes[0].address] if rng.random() < 0.7 else []
    control_nets = tuple(net(a) for a in control if ":" in a or a[0].isdigit()) + (net("10.99.0.0/24"),)
    rules = tuple(FirewallRule(f"rule-{i}", ((9100 + i, 9100 + i + rng.choice([0, 5])),), rng.choice(["tcp", "udp"]),
                               rng.choice([(), (net("10.30.0.0/16"),), (net("10.30.0.0/16"), net("fd00:30::/32"))]),
                               MappingProxyType(rng.choice([{}, {"pool": "gpu"}])))
                  for i in range(rng.randint(0, 3)))
    firewall = FirewallSettings(
        enabled=True, control_planes=control_nets,
        gateway_sources=rng.choice([(), (net("10.0.0.0/8"), net("fd00::/8"))]),
        admin_sources=rng.choice([(), (net("10.20.0.0/16"),)]),
        ssh_sources=rng.choice([(), (net("192.168.0.0/24"), net("2001:db8::/32"))]),
        ssh_port=rng.choice([22, 2222]), rules=rules)
    slurm = SlurmSettings()
    if rng.random() < 0.5:
        lendable = rng.sample([n.node_id for n in nodes], rng.randint(1, count))
        slurm = SlurmSettings(enabled=True, controller=nodes[-1].node_id,
                              nodes=MappingProxyType({n: SlurmNode("p") for n in lendable}),
                              partitions=MappingProxyType({"p": SlurmPartition(default=True)}))
        if rng.random() < 0.6:
            slurm = replace(slurm, shared_path="/srv/shared",
                            shared_export=rng.choice([slurm.controller, *lendable]))
    settings = Settings(ClusterSettings(name="t"), firewall=firewall, slurm=slurm,
                        node_agents=MappingProxyType({"n1": AgentSettings(labels=MappingProxyType({"pool": "gpu"}))}))
    return settings, Fleet(tuple(nodes))


def chain(text: str) -> list[str]:
    """The rules of the table's input chain, in order."""
    body = text[text.index("\tchain input {\n"):]
    return [line.strip() for line in body.splitlines() if line.startswith("\t\t") and "type filter" not in line]


@pytest.mark.parametrize("seed", range(40))
def test_rendered_tables_load_and_keep_their_rules(seed: int) -> None:
    settings, fleet = seeded(seed)
    tables = firewall_tables(settings, fleet)
    assert set(tables) == {n.node_id for n in fleet.nodes if n.alive}
    shuffled = list(fleet.nodes)
    random.Random(seed).shuffle(shuffled)
    assert firewall_tables(settings, Fleet(tuple(shuffled))) == tables
    cluster, slurm = settings.cluster, settings.slurm
    control = settings.firewall.control_planes
    for node_id, table in tables.items():
        node = fleet.node(node_id)
        checked = nft_check(replace_script(table.text))
        assert checked.returncode == 0, (checked.stderr, table.text)
        assert table_refusal(table.text) is None
        rules = chain(table.text)
        assert rules[0] == "ct state established,related accept"
        assert rules[-2:] == ['meta l4proto tcp reject with tcp reset comment "refused"', 'reject comment "refused"']
        assert any(str(control[-1]) in r and r.endswith('accept comment "control planes and gateways"') for r in rules)
        assert "example" not in table.text and table.unknown == tuple(sorted(
            n.node_id for n in fleet.nodes if n.address.endswith(".example")))
        on_control = node.address[0].isdigit() or ":" in node.address
        on_control = on_control and any(net(node.address).subnet_of(n) for n in control
                                        if n.version == net(node.address).version)
        agents = [r for r in rules if r.endswith('comment "agents"')]
        assert bool(agents) == bool(on_control)
        assert all(f"dport {cluster.agents.port} " in r for r in agents)
        assert bool([r for r in rules if r.endswith('"gateway"')]) == bool(on_control)
        slurm_rules = [r for r in rules if r.endswith('"slurm"')]
        member = slurm.enabled and node_id in (slurm.controller, *slurm.nodes)
        assert bool(slurm_rules) == bool(member and any(
            fleet.node(n) and not fleet.node(n).address.endswith(".example") for n in (slurm.controller, *slurm.nodes)))
        nfs_rules = [r for r in rules if r.endswith('"nfs shared path"')]
        others = {fleet.node(n).address for n in (slurm.controller, *slurm.nodes) if n != node_id and fleet.node(n)
                  and not fleet.node(n).address.endswith(".example")}
        exporter = member and bool(slurm.shared_path) and node_id == slurm.shared_export
        assert bool(nfs_rules) == (exporter and bool(others)), (nfs_rules, node_id)
        assert all(" tcp dport 2049 accept " in r for r in nfs_rules)
        nfs_in = {a for r in nfs_rules for a in r[r.index("{") + 1:r.index("}")].replace(" ", "").split(",")}
        assert nfs_in == ({str(net(a)) for a in others} if exporter else set())
        replicas = {s.replica_id for s in node.shards}
        peers = {o.address for o in fleet.nodes if o.node_id != node_id and replicas & {s.replica_id for s in o.shards}
                 and not o.address.endswith(".example")}
        peer_rules = [r for r in rules if r.endswith('"nodes of this node\'s replicas"')]
        let_in = {a for r in peer_rules for a in r[r.index("{") + 1:r.index("}")].replace(" ", "").split(",")}
        assert let_in == {str(net(a)) for a in peers}


def test_the_agents_and_ssh_rules_read_as_written() -> None:
    settings, fleet = seeded(3)
    firewall = FirewallSettings(enabled=True, control_planes=(net("10.20.0.10/32"),),
                                ssh_sources=(net("10.20.0.0/16"), net("fd00:1::/64")),
                                rules=(FirewallRule("exporter", ((9100, 9100), (20000, 20999)), "udp"),))
    settings = replace(settings, firewall=firewall, slurm=SlurmSettings())
    fleet = Fleet((NodeState("cp", "10.20.0.10"), NodeState("a", "10.20.0.21"), NodeState("b", "fd00:1::5")))
    rules = chain(firewall_table(settings, fleet, "cp").text)
    assert 'ip saddr { 10.20.0.10/32, 10.20.0.21/32 } tcp dport 8082 accept comment "agents"' in rules
    assert 'ip6 saddr { fd00:1::5/128 } tcp dport 8082 accept comment "agents"' in rules
    assert 'ip6 saddr { fd00:1::/64 } tcp dport 22 accept comment "ssh"' in rules
    assert 'tcp dport 8080 accept comment "gateway"' in rules  # no gateway_sources: every network
    assert 'udp dport { 9100, 20000-20999 } accept comment "rule exporter"' in rules
    assert not [r for r in chain(firewall_table(settings, fleet, "a").text) if "8082" in r]


def test_off_renders_nothing_and_the_remove_script_touches_only_llmgws_table() -> None:
    settings, fleet = seeded(1)
    off = replace(settings, firewall=replace(settings.firewall, enabled=False))
    assert firewall_tables(off, fleet) == {} and firewall_table(off, fleet, "n0") is None
    assert REMOVE_SCRIPT == "table inet llmgw\ndelete table inet llmgw\n"
    assert nft_check(REMOVE_SCRIPT).returncode == 0


def test_an_address_with_nft_syntax_in_it_is_left_out() -> None:
    settings, _ = seeded(2)
    fleet = Fleet((NodeState("n0", "10.20.0.1"), NodeState("evil", '10.0.0.1 } accept; flush ruleset; #')))
    table = firewall_table(settings, fleet, "n0")
    assert "flush" not in table.text and table.unknown == ("evil",)
    assert nft_check(replace_script(table.text)).returncode == 0


@pytest.mark.parametrize("text", [
    "table inet other {\n}\n",
    "table inet llmgw {\n}\ntable ip nat {\n}\n",
    "table inet llmgw {\n\tchain input {\n\t}\n}\nflush ruleset\n",
    "table inet llmgw {\n\tinclude \"/etc/x\"\n}\n",
])
def test_an_agent_refuses_a_table_that_reaches_beyond_its_own(text: str) -> None:
    assert table_refusal(text)


def test_the_planner_sends_each_node_its_table_and_turning_it_off_sends_the_plain_settings() -> None:
    firewall = FirewallSettings(enabled=True, control_planes=(net("10.20.0.10/32"),))
    on = Settings(ClusterSettings(name="t"), firewall=firewall)
    plain = agent_settings_fingerprint(on, "a")
    fleet = Fleet(tuple(NodeState(n, a, agent_settings_applied=plain) for n, a in (("cp", "10.20.0.10"),
                                                                                     ("a", "10.20.0.21"))))
    sent = {a.node_id: a for a in make_plan(on, fleet).actions if a.kind is ActionKind.CONFIGURE}
    assert set(sent) == {"cp", "a"} and sent["cp"].firewall.digest != sent["a"].firewall.digest
    assert sent["a"].firewall == firewall_table(on, fleet, "a")

    acknowledged = Fleet(tuple(replace(n, agent_settings_applied=sent[n.node_id].fingerprint) for n in fleet.nodes))
    assert not [a for a in make_plan(on, acknowledged).actions if a.kind is ActionKind.CONFIGURE]
    moved = Fleet(tuple(replace(n, address="10.20.0.22") if n.node_id == "a" else n for n in acknowledged.nodes))
    again = [a.node_id for a in make_plan(on, moved).actions if a.kind is ActionKind.CONFIGURE]
    assert again == ["cp"]  # cp's agents' listener lets a's new address in; a's own table names no node address

    off = replace(on, firewall=replace(firewall, enabled=False))
    removed = [a for a in make_plan(off, acknowledged).actions if a.kind is ActionKind.CONFIGURE]
    assert sorted((a.node_id, a.fingerprint, a.firewall) for a in removed) == [("a", plain, None), ("cp", plain, None)]
