"""The planner: from (Settings, Fleet) to a Plan. Pure and deterministic.

A pass goes in two stages.

1. Existing shards on alive nodes are judged replica by replica. A shard whose fingerprint matches its
   replica's and whose node still satisfies the model's node selector is *current*: the best one (ready
   first) is kept (KEEP), or restarted in place when it failed or was stopped (RESTART); other current
   shards of the replica are duplicates and stop. Shards of older generations stop once the current one is
   READY; before that a ready or starting old shard is kept serving (rolling), others stop. Shards of
   replicas no longer wanted (model removed, scaled down, moved to endpoints, serving stopped) stop.
   A STOPPING shard (its engine drains its requests in flight before it stops, up to the drain timeout:
   llmgw.agent.draining) still holds its cards, cores and memory: nothing is placed there before it stopped, and a
   replica rolled in place waits for it ("waiting for <shard> to stop").
   Foreign engine processes (`adopted_foreign`) are never stopped: they are reported in `notes`.
2. Replicas with no current shard are placed, bigger ones first, then by model and index, on the free
   capacity left (indexes by GPU class, best fit, replicas of one model spread over nodes when possible).
   A node lacking the engine but otherwise fit gets an INSTALL and the replica waits for it. A rolling
   replica that fits nowhere while its old shard runs is rolled in place (old stopped first) when the old
   shard's node can take the new generation and every other replica of the model is ready. At most
   `reconcile.max_surge` (default 1) replaced replicas of a model run their new shard beside the old one at once;
   the others wait, unplaced, their old shard serving.

A model under a canary (`canaries=`, `llmgw.plan.canary.CanaryHold`) rolls only its canary replica, whose old shard
keeps serving beside the new one until the verdict; its other replicas wait, unplaced. A failed canary's model is
planned as the revision its old replicas run, so the canary shard stops ("canary ... failed: <why>").

A healthy replica is never moved to improve the packing: placement only ever looks at replicas without a
current shard. Nodes not alive are ignored (their shards hold nothing; replicas are placed elsewhere).
Cordoned, drained and lent nodes take no new replica; a drained or lent node's shards are judged as an old
generation, so they serve until their replacement elsewhere is ready (llmgw.plan.cordons).

A replica that needs more GPUs than the largest node of its class has is spread over several nodes, one shard
per node with its rank (llmgw.plan.spanning): both stages hand such replicas to `Spanning`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import fields, replace
from types import MappingProxyType

from llmgw.plan.canary import CanaryHold
from llmgw.plan.capacity import Demand
from llmgw.plan.guard import guard_fleet_not_emptied
from llmgw.plan.health import unhealthy_devices
from llmgw.identity import ShardState, engine_key, replica_index
from llmgw.plan.identity import engine_version_of, fingerprint, replica_ids
from llmgw.plan.placing import ALL_NODES, Pending, Placement
from llmgw.plan.firewall import firewall_tables
from llmgw.plan.slurm_accounts import desired_accounts
from llmgw.plan.slurm_conf import hosts_of
from llmgw.plan.slurm_roles import SlurmRole, slurm_roles
from llmgw.plan.slurm_users import users_digest_input
from llmgw.plan.spanning import Spanning
from llmgw.plan.types import Action, ActionKind, Assignment, Fleet, NodeState, ObservedShard, Plan, Unplaced
from llmgw.settings.model import Model, Settings

_HOLDING = frozenset({ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING, ShardState.READY,
                      ShardState.STOPPING})
_HEALTHY = frozenset({ShardState.READY, ShardState.STARTING})
_RUNNING = frozenset({ShardState.READY, ShardState.STARTING, ShardState.FETCHING, ShardState.PENDING})
_GONE = frozenset({ShardState.STOPPED, ShardState.STOPPING})
_RANK = {ShardState.READY: 0, ShardState.STARTING: 1, ShardState.FETCHING: 2, ShardState.PENDING: 3,
         ShardState.FAILED: 4, ShardState.STOPPED: 5, ShardState.STOPPING: 6}
_KIND_ORDER = {ActionKind.CONFIGURE: -1, ActionKind.INSTALL: 0, ActionKind.START: 1, ActionKind.RESTART: 1, ActionKind.STOP: 2,
               ActionKind.KEEP: 3}


def foreign_note(node_id: str, shard: ObservedShard) -> str:
    """The plan's note on an engine process llmgw did not start (`adopted_foreign`): which node and process, what it
    serves and where (as its command line says: the agent reads --alias/--served-model-name or the model path, and
    --port), and that llmgw leaves it running, so stopping it is its owner's."""
    what = ", ".join(part for part in (f"serving {shard.model}" if shard.model else "",
                                       f"port {shard.port}" if shard.port else "") if part)
    return (f"{node_id}: engine process {shard.shard_id or shard.model}{f' ({what})' if what else ''} was not started "
            "by llmgw; left running (it holds its cores and memory; llmgw never stops it: that is for whoever "
            "started it, maybe another llmgw or a test run on this machine)")

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


