"""`llmgw upgrade`'s rollout as a pure state machine: which node gets the release next, and when the rollout stops.

An `Upgrade` holds one `NodeUpgrade` per node, in order. Each node goes WAITING -> SENDING (the release goes over
its stream, installed and `current` flipped: `sent`) -> RESTARTING (its agent re-executes itself; back when it
registers again with the new version) -> GATING (the health gate: every shard it runs is ready again) -> DONE.
At most `max_unavailable` nodes are between SENDING and GATING at once, so with the default 1 the next node starts
only when this one is back and serving. A node that fails (the release refused or its install failed, not back
within `restart_timeout`, back with another version: rolled back by itself, or its replicas not ready within
`ready_timeout`) makes the whole upgrade FAILED with that reason: no further node starts (those under way finish
their phase). PAUSED starts no node and lets those under way finish; `resume` goes on.

`advance(upgrade, seen, now)` takes what the fleet shows now (`NodeSeen` by node id, from the control plane's
state) and returns the next Upgrade and the nodes to send the release to (`SendRelease`): the driver
(`llmgw.control.upgrade_run`) sends it and reports with `sent`. Times are on the control plane's clock (seconds).
Pure: no trio, no I/O; tested on trio's MockClock through the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any


class NodePhase(StrEnum):
    WAITING = "waiting"
    SENDING = "sending"
    RESTARTING = "restarting"
    GATING = "gating"
    DONE = "done"
    FAILED = "failed"


UNAVAILABLE = (NodePhase.SENDING, NodePhase.RESTARTING, NodePhase.GATING)
"""The phases that count against `max_unavailable`."""


class UpgradeState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class NodeSeen:
    """One node as the control plane sees it now: `connected`, its agent's `version`, when it last registered
    (`registered_at`, control-plane clock), whether every shard it runs is ready (`ready`), and the warnings of its
    last Register (a rollback says why there)."""

    connected: bool
    version: str
    registered_at: float
    ready: bool
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeUpgrade:
    """One node's progress: its `phase` since `since`; `from_version` what it ran at the start; `registered_at`
    its registration when the release was sent (a later one is the new agent); `message` what happened last."""

    node_id: str
    phase: NodePhase = NodePhase.WAITING
    since: float = 0.0
    from_version: str = ""
    registered_at: float = 0.0
    message: str = ""


@dataclass(frozen=True)
class SendRelease:
    """Send the release to `node_id` (its pieces, then the install): answer with `sent`."""

    node_id: str


@dataclass(frozen=True)
class Upgrade:
    """A rollout of llmgw `version` over `nodes`, in order (see the module docstring). `reason`: why it failed or
    was paused ("" none); `notes`: nodes left out at the start and why."""

    version: str
    nodes: tuple[NodeUpgrade, ...]
    started_at: float
    max_unavailable: int = 1
    restart_timeout: float = 180.0
    ready_timeout: float = 300.0
    state: UpgradeState = UpgradeState.RUNNING
    reason: str = ""
    ended_at: float | None = None
    notes: tuple[str, ...] = ()

    def node(self, node_id: str) -> NodeUpgrade:
        return next(n for n in self.nodes if n.node_id == node_id)

    def with_node(self, node: NodeUpgrade) -> Upgrade:
        return replace(self, nodes=tuple(node if n.node_id == node.node_id else n for n in self.nodes))

    @property
    def ended(self) -> bool:
        return self.state in (UpgradeState.DONE, UpgradeState.FAILED) and not self.under_way()

    def under_way(self) -> tuple[NodeUpgrade, ...]:
        return tuple(n for n in self.nodes if n.phase in UNAVAILABLE)


def plan_upgrade(version: str, seen: Mapping[str, NodeSeen], now: float, *, max_unavailable: int = 1,
                 restart_timeout: float = 180.0, ready_timeout: float = 300.0, paused: bool = False) -> Upgrade:
    """A new rollout of `version` over the connected nodes of `seen`, in node id order: a node running `version`
    already is DONE at once; a node not connected is left out (a note says so). Raises ValueError when
    `max_unavailable` < 1."""
    if max_unavailable < 1:
        raise ValueError("max_unavailable must be 1 or more")
    nodes, notes = [], []
    for node_id in sorted(seen):
        node = seen[node_id]
        if not node.connected:
            notes.append(f"node {node_id} is not connected: left out (upgrade it once it is back)")
        elif node.version == version:
            nodes.append(NodeUpgrade(node_id, NodePhase.DONE, now, node.version, node.registered_at,
                                     f"runs llmgw {version} already"))
        else:
            nodes.append(NodeUpgrade(node_id, NodePhase.WAITING, now, node.version, node.registered_at))
    upgrade = Upgrade(version, tuple(nodes), now, max_unavailable, restart_timeout, ready_timeout,
                      UpgradeState.PAUSED if paused else UpgradeState.RUNNING, "paused at the start" if paused else "",
                      notes=tuple(notes))
    return _settle(upgrade, now)


def _fail(upgrade: Upgrade, node: NodeUpgrade, message: str, now: float) -> Upgrade:
    failed = replace(node, phase=NodePhase.FAILED, since=now, message=message)
    upgrade = upgrade.with_node(failed)
    if upgrade.state is not UpgradeState.FAILED:  # the first failure is the reason
        upgrade = replace(upgrade, state=UpgradeState.FAILED, reason=message)
    return upgrade


def _settle(upgrade: Upgrade, now: float) -> Upgrade:
    """DONE once every node is; `ended_at` once nothing is under way any more."""
    if upgrade.state in (UpgradeState.RUNNING, UpgradeState.PAUSED) and all(
            n.phase is NodePhase.DONE for n in upgrade.nodes):
        upgrade = replace(upgrade, state=UpgradeState.DONE, reason="")
    if upgrade.ended and upgrade.ended_at is None:
        upgrade = replace(upgrade, ended_at=now)
    return upgrade


def _watch(upgrade: Upgrade, node: NodeUpgrade, seen: NodeSeen | None, now: float) -> Upgrade:
    """One node under way, RESTARTING or GATING, against what is seen of it now."""
    if node.phase is NodePhase.RESTARTING:
        back = seen is not None and seen.connected and seen.registered_at > node.registered_at
        if back and seen.version == upgrade.version:
            return upgrade.with_node(replace(node, phase=NodePhase.GATING, since=now,
                                             message=f"back with llmgw {upgrade.version}"))
        if back:
            said = next((w for w in seen.warnings if "rolled back" in w), "")
            return _fail(upgrade, node, f"node {node.node_id} came back with llmgw {seen.version or '?'}, not "
                                        f"{upgrade.version}" + (f": {said}" if said else ""), now)
        if now - node.since >= upgrade.restart_timeout:
            return _fail(upgrade, node, f"node {node.node_id} did not come back with llmgw {upgrade.version} within "
                                        f"{upgrade.restart_timeout:g} s", now)
        return upgrade
    if seen is not None and seen.connected and seen.ready:
        return upgrade.with_node(replace(node, phase=NodePhase.DONE, since=now,
                                         message=f"runs llmgw {upgrade.version}, its replicas ready"))
    if now - node.since >= upgrade.ready_timeout:
        return _fail(upgrade, node, f"the replicas of node {node.node_id} were not ready within "
                                    f"{upgrade.ready_timeout:g} s of its upgrade", now)
    return upgrade


def advance(upgrade: Upgrade, seen: Mapping[str, NodeSeen], now: float) -> tuple[Upgrade, tuple[SendRelease, ...]]:
    """The rollout at `now` given the fleet as `seen`, and the nodes to send the release to now (module
    docstring). Never raises; an ended rollout is returned unchanged."""
    for node in upgrade.nodes:
        if node.phase in (NodePhase.RESTARTING, NodePhase.GATING):
            upgrade = _watch(upgrade, upgrade.node(node.node_id), seen.get(node.node_id), now)
    sends: list[SendRelease] = []
    if upgrade.state is UpgradeState.RUNNING:
        room = upgrade.max_unavailable - len(upgrade.under_way())
        for node in upgrade.nodes:
            if room <= 0:
                break
            if node.phase is not NodePhase.WAITING:
                continue
            now_seen = seen.get(node.node_id)
            if now_seen is None or not now_seen.connected:
                upgrade = _fail(upgrade, node, f"node {node.node_id} is not connected", now)
                break
            upgrade = upgrade.with_node(replace(node, phase=NodePhase.SENDING, since=now,
                                                registered_at=now_seen.registered_at,
                                                message=f"receiving llmgw {upgrade.version}"))
            sends.append(SendRelease(node.node_id))
            room -= 1
    return _settle(upgrade, now), tuple(sends)


def sent(upgrade: Upgrade, node_id: str, error: str, now: float) -> Upgrade:
    """The release was sent to `node_id`: installed and `current` flipped (`error` ""), so its agent restarts; or it
    failed with `error` (the upgrade fails)."""
    node = upgrade.node(node_id)
    if error:
        return _settle(_fail(upgrade, node, f"node {node_id}: {error}", now), now)
    return upgrade.with_node(replace(node, phase=NodePhase.RESTARTING, since=now,
                                     message=f"restarting into llmgw {upgrade.version}"))


def pause(upgrade: Upgrade) -> Upgrade:
    """No further node starts (those under way finish); unchanged once ended."""
    if upgrade.state is not UpgradeState.RUNNING:
        return upgrade
    return replace(upgrade, state=UpgradeState.PAUSED, reason="paused (`llmgw upgrade --resume` goes on)")


def resume(upgrade: Upgrade) -> Upgrade:
    """Go on after `pause`; unchanged unless paused."""
    if upgrade.state is not UpgradeState.PAUSED:
        return upgrade
    return replace(upgrade, state=UpgradeState.RUNNING, reason="")


def next_deadline(upgrade: Upgrade) -> float | None:
    """When a node under way times out next (control-plane clock); None when none can."""
    deadlines = [n.since + (upgrade.restart_timeout if n.phase is NodePhase.RESTARTING else upgrade.ready_timeout)
                 for n in upgrade.nodes if n.phase in (NodePhase.RESTARTING, NodePhase.GATING)]
    return min(deadlines, default=None)


def upgrade_document(upgrade: Upgrade, to_unix: float = 0.0) -> dict[str, Any]:
    """The rollout as `llmgw status` and the console show it; times + `to_unix` (the clock's offset to unix
    seconds). Counts per phase in "counts"."""
    counts: dict[str, int] = {}
    for node in upgrade.nodes:
        counts[node.phase.value] = counts.get(node.phase.value, 0) + 1
    return {
        "version": upgrade.version, "state": upgrade.state.value, "reason": upgrade.reason,
        "max_unavailable": upgrade.max_unavailable, "started_at": upgrade.started_at + to_unix,
        "ended_at": None if upgrade.ended_at is None else upgrade.ended_at + to_unix,
        "counts": counts, "notes": list(upgrade.notes),
        "nodes": [{"node": n.node_id, "phase": n.phase.value, "from": n.from_version, "message": n.message,
                   "since": n.since + to_unix} for n in upgrade.nodes],
    }
