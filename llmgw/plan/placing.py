"""Stage 2 of the planner: placing the replicas that have no current shard, and saying why when none fits.

Private to llmgw.plan (see llmgw.plan.planning for the whole pass). Replicas are placed bigger first, then by
model and index. GPU replicas look only at nodes with enough free devices of their class, fewest free first
(best fit, through `ClassIndex`); CPU replicas prefer nodes without GPUs, most free cores first. Among fitting
nodes the order of preference is: engine installed and no replica of the model yet; engine to install and no
replica of the model yet; engine installed; engine to install (replicas of one model spread over nodes, packed
only when needed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.plan.capacity import ClassIndex, Demand, Room
from llmgw.plan.cordons import closed_nodes, evicted_nodes
from llmgw.identity import ShardState, describe_engine, new_shard_id, replica_index
from llmgw.plan.identity import replica_ids
from llmgw.plan.types import Action, ActionKind, Assignment, NodeState, ObservedShard, Unplaced
from llmgw.settings.model import Settings

ALL_NODES = "all nodes"
_GROUP_REASONS_ABOVE = 12


@dataclass
class Pending:
    """A replica waiting for a place; `old` are its previous generation's shards still serving; `draining` the
    (node id, shard id) of one of its shards being stopped (STOPPING: draining its requests in flight), if any."""

    replica_id: str
    demand: Demand
    taken: set[str]
    old: list[tuple[NodeState, ObservedShard]] = field(default_factory=list)
    previous_node: str = ""
    reason: str = "new replica"
    draining: tuple[str, str] | None = None



class Placement:
    """The mutable state of one planning pass and its stage-2 steps (subclassed by the planner)."""

    def __init__(self, settings: Settings, nodes: list[NodeState]):
        self.settings = settings
        self.nodes = nodes
        self.alive = [n for n in nodes if n.alive]
        self.labels: dict[str, dict[str, str]] = {}
        self.actions: list[Action] = []
        self.assignments: list[Assignment] = []
        self.unplaced: list[Unplaced] = []
        self.notes: list[str] = []
        self.holds: list[tuple[str, tuple[str, ...], float, int, str | None]] = []
        self.rooms: dict[str, Room] = {}
        self.index: ClassIndex | None = None
        self.planned_installs: set[tuple[str, str]] = set()
        self.ready: dict[str, set[str]] = {}
        self.generation = 0
        self.failed: dict[int, tuple[int, tuple[tuple[str, str], ...]]] = {}
        self.old_keeps: dict[tuple[str, str], int] = {}
        self.closed = closed_nodes(settings, nodes)  # node id -> why no new replica goes there (cordons.py)
        self.evicted = evicted_nodes(settings)

    def node_labels(self, node: NodeState) -> dict[str, str]:
        """The node's reported labels with its agent settings' labels over them."""
        labels = self.labels.get(node.node_id)
        if labels is None:
            labels = dict(node.labels)
            labels.update(self.settings.agent_settings_for(node.node_id).labels)
            self.labels[node.node_id] = labels
        return labels

    def build_rooms(self) -> None:
        rooms = {}
        for node in self.alive:
            agent = self.settings.agent_settings_for(node.node_id)
            rooms[node.node_id] = Room(node, self.node_labels(node), frozenset(agent.ignore_gpus))
        self.rooms = rooms
        self.index = ClassIndex(list(rooms.values()))
        for node_id, devices, cores, memory, model in self.holds:
            self.hold(rooms[node_id], devices, cores, memory, model)

    def hold_draining(self, node: NodeState, shard: ObservedShard) -> bool:
        """Hold what a STOPPING shard has (its engine still runs while it drains its requests in flight, up to the
        drain timeout: `llmgw.agent.draining`), so nothing is placed on its cards before it stopped. Returns whether
        `shard` is STOPPING."""
        if shard.state is not ShardState.STOPPING:
            return False
        self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, None))
        return True

    def hold(self, room: Room, devices: tuple[str, ...], cores: float, memory: int, model: str | None) -> None:
        self.generation += 1
        before = {cls: len(gpus) for cls, gpus in room.free.items()} if devices else {}
        for cls in room.hold(devices, cores, memory, model):
            self.index.moved(room, cls, before[cls])

    def release(self, room: Room, devices: tuple[str, ...], cores: float, memory: int, model: str | None) -> None:
        self.generation += 1
        before = {cls: len(gpus) for cls, gpus in room.free.items()}
        for cls in room.release(devices, cores, memory, model):
            self.index.moved(room, cls, before.get(cls, 0))

    def place_all(self, pending: list[Pending]) -> None:
        self.build_rooms()
        pending.sort(key=lambda p: (-p.demand.gpus, -p.demand.cpu_cores, p.demand.model,
                                    replica_index(p.replica_id), p.replica_id))
        for item in pending:
            self.place(item)

    def candidates(self, demand: Demand):
        rooms, closed = self.rooms, self.closed
        if demand.gpus:
            for node_id in self.index.candidates(demand.gpu_class, demand.gpus):
                if node_id not in closed:
                    yield rooms[node_id]
        else:
            yield from sorted((r for r in rooms.values() if r.node_id not in closed),
                              key=lambda r: (r.has_gpus, -r.cpu_free, r.node_id))

    def place(self, item: Pending) -> None:
        demand = item.demand
        if demand.refusal:
            self.unplaced.append(Unplaced(item.replica_id, demand.model, ((ALL_NODES, demand.refusal),)))
            return
        failed = self.failed.get(id(demand))
        if failed is not None and failed[0] == self.generation and not item.old:
            # Nothing changed since the previous replica of this model found no place: neither will this one.
            self.unplaced.append(Unplaced(item.replica_id, demand.model, failed[1]))
            return
        best: list = [None, None, None, None]
        for room in self.candidates(demand):
            # The first fitting room of each tier wins: a room whose tier is taken is not fitted (fitting devices
            # is the costly part of placing at fleet scale: bench/plan_scale.py).
            engine = room.engine_state(demand)
            if engine in ("unknown", "not installable"):
                continue
            tier = (0 if engine == "ready" else 1) + (2 if room.models.get(demand.model) else 0)
            if best[tier] is not None:
                continue
            devices = room.fit(demand)
            if devices is None:
                continue
            best[tier] = (room, devices, engine)
            if tier == 0:
                break
        choice = next((b for b in best if b is not None), None)
        if choice is not None and choice[2] == "ready":
            room, devices, _ = choice
            self.start(item, room, devices)
            return
        if choice is not None:
            room, devices, engine = choice
            self.hold(room, devices, demand.cpu_cores, demand.memory, demand.model)
            self.install(room, demand, item.replica_id, engine)
            self.unplaced.append(Unplaced(item.replica_id, demand.model, self.reasons(demand, room.node_id)))
            return
        if item.old and self.roll_in_place(item):
            return
        reasons = self.reasons(demand, None)
        self.failed[id(demand)] = (self.generation, reasons)
        self.unplaced.append(Unplaced(item.replica_id, demand.model, reasons))

    def start(self, item: Pending, room: Room, devices: tuple[str, ...]) -> None:
        demand = item.demand
        self.hold(room, devices, demand.cpu_cores, demand.memory, demand.model)
        shard_id = new_shard_id(item.replica_id, demand.fingerprint, item.taken)
        assignment = Assignment(item.replica_id, demand.model, room.node_id, devices, demand.cpu_cores,
                                demand.memory, demand.fingerprint, shard_id)
        self.assignments.append(assignment)
        previous = item.previous_node if item.previous_node != room.node_id else ""
        self.actions.append(Action(ActionKind.START, room.node_id, item.replica_id, shard_id, demand.model,
                                   assignment=assignment, reason=item.reason, previous_node=previous))

    def install(self, room: Room, demand: Demand, replica_id: str, engine: str) -> None:
        """Plan an INSTALL of the demand's engine on `room` unless it is there, installing or planned already."""
        if engine == "installable" and (room.node_id, demand.engine_key) not in self.planned_installs:
            self.planned_installs.add((room.node_id, demand.engine_key))
            self.actions.append(Action(ActionKind.INSTALL, room.node_id, engine=demand.engine_key,
                                       reason=f"needed by {replica_id}"))

    def roll_in_place(self, item: Pending) -> bool:
        """Stop the old shard first when only its own room fits the new generation and the model can spare it."""
        demand = item.demand
        wanted = sum(1 for _ in replica_ids(self.settings.models[demand.model]))
        others_ready = len(self.ready.get(demand.model, set()) - {item.replica_id})
        if wanted > 1 and others_ready < wanted - 1:
            return False
        node, shard = item.old[0]
        if node.node_id in self.closed:
            if node.node_id in self.settings.slurm.lent:  # lending does not wait for room elsewhere
                position = self.old_keeps[(node.node_id, shard.shard_id)]
                self.actions[position] = Action(ActionKind.STOP, node.node_id, shard.replica_id, shard.shard_id,
                                                shard.model, reason=f"{self.closed[node.node_id]}; no room elsewhere")
                self.ready.get(demand.model, set()).discard(item.replica_id)
            return False
        room = self.rooms[node.node_id]
        self.release(room, shard.devices, shard.cpu_cores, shard.memory_bytes, None)
        devices = room.fit(demand)
        engine = room.engine_state(demand)
        if devices is None or engine in ("unknown", "not installable"):
            self.hold(room, shard.devices, shard.cpu_cores, shard.memory_bytes, None)
            return False
        if engine != "ready":
            # The old shard keeps serving while its node installs the new engine; the roll follows.
            self.hold(room, shard.devices, shard.cpu_cores, shard.memory_bytes, None)
            self.install(room, demand, item.replica_id, engine)
            why = f"installing {describe_engine(demand.engine_key)} (then rolling {shard.shard_id} in place)"
            self.unplaced.append(Unplaced(item.replica_id, demand.model, ((node.node_id, why),)))
            return True
        self.hold(room, devices, demand.cpu_cores, demand.memory, demand.model)
        position = self.old_keeps[(node.node_id, shard.shard_id)]
        self.actions[position] = Action(ActionKind.STOP, node.node_id, shard.replica_id, shard.shard_id, shard.model,
                                        reason="rolling in place: no room for the new generation while it runs")
        self.ready.get(demand.model, set()).discard(item.replica_id)
        why = f"waiting for {shard.shard_id} to stop (rolling in place)"
        self.unplaced.append(Unplaced(item.replica_id, demand.model, ((node.node_id, why),)))
        return True

    def reasons(self, demand: Demand, waiting_on: str | None) -> tuple[tuple[str, str], ...]:
        """One reason per node (grouped by reason when many nodes share it)."""
        out: list[tuple[str, str]] = []
        for node in self.nodes:
            if not node.alive:
                out.append((node.node_id, "lost (no heartbeat)"))
                continue
            room = self.rooms[node.node_id]
            if node.node_id == waiting_on:
                why = f"installing {describe_engine(demand.engine_key)}"
            elif node.node_id in self.closed:
                why = self.closed[node.node_id]
            else:
                why = room.why_not(demand)
            if not why:
                engine = room.engine_state(demand)
                if engine == "unknown" and demand.engine_key.endswith("@"):
                    why = f"{demand.engine} is not installed and engines.yaml names no version to install"
                elif engine == "unknown":
                    why = f"{describe_engine(demand.engine_key)} is not installed and engines.yaml does not list it"
                elif engine == "not installable":
                    why = f"its agent cannot install {demand.engine} (too old, or not on this platform)"
                elif engine == "installing":
                    why = f"installing {describe_engine(demand.engine_key)}"
                elif engine == "installable":
                    why = f"{describe_engine(demand.engine_key)} not installed (installing elsewhere)"
                elif room.models.get(demand.model):
                    why = f"fits, but already runs a replica of {demand.model} (spreading over nodes first)"
                else:
                    why = "fits, but was taken by another replica of this pass"
            out.append((node.node_id, why))
        if not out:
            return ((ALL_NODES, "no nodes are registered"),)
        if len(out) <= _GROUP_REASONS_ABOVE:
            return tuple(out)
        groups: dict[str, list[str]] = {}
        for node_id, why in out:
            groups.setdefault(why, []).append(node_id)
        grouped = []
        for why, ids in groups.items():
            label = ids[0] if len(ids) == 1 else f"{ids[0]} and {len(ids) - 1} other nodes"
            grouped.append((label, why))
        return tuple(grouped)