class _Planner(Spanning, Placement):
    """One planning pass: stage 1 here, stage 2 in `Placement`; replicas spread over nodes in `Spanning`."""

    def __init__(self, settings: Settings, fleet: Fleet, canaries: Mapping[str, CanaryHold] = MappingProxyType({})):
        super().__init__(settings, sorted(fleet.nodes, key=lambda n: n.node_id))
        self.canaries = canaries
        self.indexes: dict[str, int] = {}  # replica id -> its index n, known when the ids are built
        self.surging: dict[str, int] = {}  # model -> its replicas whose new shard runs beside the old one
        self.init_spanning()

    def place(self, item: Pending) -> None:
        span = self.span_of(item.demand)
        count, acted = len(self.unplaced), len(self.actions)
        if span is None:
            super().place(item)
            refusal = self.spanning_refusal(item.demand)
            if refusal and len(self.unplaced) > count and self.unplaced[-1].replica_id == item.replica_id:
                # why it was not spread over nodes instead (llama.cpp's build has no RPC)
                last = self.unplaced[-1]
                self.unplaced[-1] = replace(last, reasons=(("all nodes", refusal), *last.reasons))
        else:
            self.place_spanning(item, span)
        if item.draining and len(self.actions) == acted and len(self.unplaced) > count:
            # nothing started or installed for it: it waits for its old shard's cards, held while that drains
            node_id, shard_id = item.draining
            last = self.unplaced[-1]
            why = f"waiting for {shard_id} to stop (it finishes its requests in flight first)"
            self.unplaced[-1] = replace(last, reasons=((node_id, why), *(r for r in last.reasons if r[0] != node_id)))

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
                    for n, replica_id in enumerate(ids):
                        desired[replica_id] = (model, demand)
                        self.indexes[replica_id] = n
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
                    self.notes.append(foreign_note(node.node_id, shard))
                    if shard.state not in (ShardState.STOPPED,):
                        self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, None))
                    continue
                by_replica.setdefault(shard.replica_id, []).append((node, shard))

        pending: list[Pending] = []
        for replica_id, (model, demand) in desired.items():
            shards = by_replica.pop(replica_id, [])
            item = self.judge(replica_id, model, demand, shards, taken.get(replica_id, set()))
            if item is not None:
                lost = lost_shards.get(replica_id)
                if lost is not None and not item.previous_node:
                    item.previous_node = lost[0]
                    item.reason = f"replaces {lost[1]} on lost node {lost[0]}"
                pending.append(item)

        def unwanted_order(replica_id: str) -> tuple[str, int, str]:
            return (by_replica[replica_id][0][1].model, replica_index(replica_id), replica_id)

        for replica_id in sorted(by_replica, key=unwanted_order):
            for node, shard in sorted(by_replica[replica_id], key=lambda p: (p[1].shard_id, p[0].node_id)):
                if self.hold_draining(node, shard) or shard.state in _GONE:
                    continue
                self.stop(node, shard, self.unwanted_reason(shard, stopped))

        pending = self.within_surge(pending)
        if pending:
            self.place_all(pending)
        self.configure_nodes()
        return self.finish()

    def within_surge(self, pending: list[Pending]) -> list[Pending]:
        """`pending` less the replaced replicas (those with an old shard still serving) beyond llmgw.yaml
        `reconcile.max_surge` per model, counting those whose new shard already runs: the others keep their old
        shard serving, its KEEP and their `unplaced` entry saying why, and are placed in a later pass."""
        limit = max(1, self.settings.cluster.max_surge)
        kept = []
        for item in pending:
            model = item.demand.model
            hold = self.canaries.get(model)
            if hold is not None and not hold.failed and item.replica_id != hold.replica_id:
                self._wait(item, f"canary: waits for the verdict on {hold.replica_id} (rollout: canary)")
                continue
            if item.old and self.surging.get(model, 0) >= limit:
                self._wait(item, f"rolling: waits for another replica of {model} (reconcile.max_surge {limit})")
                continue
            if item.old:
                self.surging[model] = self.surging.get(model, 0) + 1
            kept.append(item)
        return kept

    def _wait(self, item: Pending, reason: str) -> None:
        """`item` is not placed in this pass: its old shards keep serving, their keep actions and its unplaced entry
        saying `reason`."""
        for node, shard in item.old:
            index = self.old_keeps.get((node.node_id, shard.shard_id))
            if index is not None:
                self.actions[index] = replace(self.actions[index], reason=reason)
        self.unplaced.append(Unplaced(item.replica_id, item.demand.model, ((ALL_NODES, reason),)))

    def configure_nodes(self) -> None:
        """A CONFIGURE for every alive, tracked node whose acknowledged agent settings differ from the settings'."""
        fingerprints: dict[int, str] = {}  # most nodes share one AgentSettings value: hash each value once
        roles = {}
        if self.settings.slurm.enabled:  # each node's part in Slurm goes with its agent settings
            roles = slurm_roles(self.settings.slurm, hosts_of(Fleet(tuple(self.nodes))), desired_accounts(self.settings),
                                users_digest_input(self.settings))
        tables = firewall_tables(self.settings, Fleet(tuple(self.nodes)))  # {} when firewall.yaml is off
        for node in self.nodes:
            if not node.alive or node.agent_settings_applied is None:
                continue
            agent = self.settings.agent_settings_for(node.node_id)
            wanted = fingerprints.get(id(agent))
            if wanted is None:
                wanted = fingerprints[id(agent)] = _fingerprint_of(agent, self.settings.cluster.control_planes)
            role = roles.get(node.node_id)
            if role is not None:  # its part in Slurm goes with its agent settings (AgentSettings.slurm)
                wanted = with_slurm_role(wanted, role)
            table = tables.get(node.node_id)
            if table is not None:  # its firewall table goes with its agent settings (AgentSettings.firewall)
                wanted = with_firewall(wanted, table.digest)
            if node.agent_settings_applied != wanted:
                reason = "agent settings changed" if node.agent_settings_applied else "node has no agent settings yet"
                self.actions.append(Action(ActionKind.CONFIGURE, node.node_id, fingerprint=wanted, reason=reason,
                                           firewall=table))

    def unwanted_reason(self, shard: ObservedShard, stopped: bool) -> str:
        if stopped:
            return "serving is stopped"
        model = self.settings.models.get(shard.model)
        if model is None:
            return f"model {shard.model} is not in the catalog"
        if model.endpoints:
            return f"model {shard.model} is served by external endpoints"
        return f"model {shard.model} wants {model.replicas} replica{'' if model.replicas == 1 else 's'}"

    def judge(self, replica_id: str, model: Model, demand: Demand,
              shards: list[tuple[NodeState, ObservedShard]], taken: set[str]) -> Pending | None:
        """Decide the existing shards of one wanted replica; return it as pending when it needs placing."""
        span = self.span_of(demand)
        if span is not None:
            return self.judge_spanning(replica_id, model.name, demand, span, shards, taken)
        if len(shards) == 1:  # the converged case, kept cheap: one current shard, running
            node, shard = shards[0]
            if (shard.fingerprint == demand.fingerprint and shard.state in _RUNNING and node.node_id not in self.evicted
                    and not _spread(shard, demand)
                    and (not demand.selector or all(self.node_labels(node).get(k) == v for k, v in demand.selector))
                    and not unhealthy_devices(node, shard.devices)):
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
            ok = shard.fingerprint == demand.fingerprint and not _spread(shard, demand) and (
                node.node_id not in self.evicted) and (
                not demand.selector or all(self.node_labels(node).get(k) == v for k, v in demand.selector)) and (
                not unhealthy_devices(node, shard.devices))  # a card out for health: placed elsewhere
            (current if ok else old).append((node, shard))
        hold = self.canaries.get(model.name)
        if hold is not None and not hold.failed and hold.replica_id != replica_id:
            # while its canary runs, no other replica of the model starts the new revision, not even again
            current = [p for p in current if p[1].state not in (ShardState.FAILED, ShardState.STOPPED)]
        ready = self.ready.setdefault(model.name, set())
        primary = None
        if current:
            current.sort(key=lambda p: (_RANK[p[1].state], p[0].node_id, p[1].shard_id))
            primary = current[0]
            for node, shard in current[1:]:
                if not self.hold_draining(node, shard) and shard.state not in _GONE:
                    self.stop(node, shard, f"duplicate of {primary[1].shard_id} on {primary[0].node_id}")
            node, shard = primary
            assignment = Assignment(replica_id, model.name, node.node_id, shard.devices, shard.cpu_cores,
                                    shard.memory_bytes, demand.fingerprint, shard.shard_id)
            self.assignments.append(assignment)
            self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, model.name))
            if shard.state is ShardState.READY:
                ready.add(replica_id)
            if shard.state in (ShardState.FAILED, ShardState.STOPPED):
                why = shard.state.value
                if shard.state is ShardState.FAILED and shard.error:
                    why = f"failed: {shard.error}"
                self.actions.append(Action(ActionKind.RESTART, node.node_id, replica_id, shard.shard_id, model.name,
                                           assignment=assignment, reason=f"{why} (restarts so far: {shard.restarts})"))
            else:
                reason = "stopping; restarted once stopped" if shard.state is ShardState.STOPPING else ""
                self.actions.append(Action(ActionKind.KEEP, node.node_id, replica_id, shard.shard_id, model.name,
                                           assignment=assignment, reason=reason))
        new_ready = primary is not None and primary[1].state is ShardState.READY
        new_name = primary[1].shard_id if primary is not None else "the new generation"
        beside = hold is not None and not hold.failed  # old shards serve on beside the new revision until the verdict
        kept, draining = [], None
        for node, shard in sorted(old, key=lambda p: (p[0].node_id, p[1].shard_id)):
            if self.hold_draining(node, shard):
                draining = draining or (node.node_id, shard.shard_id)
                continue
            if shard.state in _GONE:
                continue
            if (new_ready and not beside) or shard.state not in _HEALTHY:
                why = f"rolled: replaced by {new_name}"
                if hold is not None and hold.failed:
                    why = f"canary of {hold.commit[:12]} failed: {hold.reason}"
                self.stop(node, shard, why if new_ready else f"superseded ({shard.state.value}) by a new generation")
                continue
            if shard.state is ShardState.READY:
                ready.add(replica_id)
            # Held, but not counted against spreading: it goes away once its replacement is ready.
            self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, None))
            why = f"{self.closed[node.node_id]}: " if node.node_id in self.evicted else "rolling: "
            action = Action(ActionKind.KEEP, node.node_id, replica_id, shard.shard_id, model.name,
                            reason=f"canary: serves beside {new_name} until the canary's verdict" if beside and new_ready
                            else f"{why}kept until {new_name} is ready")
            self.old_keeps[(node.node_id, shard.shard_id)] = len(self.actions)
            self.actions.append(action)
            kept.append((node, shard))
        if primary is not None:
            if kept:  # its new shard runs beside the old one, not ready yet: counted against max_surge
                self.surging[model.name] = self.surging.get(model.name, 0) + 1
            return None
        item = Pending(replica_id, demand, taken, old=kept, draining=draining)
        if kept:
            item.previous_node = kept[0][0].node_id
            item.reason = (f"moves {kept[0][1].shard_id} off {item.previous_node}: {self.closed[item.previous_node]}"
                           if item.previous_node in self.evicted else
                           f"canary: the new revision beside {kept[0][1].shard_id}" if beside
                           else f"rolling: new generation of {kept[0][1].shard_id}")
        return item

    def stop(self, node: NodeState, shard: ObservedShard, reason: str) -> None:
        self.actions.append(Action(ActionKind.STOP, node.node_id, shard.replica_id, shard.shard_id, shard.model,
                                   reason=reason))
        if shard.state in _HOLDING:
            self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, None))

    def finish(self) -> Plan:
        indexes = self.indexes  # built with the desired replicas; others (shards to stop) are looked up once

        def index(replica_id: str) -> int:
            n = indexes.get(replica_id)
            if n is None:
                n = indexes[replica_id] = replica_index(replica_id)
            return n

        def action_key(a: Action):
            if a.kind is ActionKind.CONFIGURE:
                return (-1, a.node_id, 0, "", "")
            if a.kind is ActionKind.INSTALL:
                return (0, a.node_id, 0, a.engine, "")
            return (_KIND_ORDER[a.kind], a.model, index(a.replica_id), a.shard_id, a.node_id)

        self.actions.sort(key=action_key)
        self.assignments.sort(key=lambda a: (a.model, index(a.replica_id), a.replica_id))
        self.unplaced.sort(key=lambda u: (u.model, replica_index(u.replica_id), u.replica_id))
        return Plan(tuple(self.assignments), tuple(self.actions), tuple(self.unplaced), self.settings.commit,
                    tuple(self.notes))


