"""The fleet registry: what every agent last reported, and which nodes are lost.

Pure and single-owner: the control plane's tasks call it from one trio thread, and every record it holds is
an immutable value replaced as a whole (`NodeRecord`, `NodeState`, `ObservedShard`). Times are seconds on the
caller's clock (`trio.current_time()` in the control plane; any monotonic number in tests).

Transitions of one node:

    (unknown) --register--> connected --stream ends--> disconnected --silent > lost_after--> lost
        ^                       |  ^                        |                                  |
        |                       |  +------ heartbeat -------+                                  |
        +------------------------------------------ register (shards adopted) ----------------+

A node counts as alive while it is connected or was heard from less than `lost_after` seconds ago: a
stream that breaks for a moment does not move its replicas. A lost node is offered to the planner with
`alive=False` and no shards, so its replicas are placed elsewhere; when it registers again it reports the
shards it still runs, and they are adopted as they are (the planner keeps them), never restarted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from llmgw.plan.types import Fleet, NodeState, ObservedShard


@dataclass(frozen=True)
class ShardDetail:
    """What an agent said about a shard beyond `ObservedShard`: pid, progress (0..1, None when unknown), log tail."""

    pid: int = 0
    progress: float | None = None
    progress_text: str = ""
    last_log_lines: tuple[str, ...] = ()
    adopted: bool = False


@dataclass(frozen=True)
class NodeRecord:
    """One node as the registry knows it.

    `state` is the node as last reported (shards included, even while lost). `last_seen` is the time of its
    last message; `lost` True once silent for longer than the registry's `lost_after`. Engine processes llmgw did not start are in
    `state.shards` with `adopted_foreign=True`: reported, never stopped.
    `engine_errors` maps "llama.cpp@b11434" to the last install error.
    """

    state: NodeState
    last_seen: float
    connected: bool = True
    lost: bool = False
    os: str = ""
    arch: str = ""
    agent_version: str = ""
    warnings: tuple[str, ...] = ()
    details: Mapping[str, ShardDetail] = field(default_factory=lambda: MappingProxyType({}))
    engine_errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def node_id(self) -> str:
        return self.state.node_id


def _shard_key(shards: Iterable[ObservedShard]) -> tuple:
    """What of a shard list matters to planning and routing (not restart counters or error wording)."""
    return tuple(sorted((s.shard_id, s.state.value, s.port, s.fingerprint) for s in shards))


class FleetRegistry:
    """Every node that registered, keyed by node id.

    Every mutating method returns True when something changed that planning or routing depends on
    (a node appearing or becoming lost, a shard's state, port or fingerprint), so the caller knows to
    bring the next reconcile pass forward and rebuild the routing table.
    """

    def __init__(self, lost_after: float):
        self.lost_after = lost_after
        self._records: dict[str, NodeRecord] = {}

    # -- reading ------------------------------------------------------------------------------------------

    def records(self) -> tuple[NodeRecord, ...]:
        """Every record, by node id."""
        return tuple(self._records[k] for k in sorted(self._records))

    def get(self, node_id: str) -> NodeRecord | None:
        return self._records.get(node_id)

    def fleet(self) -> Fleet:
        """The fleet as the planner sees it: lost nodes with `alive=False` and no shards, by node id."""
        nodes = []
        for record in self.records():
            if record.lost:
                nodes.append(replace(record.state, alive=False, shards=()))
            else:
                nodes.append(replace(record.state, alive=True))
        return Fleet(nodes=tuple(nodes))

    # -- transitions --------------------------------------------------------------------------------------

    def register(
        self,
        node: NodeState,
        now: float,
        *,
        details: Mapping[str, ShardDetail] | None = None,
        os: str = "",
        arch: str = "",
        agent_version: str = "",
        warnings: Iterable[str] = (),
    ) -> bool:
        """A node (re)registered: record it as connected and alive with the shards it reports (adopted)."""
        old = self._records.get(node.node_id)
        self._records[node.node_id] = NodeRecord(
            state=replace(node, alive=True),
            last_seen=now,
            connected=True,
            lost=False,
            os=os,
            arch=arch,
            agent_version=agent_version,
            warnings=tuple(warnings),
            details=MappingProxyType(dict(details or {})),
        )
        return (
            old is None
            or old.lost
            or _shard_key(old.state.shards) != _shard_key(node.shards)
            or old.state.gpus != node.gpus
        )

    def heartbeat(
        self,
        node_id: str,
        now: float,
        *,
        shards: Iterable[ObservedShard] | None = None,
        details: Mapping[str, ShardDetail] | None = None,
        engines_installed: Iterable[str] | None = None,
        engines_installing: Iterable[str] | None = None,
    ) -> bool:
        """A heartbeat: the node is alive; `shards` (when given) is its full shard list now.

        A heartbeat from a node that never registered is ignored (returns False): the agent registers first.
        """
        old = self._records.get(node_id)
        if old is None:
            return False
        state = old.state
        if shards is not None:
            state = replace(state, shards=tuple(shards))
        if engines_installed is not None:
            state = replace(state, engines_installed=frozenset(engines_installed))
        if engines_installing is not None:
            state = replace(state, engines_installing=frozenset(engines_installing))
        record = replace(old, state=state, last_seen=now, lost=False, connected=True)
        if details is not None:
            record = replace(record, details=MappingProxyType(dict(details)))
        self._records[node_id] = record
        return (
            old.lost
            or _shard_key(old.state.shards) != _shard_key(state.shards)
            or old.state.engines_installed != state.engines_installed
            or old.state.engines_installing != state.engines_installing
        )

    def shard_status(self, node_id: str, shard: ObservedShard, now: float, detail: ShardDetail | None = None) -> bool:
        """One shard changed state: replace it in the node's list (or add it). Unknown node: ignored."""
        old = self._records.get(node_id)
        if old is None:
            return False
        shards = [s for s in old.state.shards if s.shard_id != shard.shard_id]
        shards.append(shard)
        shards.sort(key=lambda s: s.shard_id)
        details = dict(old.details)
        if detail is not None:
            details[shard.shard_id] = detail
        record = replace(
            old, state=replace(old.state, shards=tuple(shards)), last_seen=now, lost=False, connected=True,
            details=MappingProxyType(details),
        )
        self._records[node_id] = record
        return old.lost or _shard_key(old.state.shards) != _shard_key(record.state.shards)

    def engine_status(self, node_id: str, engine: str, state: str, error: str, now: float) -> bool:
        """An engine install progressed: "installing", "installed" or "failed" (with `error`)."""
        old = self._records.get(node_id)
        if old is None:
            return False
        installed = set(old.state.engines_installed)
        installing = set(old.state.engines_installing)
        errors = dict(old.engine_errors)
        installing.discard(engine)
        errors.pop(engine, None)
        if state == "installing":
            installing.add(engine)
        elif state == "installed":
            installed.add(engine)
        elif state == "failed":
            errors[engine] = error or "failed without a reason"
        state_value = replace(old.state, engines_installed=frozenset(installed), engines_installing=frozenset(installing))
        self._records[node_id] = replace(
            old, state=state_value, last_seen=now, lost=False, connected=True, engine_errors=MappingProxyType(errors)
        )
        return state_value != old.state or old.lost

    def disconnect(self, node_id: str, now: float) -> bool:
        """The node's stream ended. It stays alive until `lost_after` has passed since it was last heard from."""
        old = self._records.get(node_id)
        if old is None or not old.connected:
            return False
        self._records[node_id] = replace(old, connected=False)
        return False

    def expire(self, now: float) -> tuple[str, ...]:
        """Mark nodes silent for more than `lost_after` seconds as lost; return the ids newly lost."""
        lost = []
        for node_id, record in self._records.items():
            if not record.lost and now - record.last_seen > self.lost_after:
                self._records[node_id] = replace(record, lost=True, connected=False)
                lost.append(node_id)
        return tuple(sorted(lost))

    def next_expiry(self) -> float | None:
        """The time at which the next node would become lost if it stays silent; None when none can."""
        times = [r.last_seen + self.lost_after for r in self._records.values() if not r.lost]
        return min(times) if times else None
