"""The node's table applied for real, in network namespaces (issue 29): a control plane, a node and a client
host on one bridge (tests/support/netns.py), the node's table rendered by llmgw.plan.firewall and applied by the
agent's FirewallKeeper with nft inside the node's namespace.

- a client host that is not a control plane is refused at once (TCP reset) on an engine port, over IPv4 and IPv6,
  while the control plane connects, and on slurmd's port, which Slurm's controller reaches; turning the firewall off opens the port again;
- another program's table on the node survives every apply and the removal (`nft -j list ruleset`);
- a table that fails to load is reported with nft's own message and the previous table stays;
- a table that cuts the agent off its control plane is rolled back by the agent within the set time, and one that
  does not is kept;
- on a host llmgw installed, the table is listed in the install journal before it loads, once, and undoing the
  journal (`llmgw wipe`) removes it and leaves the other program's table; a host without a journal gets none;
- a fabric test's client is let in on its port for the test's time only (IPv4 and IPv6), and no other host is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from types import MappingProxyType

import trio

from llmgw.agent.firewall import FirewallKeeper
from llmgw.install.journal import FirewallTable, Journal
from llmgw.install.undoing import undo
from llmgw.plan.firewall import firewall_table
from llmgw.plan.types import Fleet, NodeState
from llmgw.settings.firewall import FirewallSettings, control_plane_addresses
from llmgw.settings.model import ClusterSettings, Settings
from llmgw.settings.slurm import DEFAULT_PORTS, SlurmNode, SlurmPartition, SlurmSettings
from llmgw.tools.nft import ruleset_rules, ruleset_tables
from support.netns_probes import connect, listen

ENGINE_PORT = 18080
AGENTS_PORT = 18082
OTHER = """table inet other {
\tchain input {
\t\ttype filter hook input priority 10; policy accept;
\t\ttcp dport 9 counter accept comment "another program's rule"
\t}
}
"""


def lab_settings(lab, hosts) -> tuple[Settings, Fleet]:
    """The firewall on, the control plane `cp`; with a host `slurmctl`, Slurm on, its controller there and `node`
    its one node."""
    cp, node = hosts["cp"], hosts["node"]
    firewall = FirewallSettings(enabled=True, control_planes=control_plane_addresses(
        [f"{cp.address}:{AGENTS_PORT}", f"[{cp.address6}]:{AGENTS_PORT}"]), rollback_after_seconds=1.0)
    states = [NodeState("cp", cp.address), NodeState("node", node.address)]
    slurm = SlurmSettings()
    if "slurmctl" in hosts:
        states.append(NodeState("slurmctl", hosts["slurmctl"].address))
        slurm = SlurmSettings(enabled=True, controller="slurmctl", nodes=MappingProxyType({"node": SlurmNode("p")}),
                              partitions=MappingProxyType({"p": SlurmPartition(default=True)}))
    return Settings(ClusterSettings(name="lab"), firewall=firewall, slurm=slurm), Fleet(tuple(states))


def ruleset(host) -> str:
    return host.run(["nft", "-j", "list", "ruleset"]).stdout


def without_handles(document: str) -> list[dict]:
    return [{k: v for k, v in rule.items() if k != "handle"} for rule in ruleset_rules(document, "inet", "llmgw")]


async def test_a_client_is_refused_at_once_while_the_control_plane_connects(netns_lab) -> None:
    hosts = {name: netns_lab.host(name) for name in ("cp", "node", "client", "slurmctl")}
    cp, node, client, slurmctl = hosts["cp"], hosts["node"], hosts["client"], hosts["slurmctl"]
    node.run(["nft", "-f", "-"], input=OTHER)
    listen(node, ENGINE_PORT)
    listen(node, DEFAULT_PORTS["slurmd"])
    assert connect(client, node.address, ENGINE_PORT) == "open"
    settings, fleet = lab_settings(netns_lab, hosts)
    table = firewall_table(settings, fleet, "node")
    async with trio.open_nursery() as nursery:
        keeper = FirewallKeeper(nursery, nft=node.argv(["nft"]))
        state = await keeper.apply(table.text, table.digest)
        assert state.digest == table.digest and not state.error
        document = ruleset(node)
        assert await keeper.apply(table.text, table.digest) == state and ruleset(node) == document  # nothing to do
        for address in (node.address, node.address6):
            refused = connect(client, address, ENGINE_PORT)
            assert refused.startswith("refused") and float(refused.split()[1]) < 0.5, (address, refused)
            assert connect(cp, address, ENGINE_PORT) == "open", address
        for address in (node.address, node.address6):  # Slurm's port: from Slurm's hosts only
            assert connect(client, address, DEFAULT_PORTS["slurmd"]).startswith("refused"), address
        assert connect(slurmctl, node.address, DEFAULT_PORTS["slurmd"]) == "open"
        document = ruleset(node)
        assert ruleset_tables(document) == [("inet", "other"), ("inet", "llmgw")]
        comments = [rule.get("comment") for rule in ruleset_rules(document, "inet", "llmgw")]
        assert comments[-2:] == ["refused", "refused"] and "control planes and gateways" in comments
        assert [r.get("comment") for r in ruleset_rules(document, "inet", "other")] == ["another program's rule"]

        broken = table.text.replace('reject comment "refused"', "reject with bogus")
        state = await keeper.apply(broken, "0" * 16)
        assert state.digest == table.digest and state.error.startswith("nft refused the table:")
        assert "syntax error" in state.error and "bogus" in state.error
        assert ruleset(node) == document and connect(client, node.address, ENGINE_PORT).startswith("refused")

        state = await keeper.apply(table.text, table.digest)  # sent again after the failure: applied again
        assert not state.error and without_handles(ruleset(node)) == without_handles(document)

        state = await keeper.apply("", "")  # firewall.yaml off: llmgw's table goes, the other stays
        assert state.digest == "" and ruleset_tables(ruleset(node)) == [("inet", "other")]
        assert connect(client, node.address, ENGINE_PORT) == "open"


async def test_the_table_is_in_the_install_journal_and_a_wipe_removes_it(netns_lab, tmp_path) -> None:
    hosts = {name: netns_lab.host(name) for name in ("cp", "node")}
    node = hosts["node"]
    node.run(["nft", "-f", "-"], input=OTHER)
    settings, fleet = lab_settings(netns_lab, hosts)
    table = firewall_table(settings, fleet, "node")
    journal = Journal.open(tmp_path / "llmgw-install" / "journal.json")  # as `llmgw node add` leaves it
    installed = journal.entries
    nowhere = tmp_path / "not-installed" / "journal.json"
    async with trio.open_nursery() as nursery:
        keeper = FirewallKeeper(nursery, nft=node.argv(["nft"]), journal=journal.path)
        assert not (await keeper.apply(table.text, table.digest)).error
        assert Journal.read(journal.path).entries == (*installed, FirewallTable("inet", "llmgw"))
        changed = table.text.replace("ssh", "ssh again")
        assert not (await keeper.apply(changed, "3" * 16)).error
        assert Journal.read(journal.path).entries == (*installed, FirewallTable("inet", "llmgw"))  # listed once
        elsewhere = FirewallKeeper(nursery, nft=node.argv(["nft"]), journal=nowhere)
        assert not (await elsewhere.apply(table.text, table.digest)).error
    assert not nowhere.parent.exists()  # no journal there: nothing recorded, nothing made

    outcomes = undo(Journal.read(journal.path), run=lambda argv: node.run(argv, check=False))
    assert [(o.entry, o.action) for o in outcomes][0] == (FirewallTable("inet", "llmgw"), "removed")
    assert ruleset_tables(ruleset(node)) == [("inet", "other")]
    assert not journal.path.exists()  # everything it listed is undone


ROLLBACK = """
import json, sys, trio
from llmgw.agent.firewall import FirewallKeeper
from llmgw.install.journal import FirewallTable, Journal
from llmgw.install.undoing import undo

