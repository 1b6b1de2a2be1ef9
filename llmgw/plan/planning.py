"""The planner: from (Settings, Fleet) to a Plan. Pure and deterministic.

A pass goes in two stages.

1. Existing shards on alive nodes are judged replica by replica. A shard whose fingerprint matches its
   replica's and whose node still satisfies the model's node selector is *current*: the best one (ready
   first) is kept (KEEP), or restarted in place when it failed or was stopped (RESTART); other current
   shards of the replica are duplicates and stop. Shards of older generations stop once the current one is
   READY; before that a ready or starting old shard is kept serving (rolling), others stop. Shards of
   replicas no longer wanted (model removed, scaled down, moved to endpoints, serving stopped) stop.
   Foreign engine processes (`adopted_foreign`) are never stopped: they are reported in `notes`.
2. Replicas with no current shard are placed, bigger ones first, then by model and index, on the free
   capacity left (indexes by GPU class, best fit, replicas of one model spread over nodes when possible).
   A node lacking the engine but otherwise fit gets an INSTALL and the replica waits for it. A rolling
   replica that fits nowhere while its old shard runs is rolled in place (old stopped first) when the old
   shard's node can take the new generation and every other replica of the model is ready.

A healthy replica is never moved to improve the packing: placement only ever looks at replicas without a
current shard. Nodes not alive are ignored (their shards hold nothing; replicas are placed elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.plan.capacity import ClassIndex, Demand, Room
from llmgw.plan.guard import guard_fleet_not_emptied
from llmgw.plan.identity import (
    describe_engine, engine_key, engine_version_of, fingerprint, new_shard_id, replica_ids, replica_index,
)
from llmgw.plan.types import (
    Action, ActionKind, Assignment, Fleet, NodeState, ObservedShard, Plan, ShardState, Unplaced,
)
from llmgw.settings.model import Model, Settings

_HOLDING = frozenset({ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING, ShardState.READY,
                      ShardState.STOPPING})
_HEALTHY = frozenset({ShardState.READY, ShardState.STARTING})
_RUNNING = frozenset({ShardState.READY, ShardState.STARTING, ShardState.FETCHING, ShardState.PENDING})
_GONE = frozenset({ShardState.STOPPED, ShardState.STOPPING})
_RANK = {ShardState.READY: 0, ShardState.STARTING: 1, ShardState.FETCHING: 2, ShardState.PENDING: 3,
         ShardState.FAILED: 4, ShardState.STOPPED: 5, ShardState.STOPPING: 6}
_KIND_ORDER = {ActionKind.INSTALL: 0, ActionKind.START: 1, ActionKind.RESTART: 1, ActionKind.STOP: 2,
               ActionKind.KEEP: 3}
ALL_NODES = "all nodes"
_GROUP_REASONS_ABOVE = 12


def is_mig_class(gpu_class: str) -> bool:
    """True for a MIG instance class ("a100-80g-mig-3g.40gb", "mig-1g.10gb")."""
    return "mig-" in gpu_class or gpu_class.startswith("mig")


def demand_of(settings: Settings, model: Model) -> Demand:
    """What one replica of `model` needs under `settings` (see `capacity.Demand`)."""
    version = engine_version_of(settings, model)
    res = model.resources
    refusal = None
    gpu_class = res.gpu_class or ""
    if res.gpus > 0 and is_mig_class(gpu_class) and (res.gpus > 1 or res.tensor_parallel > 1
                                                     or res.pipeline_parallel > 1):
        refusal = (f"a MIG instance is exactly one device: {model.name} asks for {res.gpus} x {gpu_class} "
                   f"with tensor_parallel {res.tensor_parallel} and pipeline_parallel {res.pipeline_parallel}; "
                   f"use gpus: 1 on a MIG class or a whole-GPU class")
    elif res.gpus > 0 and not gpu_class:
        refusal = f"{model.name} asks for {res.gpus} GPUs but names no gpu_class"
    return Demand(
        model=model.name, fingerprint=fingerprint(model, version), engine=model.engine,
        engine_key=engine_key(model.engine, version), gpus=res.gpus, gpu_class=gpu_class,
        gpu_memory=res.gpu_memory_bytes or 0, cpu_cores=0.0 if res.gpus else float(res.cpu_cores),
        memory=0 if res.gpus else (res.memory_bytes or 0), selector=tuple(sorted(model.node_selector.items())),
        refusal=refusal, installable=version is not None and (model.engine, version) in settings.engines,
    )


@dataclass
class _Pending:
    replica_id: str
    demand: Demand
    taken: set[str]
    old: list[tuple[NodeState, ObservedShard]] = field(default_factory=list)
    previous_node: str = ""
    reason: str = "new replica"


class _Planner:
    def __init__(self, settings: Settings, fleet: Fleet):
        self.settings = settings
        self.nodes = sorted(fleet.nodes, key=lambda n: n.node_id)
        self.alive = [n for n in self.nodes if n.alive]
        self.labels: dict[str, dict[str, str]] = {}
        self.actions: list[Action] = []
        self.assignments: list[Assignment] = []
        self.unplaced: list[Unplaced] = []
        self.notes: list[str] = []
        self.holds: list[tuple[str, tuple[str, ...], float, int, str | None]] = []
        self.rooms: dict[str, Room] | None = None
        self.index: ClassIndex | None = None
        self.planned_installs: set[tuple[str, str]] = set()
        self.ready: dict[str, set[str]] = {}
        self.keep_old: dict[str, list[Action]] = {}

    # -- stage 1 ---------------------------------------------------------------------------------------
    def node_labels(self, node: NodeState) -> dict[str, str]:
        labels = self.labels.get(node.node_id)
        if labels is None:
            labels = dict(node.labels)
            labels.update(self.settings.agent_settings_for(node.node_id).labels)
            self.labels[node.node_id] = labels
        return labels

    def run(self) -> Plan:
        settings = self.settings
        stopped = settings.cluster.serving_stopped
        desired: dict[str, tuple[Model, Demand]] = {}
        if not stopped:
            for name in sorted(settings.models):
                model = settings.models[name]
                ids = replica_ids(model)
                if ids:
                    demand = demand_of(settings, model)
                    for replica_id in ids:
                        desired[replica_id] = (model, demand)
        else:
            self.notes.append("serving is stopped (serving.stopped in llmgw.yaml): every shard is stopped")

        by_replica: dict[str, list[tuple[NodeState, ObservedShard]]] = {}
        taken: dict[str, set[str]] = {}
        lost_shards: dict[str, tuple[str, str]] = {}
        for node in self.nodes:
            if not node.alive:
                wanted = [s.shard_id for s in node.shards if s.replica_id in desired and not s.adopted_foreign]
                if wanted:
                    self.notes.append(f"{node.node_id} is lost (no heartbeat): {', '.join(wanted)} placed again")
                for shard in node.shards:
                    taken.setdefault(shard.replica_id, set()).add(shard.shard_id)
                    lost_shards.setdefault(shard.replica_id, (node.node_id, shard.shard_id))
                continue
            for shard in node.shards:
                taken.setdefault(shard.replica_id, set()).add(shard.shard_id)
                if shard.adopted_foreign:
                    self.notes.append(f"{node.node_id}: engine process {shard.shard_id or shard.model} was not "
                                      f"started by llmgw; left running")
                    if shard.state not in (ShardState.STOPPED,):
                        self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, None))
                    continue
                by_replica.setdefault(shard.replica_id, []).append((node, shard))

        pending: list[_Pending] = []
        for replica_id, (model, demand) in desired.items():
            shards = by_replica.pop(replica_id, [])
            item = self.judge(replica_id, model, demand, shards, taken.get(replica_id, set()))
            if item is not None:
                lost = lost_shards.get(replica_id)
                if lost is not None and not item.previous_node:
                    item.previous_node = lost[0]
                    item.reason = f"replaces {lost[1]} on lost node {lost[0]}"
                pending.append(item)

        for replica_id in sorted(by_replica, key=_replica_key):
            for node, shard in sorted(by_replica[replica_id], key=lambda p: (p[1].shard_id, p[0].node_id)):
                if shard.state in _GONE:
                    continue
                self.stop(node, shard, self.unwanted_reason(shard, stopped))

        if pending:
            self.place_all(pending)
        return self.finish()

    def unwanted_reason(self, shard: ObservedShard, stopped: bool) -> str:
        if stopped:
            return "serving is stopped"
        model = self.settings.models.get(shard.model)
        if model is None:
            return f"model {shard.model} is not in the catalog"
        if model.endpoints:
            return f"model {shard.model} is served by external endpoints"
        return f"model {shard.model} wants {model.replicas} replicas"

    def judge(self, replica_id: str, model: Model, demand: Demand,
              shards: list[tuple[NodeState, ObservedShard]], taken: set[str]) -> _Pending | None:
        """Decide the existing shards of one wanted replica; return it as pending when it needs placing."""
        if len(shards) == 1:  # the converged case, kept cheap: one current shard, running
            node, shard = shards[0]
            if (shard.fingerprint == demand.fingerprint and shard.state in _RUNNING and (
                    not demand.selector or all(self.node_labels(node).get(k) == v for k, v in demand.selector))):
                assignment = Assignment(replica_id, model.name, node.node_id, shard.devices, shard.cpu_cores,
                                        shard.memory_bytes, demand.fingerprint, shard.shard_id)
                self.assignments.append(assignment)
                self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, model.name))
                if shard.state is ShardState.READY:
                    self.ready.setdefault(model.name, set()).add(replica_id)
                self.actions.append(Action(ActionKind.KEEP, node.node_id, replica_id, shard.shard_id, model.name,
                                           assignment=assignment))
                return None
        current, old = [], []
        for node, shard in shards:
            ok = shard.fingerprint == demand.fingerprint and (
                not demand.selector or all(self.node_labels(node).get(k) == v for k, v in demand.selector))
            (current if ok else old).append((node, shard))
        ready = self.ready.setdefault(model.name, set())
        primary = None
        if current:
            current.sort(key=lambda p: (_RANK[p[1].state], p[0].node_id, p[1].shard_id))
            primary = current[0]
            for node, shard in current[1:]:
                if shard.state not in _GONE:
                    self.stop(node, shard, f"duplicate of {primary[1].shard_id} on {primary[0].node_id}")
            node, shard = primary
            assignment = Assignment(replica_id, model.name, node.node_id, shard.devices, shard.cpu_cores,
                                    shard.memory_bytes, demand.fingerprint, shard.shard_id)
            self.assignments.append(assignment)
            self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, model.name))
            if shard.state is ShardState.READY:
                ready.add(replica_id)
            if shard.state in (ShardState.FAILED, ShardState.STOPPED):
                why = f"failed: {shard.error}" if shard.state is ShardState.FAILED and shard.error else shard.state.value
                self.actions.append(Action(ActionKind.RESTART, node.node_id, replica_id, shard.shard_id, model.name,
                                           assignment=assignment, reason=f"{why} (restarts so far: {shard.restarts})"))
            else:
                reason = "stopping; restarted once stopped" if shard.state is ShardState.STOPPING else ""
                self.actions.append(Action(ActionKind.KEEP, node.node_id, replica_id, shard.shard_id, model.name,
                                           assignment=assignment, reason=reason))
        new_ready = primary is not None and primary[1].state is ShardState.READY
        new_name = primary[1].shard_id if primary is not None else "the new generation"
        kept = []
        for node, shard in sorted(old, key=lambda p: (p[0].node_id, p[1].shard_id)):
            if shard.state in _GONE:
                continue
            if new_ready or shard.state not in _HEALTHY:
                self.stop(node, shard, f"rolled: replaced by {new_name}" if new_ready
                          else f"superseded ({shard.state.value}) by a new generation")
                continue
            if shard.state is ShardState.READY:
                ready.add(replica_id)
            # Held, but not counted against spreading: it goes away once its replacement is ready.
            self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, None))
            action = Action(ActionKind.KEEP, node.node_id, replica_id, shard.shard_id, model.name,
                            reason=f"rolling: kept until {new_name} is ready")
            self.actions.append(action)
            kept.append((node, shard))
        if primary is not None:
            return None
        item = _Pending(replica_id, demand, taken, old=kept)
        if kept:
            item.previous_node = kept[0][0].node_id
            item.reason = f"rolling: new generation of {kept[0][1].shard_id}"
        return item

    def stop(self, node: NodeState, shard: ObservedShard, reason: str) -> None:
        self.actions.append(Action(ActionKind.STOP, node.node_id, shard.replica_id, shard.shard_id, shard.model,
                                   reason=reason))
        if shard.state in _HOLDING:
            self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, None))

    # -- stage 2 ---------------------------------------------------------------------------------------
    def build_rooms(self) -> None:
        rooms = {}
        for node in self.alive:
            agent = self.settings.agent_settings_for(node.node_id)
            rooms[node.node_id] = Room(node, self.node_labels(node), frozenset(agent.ignore_gpus))
        self.rooms = rooms
        self.index = ClassIndex(list(rooms.values()))
        for node_id, devices, cores, memory, model in self.holds:
            self.hold(rooms[node_id], devices, cores, memory, model)

    def hold(self, room: Room, devices: tuple[str, ...], cores: float, memory: int, model: str | None) -> None:
        before = {cls: len(gpus) for cls, gpus in room.free.items()} if devices else {}
        for cls in room.hold(devices, cores, memory, model):
            self.index.moved(room, cls, before[cls])

    def release(self, room: Room, devices: tuple[str, ...], cores: float, memory: int, model: str | None) -> None:
        before = {cls: len(gpus) for cls, gpus in room.free.items()}
        for cls in room.release(devices, cores, memory, model):
            self.index.moved(room, cls, before.get(cls, 0))

    def place_all(self, pending: list[_Pending]) -> None:
        self.build_rooms()
        pending.sort(key=lambda p: (-p.demand.gpus, -p.demand.cpu_cores, p.demand.model,
                                    replica_index(p.replica_id), p.replica_id))
        for item in pending:
            self.place(item)

    def candidates(self, demand: Demand):
        rooms = self.rooms
        if demand.gpus:
            for node_id in self.index.candidates(demand.gpu_class, demand.gpus):
                yield rooms[node_id]
        else:
            yield from sorted(rooms.values(), key=lambda r: (r.has_gpus, -r.cpu_free, r.node_id))

    def place(self, item: _Pending) -> None:
        demand = item.demand
        if demand.refusal:
            self.unplaced.append(Unplaced(item.replica_id, demand.model, ((ALL_NODES, demand.refusal),)))
            return
        best: list = [None, None, None, None]
        for room in self.candidates(demand):
            devices = room.fit(demand)
            if devices is None:
                continue
            engine = room.engine_state(demand)
            if engine == "unknown":
                continue
            tier = (0 if engine == "ready" else 1) + (2 if room.models.get(demand.model) else 0)
            if best[tier] is None:
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
            if engine == "installable" and (room.node_id, demand.engine_key) not in self.planned_installs:
                self.planned_installs.add((room.node_id, demand.engine_key))
                self.actions.append(Action(ActionKind.INSTALL, room.node_id, engine=demand.engine_key,
                                           reason=f"needed by {item.replica_id}"))
            self.unplaced.append(Unplaced(item.replica_id, demand.model, self.reasons(demand, room.node_id)))
            return
        if item.old and self.roll_in_place(item):
            return
        self.unplaced.append(Unplaced(item.replica_id, demand.model, self.reasons(demand, None)))

    def start(self, item: _Pending, room: Room, devices: tuple[str, ...]) -> None:
        demand = item.demand
        self.hold(room, devices, demand.cpu_cores, demand.memory, demand.model)
        shard_id = new_shard_id(item.replica_id, demand.fingerprint, item.taken)
        assignment = Assignment(item.replica_id, demand.model, room.node_id, devices, demand.cpu_cores,
                                demand.memory, demand.fingerprint, shard_id)
        self.assignments.append(assignment)
        previous = item.previous_node if item.previous_node != room.node_id else ""
        self.actions.append(Action(ActionKind.START, room.node_id, item.replica_id, shard_id, demand.model,
                                   assignment=assignment, reason=item.reason, previous_node=previous))

    def roll_in_place(self, item: _Pending) -> bool:
        """Stop the old shard first when only its own room fits the new generation and the model can spare it."""
        demand = item.demand
        wanted = sum(1 for _ in replica_ids(self.settings.models[demand.model]))
        others_ready = len(self.ready.get(demand.model, set()) - {item.replica_id})
        if wanted > 1 and others_ready < wanted - 1:
            return False
        node, shard = item.old[0]
        room = self.rooms[node.node_id]
        self.release(room, shard.devices, shard.cpu_cores, shard.memory_bytes, None)
        devices = room.fit(demand)
        if devices is None or room.engine_state(demand) != "ready":
            self.hold(room, shard.devices, shard.cpu_cores, shard.memory_bytes, None)
            return False
        self.hold(room, devices, demand.cpu_cores, demand.memory, demand.model)
        for i, action in enumerate(self.actions):
            if action.kind is ActionKind.KEEP and action.shard_id == shard.shard_id and action.node_id == node.node_id:
                self.actions[i] = Action(ActionKind.STOP, node.node_id, shard.replica_id, shard.shard_id, shard.model,
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
            why = room.why_not(demand)
            if not why:
                engine = room.engine_state(demand)
                if engine == "unknown" and demand.engine_key.endswith("@"):
                    why = f"{demand.engine} is not installed and engines.yaml names no version to install"
                elif engine == "unknown":
                    why = f"{describe_engine(demand.engine_key)} is not installed and engines.yaml does not list it"
                elif engine == "installing" or node.node_id == waiting_on:
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

    def finish(self) -> Plan:
        indexes: dict[str, int] = {}

        def index(replica_id: str) -> int:
            n = indexes.get(replica_id)
            if n is None:
                n = indexes[replica_id] = replica_index(replica_id)
            return n

        def action_key(a: Action):
            if a.kind is ActionKind.INSTALL:
                return (0, a.node_id, 0, a.engine, "")
            return (_KIND_ORDER[a.kind], a.model, index(a.replica_id), a.shard_id, a.node_id)

        self.actions.sort(key=action_key)
        self.assignments.sort(key=lambda a: (a.model, index(a.replica_id), a.replica_id))
        self.unplaced.sort(key=lambda u: (u.model, replica_index(u.replica_id), u.replica_id))
        return Plan(tuple(self.assignments), tuple(self.actions), tuple(self.unplaced), self.settings.commit,
                    tuple(self.notes))


def _replica_key(replica_id: str) -> tuple[str, int, str]:
    model, _, _ = replica_id.rpartition("-")
    return (model, replica_index(replica_id), replica_id)


def make_plan(settings: Settings, fleet: Fleet, *, allow_empty: bool = False) -> Plan:
    """Return the desired assignment of every catalog replica and the actions that reach it from `fleet`.

    `settings`: the settings to converge to (`settings.commit` is copied to `Plan.settings_commit`).
    `fleet`: the observed nodes; node order does not matter (the plan is the same for any order).
    Returns a `Plan`: `assignments` by model and replica index; `actions` installs first, then starts and
    restarts, then stops, then keeps; `unplaced` with one reason per node (nodes sharing a reason are grouped
    when there are more than 12); `notes` for lost nodes, foreign engines and a stopped service.
    Raises: `EmptiedCatalogError` when the settings want no replica and no endpoint at all while the fleet
    still runs shards, unless `allow_empty` or `allow_empty: true` in llmgw.yaml (or serving is stopped).
    """
    guard_fleet_not_emptied(settings, fleet, allow_empty=allow_empty)
    return _Planner(settings, fleet).run()
