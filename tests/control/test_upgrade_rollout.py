"""`llmgw upgrade`'s rollout (llmgw.control.upgrades, driven by llmgw.control.upgrade_run.UpgradeRunner) on trio's
MockClock against a simulated fleet: each node takes `INSTALL` s to install, is away `AWAY` s while its agent
re-executes, and its replicas are ready `READY` s after it is back.

Rules checked: at most `max_unavailable` nodes between the send and the health gate at once, in node order; the
next node starts only once the one before is back with the new version and ready; a node that comes back with the
old version (rolled back by itself) or not at all within the timeout fails the whole upgrade with that reason and
no further node starts; pause starts no node until resume; a node on the version already is done at once."""

from __future__ import annotations

import trio

from llmgw.control.upgrades import NodePhase, NodeSeen, UpgradeState, advance, plan_upgrade, upgrade_document
from llmgw.control.upgrade_run import UpgradeRunner

INSTALL, AWAY, READY = 5.0, 3.0, 2.0


class Fleet:
    """Nodes that upgrade as told: `broken` ones come back with the old version (rolled back), `lost` ones never."""

    def __init__(self, names, version="0.1.0", broken=(), lost=()):
        self.seen = {n: NodeSeen(True, version, 0.0, True) for n in names}
        self.broken, self.lost = set(broken), set(lost)
        self.log: list[tuple[float, str, str]] = []
        self.away: set[str] = set()
        self.most_away = 0

    async def send(self, node: str, version: str, nursery: trio.Nursery) -> str:
        self.log.append((trio.current_time(), node, "send"))
        self.away.add(node)
        self.most_away = max(self.most_away, len(self.away))
        await trio.sleep(INSTALL)
        nursery.start_soon(self._restart, node, version)
        return ""

    async def _restart(self, node: str, version: str) -> None:
        old = self.seen[node]
        self.seen[node] = NodeSeen(False, old.version, old.registered_at, False)
        await trio.sleep(AWAY)
        if node in self.lost:
            return
        if node in self.broken:
            self.seen[node] = NodeSeen(True, old.version, trio.current_time(), True,
                                       (f"the upgrade to llmgw {version} was rolled back to {old.version}: the agent "
                                        f"of llmgw {version} exited before it registered",))
            self.away.discard(node)
            return
        self.seen[node] = NodeSeen(True, version, trio.current_time(), False)
        await trio.sleep(READY)
        self.seen[node] = NodeSeen(True, version, self.seen[node].registered_at, True)
        self.log.append((trio.current_time(), node, "ready"))
        self.away.discard(node)


async def _rollout(fleet: Fleet, **options):
    published = []
    runner = UpgradeRunner(published.append, lambda: dict(fleet.seen))
    async with trio.open_nursery() as nursery:
        runner.start(nursery, "0.1.1", lambda node: fleet.send(node, "0.1.1", nursery), **options)
        while not runner.current.ended:
            await runner.changed.wait()
    return runner.current, published


async def test_nodes_upgrade_one_at_a_time_each_after_the_one_before_is_back_and_ready(autojump_clock):
    fleet = Fleet(["a", "b", "c"])
    started = trio.current_time()
    upgrade, published = await _rollout(fleet)
    assert upgrade.state is UpgradeState.DONE and upgrade.reason == ""
    assert [e[1:] for e in fleet.log] == [("a", "send"), ("a", "ready"), ("b", "send"), ("b", "ready"),
                                          ("c", "send"), ("c", "ready")]
    assert fleet.most_away == 1
    sends = [t for t, _, what in fleet.log if what == "send"]
    readies = [t for t, _, what in fleet.log if what == "ready"]
    assert all(send >= ready for send, ready in zip(sends[1:], readies))  # the health gate holds the next node
    per_node = INSTALL + AWAY + READY
    assert 3 * per_node <= upgrade.ended_at - started <= 3 * per_node + 3  # polls of 0.2 s between phases
    phases = {(n.node_id, n.phase) for u in published for n in u.nodes}
    assert {("a", p) for p in (NodePhase.SENDING, NodePhase.RESTARTING, NodePhase.GATING, NodePhase.DONE)} <= phases
    assert all(n.phase is NodePhase.DONE for n in upgrade.nodes)


async def test_max_unavailable_two_upgrades_two_nodes_at_once(autojump_clock):
    fleet = Fleet(["a", "b", "c", "d"])
    upgrade, _ = await _rollout(fleet, max_unavailable=2)
    assert upgrade.state is UpgradeState.DONE
    assert fleet.most_away == 2
    sends = {node: t for t, node, what in fleet.log if what == "send"}
    assert sends["a"] == sends["b"] < sends["c"]