def agent_settings_fingerprint(settings: Settings, node_id: str) -> str:
    """The first 16 hex digits of the sha256 of `node_id`'s agent settings (defaults with its override applied).

    Equal settings give equal fingerprints whatever file or commit they came from; a CONFIGURE action carries it
    in `Action.engine` and the node acknowledges it, so the planner sees when a node holds the settings in force.
    """
    return _fingerprint_of(settings.agent_settings_for(node_id), settings.cluster.control_planes)


def _spread(shard: ObservedShard, demand: Demand) -> bool:
    """A shard of a replica that was spread over nodes (a rank above 0, or fewer cards than the replica needs)
    while the replica now fits one node: judged as an old generation, so the replica moves onto one node."""
    return bool(shard.rank) or bool(demand.gpus and shard.devices and len(shard.devices) < demand.gpus)


def _fingerprint_of(agent, control_planes: tuple[str, ...] = ()) -> str:
    # a field added later counts only when set (`_ADDED_LATER`): settings without it keep their fingerprint, so an
    # upgrade sends no node its agent settings again
    described = repr(sorted((f.name, _plain(getattr(agent, f.name))) for f in fields(agent)
                            if not (f.name in _ADDED_LATER and getattr(agent, f.name) == f.default)))
    if control_planes:  # sent with them (AgentSettings.control_planes); absent: as before
        described += repr(control_planes)
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def with_slurm_role(fingerprint: str, role: SlurmRole) -> str:
    """An agent settings fingerprint covering the node's part in Slurm too (16 hex digits)."""
    return hashlib.sha256(f"{fingerprint} slurm {role.digest()}".encode()).hexdigest()[:16]