async def main():
    first, second, control_plane, wait = json.loads(sys.stdin.read())
    async with trio.open_nursery() as nursery:
        keeper = FirewallKeeper(nursery)
        await keeper.apply(first, "1" * 16)  # no control plane: no watch
        await keeper.apply(second, "2" * 16, rollback_after=1.0, control_planes=[control_plane])
        await trio.sleep(wait)
        state = vars(keeper.state)
        again = await keeper.apply(second, "2" * 16, rollback_after=1.0, control_planes=[control_plane])
        print(json.dumps({**state, "again": again.error}))
        nursery.cancel_scope.cancel()

trio.run(main)
"""


def run_agent_keeper(node, first: str, second: str, control_plane: str, wait: float) -> dict:
    """A FirewallKeeper inside the node's namespace, as the agent runs there: apply `first`, then `second` with a
    rollback watch of 1 s toward `control_plane`; its state after `wait` seconds."""
    done = node.run([sys.executable, "-c", ROLLBACK], input=json.dumps([first, second, control_plane, wait]),
                    check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_table_that_cuts_the_agent_off_is_rolled_back_and_one_that_does_not_is_kept(netns_lab) -> None:
    hosts = {name: netns_lab.host(name) for name in ("cp", "node")}
    cp, node = hosts["cp"], hosts["node"]
    listen(cp, AGENTS_PORT)
    settings, fleet = lab_settings(netns_lab, hosts)
    table = firewall_table(settings, fleet, "node")
    cutting = table.text.replace("\t\tct state established,related accept\n",
                                 f"\t\tip saddr {cp.address} drop comment \"cuts the agent off\"\n"
                                 "\t\tct state established,related accept\n")
    control_plane = f"{cp.address}:{AGENTS_PORT}"

    kept = run_agent_keeper(node, table.text, table.text.replace("ssh", "ssh again"), control_plane, 1.5)
    assert kept == {"digest": "2" * 16, "error": "", "rolled_back": "", "again": ""}
    assert "ssh again" in node.run(["nft", "list", "table", "inet", "llmgw"]).stdout

    rolled = run_agent_keeper(node, table.text, cutting, control_plane, 2.5)
    assert rolled["digest"] == "1" * 16 and rolled["rolled_back"] == "2" * 16
    assert "rolled back: no control plane" in rolled["error"] and "within 1 s" in rolled["error"]
    assert rolled["again"].endswith("it is not applied again: change firewall.yaml")  # sent again: refused
    listed = node.run(["nft", "list", "table", "inet", "llmgw"]).stdout
    assert "cuts the agent off" not in listed and "control planes and gateways" in listed


def test_the_lab_is_unreachable_from_the_root_namespace_and_gone_after() -> None:
    from support.netns import open_lab

    def route(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", *argv], capture_output=True, text=True)

    with open_lab() as lab:
        host = lab.host("h")
        shown = host.run(["ip", "-br", "addr", "show", "eth0"]).stdout.split()
        assert f"{host.address}/24" in shown and f"{host.address6}/64" in shown
        for address in (host.address, host.address6):
            assert "No route to host" in route("route", "get", address).stderr  # nothing leaves the machine
        netns = host.netns
    assert netns not in route("netns", "list").stdout
    assert str(lab.network) not in route("route").stdout and str(lab.network6) not in route("-6", "route").stdout


async def test_a_fabric_tests_client_is_let_in_on_its_port_until_the_time_runs_out(netns_lab) -> None:
    hosts = {name: netns_lab.host(name) for name in ("cp", "node", "client", "other")}
    node, client, other = hosts["node"], hosts["client"], hosts["other"]
    listen(node, ENGINE_PORT)
    listen(node, ENGINE_PORT + 1)
    settings, fleet = lab_settings(netns_lab, hosts)
    table = firewall_table(settings, fleet, "node")
    async with trio.open_nursery() as nursery:
        keeper = FirewallKeeper(nursery, nft=node.argv(["nft"]))
        assert await keeper.let_in(client.address, ENGINE_PORT, 1) == ""  # no table yet: nothing to open
        await keeper.apply(table.text, table.digest)
        assert connect(client, node.address, ENGINE_PORT).startswith("refused")
        for address in (client.address, client.address6):
            assert await keeper.let_in(address, ENGINE_PORT, 2) == ""
        assert connect(client, node.address, ENGINE_PORT) == "open"
        assert connect(client, node.address6, ENGINE_PORT) == "open"
        assert connect(other, node.address, ENGINE_PORT).startswith("refused")
        assert connect(client, node.address, ENGINE_PORT + 1).startswith("refused")  # that port only
        with trio.fail_after(5):  # the element's timeout closes the hole by itself
            while connect(client, node.address, ENGINE_PORT) == "open":
                await trio.sleep(0.1)
        assert "not an IP address" in await keeper.let_in("far.example", ENGINE_PORT, 2)