async def test_a_node_that_rolls_back_stops_the_upgrade_with_its_reason(autojump_clock):
    fleet = Fleet(["a", "b", "c"], broken={"b"})
    upgrade, _ = await _rollout(fleet)
    assert upgrade.state is UpgradeState.FAILED
    assert upgrade.reason == ("node b came back with llmgw 0.1.0, not 0.1.1: the upgrade to llmgw 0.1.1 was rolled "
                              "back to 0.1.0: the agent of llmgw 0.1.1 exited before it registered")
    assert [n.phase for n in upgrade.nodes] == [NodePhase.DONE, NodePhase.FAILED, NodePhase.WAITING]
    assert ("c", "send") not in [e[1:] for e in fleet.log]


async def test_a_node_that_does_not_come_back_fails_at_its_timeout(autojump_clock):
    fleet = Fleet(["a", "b"], lost={"a"})
    started = trio.current_time()
    upgrade, _ = await _rollout(fleet, restart_timeout=30.0)
    assert upgrade.state is UpgradeState.FAILED
    assert upgrade.reason == "node a did not come back with llmgw 0.1.1 within 30 s"
    assert INSTALL + 30 <= upgrade.ended_at - started <= INSTALL + 30.5
    assert upgrade.node("b").phase is NodePhase.WAITING


async def test_pause_starts_no_node_until_resume(autojump_clock):
    fleet = Fleet(["a", "b"])
    runner = UpgradeRunner(lambda _: None, lambda: dict(fleet.seen))
    async with trio.open_nursery() as nursery:
        runner.start(nursery, "0.1.1", lambda node: fleet.send(node, "0.1.1", nursery))
        await trio.sleep(1)
        runner.pause()
        await trio.sleep(100)
        assert [e[1:] for e in fleet.log] == [("a", "send"), ("a", "ready")]  # a finished, b never started
        assert runner.current.state is UpgradeState.PAUSED and runner.current.node("b").phase is NodePhase.WAITING
        assert upgrade_document(runner.current)["counts"] == {"done": 1, "waiting": 1}
        runner.resume()
        while not runner.current.ended:
            await runner.changed.wait()
    assert runner.current.state is UpgradeState.DONE


def test_nodes_on_the_version_already_are_done_and_nodes_away_are_left_out():
    seen = {"a": NodeSeen(True, "0.1.1", 1.0, True), "b": NodeSeen(False, "0.1.0", 1.0, False)}
    upgrade = plan_upgrade("0.1.1", seen, 10.0)
    assert upgrade.state is UpgradeState.DONE and upgrade.ended_at == 10.0
    assert upgrade.notes == ("node b is not connected: left out (upgrade it once it is back)",)
    assert advance(upgrade, seen, 11.0) == (upgrade, ())


def test_a_failed_install_fails_the_upgrade_with_the_agents_sentence():
    from llmgw.control.upgrades import sent

    seen = {"a": NodeSeen(True, "0.1.0", 1.0, True), "b": NodeSeen(True, "0.1.0", 1.0, True)}
    upgrade, sends = advance(plan_upgrade("0.1.1", seen, 0.0), seen, 0.0)
    assert [s.node_id for s in sends] == ["a"]
    upgrade = sent(upgrade, "a", "the release tar has sha256 x, y was announced: send it again", 3.0)
    assert upgrade.state is UpgradeState.FAILED and upgrade.ended_at == 3.0
    assert upgrade.reason == "node a: the release tar has sha256 x, y was announced: send it again"
    assert advance(upgrade, seen, 4.0)[1] == ()


def test_the_health_gate_waits_for_the_shards_llmgw_runs_and_not_for_foreign_engines():
    from llmgw.control.registry import FleetRegistry
    from llmgw.control.state import ControlState
    from llmgw.control.upgrade_run import node_seen
    from llmgw.identity import ShardState
    from llmgw.plan.types import NodeState, ObservedShard

    def seen(*shards: ObservedShard) -> NodeSeen:
        registry, _ = FleetRegistry(lost_after=30.0).register(NodeState("n", shards=shards), 5.0,
                                                             agent_version="0.1.1")
        return node_seen(ControlState(fleet=registry))["n"]

    ours = ObservedShard("m-0/0", "m-0", "m", ShardState.READY)
    starting = ObservedShard("m-1/0", "m-1", "m", ShardState.STARTING)
    foreign = ObservedShard("foreign-1", "", "", ShardState.STARTING, adopted_foreign=True)
    assert seen(ours, foreign) == NodeSeen(True, "0.1.1", 5.0, True)
    assert not seen(ours, starting).ready
    assert seen().ready  # a node without shards is ready once back