def with_firewall(fingerprint: str, digest: str) -> str:
    """An agent settings fingerprint covering the node's firewall table (`digest`) too (16 hex digits)."""
    return hashlib.sha256(f"{fingerprint} firewall {digest}".encode()).hexdigest()[:16]


_ADDED_LATER = frozenset({"tracing", "build", "certificate_renew_fraction", "offline"})


def _plain(value):
    if isinstance(value, Mapping):
        return sorted(value.items())
    return value


def make_plan(settings: Settings, fleet: Fleet, *, allow_empty: bool = False,
              canaries: Mapping[str, CanaryHold] = MappingProxyType({}),
              replicas: Mapping[str, int] = MappingProxyType({})) -> Plan:
    """Return the desired assignment of every catalog replica and the actions that reach it from `fleet`.

    `settings`: the settings to converge to (`settings.commit` is copied to `Plan.settings_commit`).
    `fleet`: the observed nodes; node order does not matter (the plan is the same for any order).
    Returns a `Plan`: `assignments` by model and replica index; `actions` installs first, then starts and
    restarts, then stops, then keeps; `unplaced` with one reason per node (nodes sharing a reason are grouped
    when there are more than 12); `notes` for lost nodes, foreign engines and a stopped service.
    Raises: `EmptiedCatalogError` when the settings want no replica and no endpoint at all while the fleet
    still runs shards, unless `allow_empty` or `allow_empty: true` in llmgw.yaml (or serving is stopped).
    `canaries`: model name -> its canary (`llmgw.plan.canary`): a running one holds the model's roll at its canary
    replica; a failed one plans the model as `previous` (the settings' other models and commit unchanged).
    `replicas`: model name -> the count the autoscaler wants (`llmgw.plan.autoscaling`) for a model whose settings
    give a range (`Model.scaling`), kept within it; other names are ignored, and an autoscaled model not named runs
    its `min`.
    """
    failed = {name: hold.previous for name, hold in canaries.items()
              if hold.failed and hold.previous is not None and name in settings.models}
    if failed:
        settings = replace(settings, models=MappingProxyType({**settings.models, **failed}))
    guard_fleet_not_emptied(settings, fleet, allow_empty=allow_empty)
    scaled = {name: replace(model, replicas=min(max(replicas[name], model.scaling.min), model.scaling.max))
              for name, model in settings.models.items()
              if model.scaling is not None and name in replicas and replicas[name] != model.replicas}
    if scaled:
        settings = replace(settings, models=MappingProxyType({**settings.models, **scaled}))
    return _Planner(settings, fleet, canaries).run()
