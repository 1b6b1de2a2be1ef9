"""Replicas spread over several nodes, inside a planning pass: judging their shards (stage 1) and placing them
(stage 2) with `llmgw.plan.multinode.place_multinode`. Private to llmgw.plan; mixed into the planner.

When a replica spans nodes: its engine has a multi-node command line (`MULTI_NODE_ENGINES`: vLLM's `--nnodes`,
`--node-rank`, `--master-addr`) and its model asks for more whole GPUs of its class (`resources.gpus`, that is
tensor parallel x pipeline parallel) than the alive node with the most cards of that class has. It is then split
evenly over as few nodes as fit (`split_over_nodes`: 16 GPUs on 8-GPU nodes gives 2 shards of 8), one shard per
node, shard k ("<replica>/<k>") of rank k; rank 0's node address with a port of `RENDEZVOUS_PORTS` is the
rendezvous, and rank 0's shard id names the group. A MIG class never spans nodes. Other engines stay on one node
and are refused there with each node's reason; for llama.cpp (which has the command lines,
`llmgw.engines.llamacpp.rpc_command_line`, but whose build lacks RPC) `LLAMACPP_SPAN_REFUSAL` comes first.

A spread replica is one process group (NCCL): it serves only while every rank runs.
- Stage 1: its current shards (its fingerprint, on a fit node, on healthy cards) are kept when there is exactly one
  running shard per rank on distinct nodes; a shard of another generation is kept serving until every rank of the
  new generation is ready, then stopped. When a rank is missing (its node lost, its card out for health) or has
  failed or stopped, the other ranks cannot go on alone: every current shard stops and the replica is placed again
  as a whole (there is no restart of one rank in place).
- Stage 2: the nodes that could take a shard (open, labels matching, engine installed or installable) are offered
  to `place_multinode` with their free cards of the class. A node that lacks the engine gets an INSTALL and the
  replica waits for it; a refusal carries every node's reason.
"""

from __future__ import annotations

import hashlib

from llmgw.identity import ShardState, new_shard_id
from llmgw.plan.capacity import Demand
from llmgw.plan.health import unhealthy_devices
from llmgw.plan.multinode import NodeOffer, place_multinode, split_over_nodes
from llmgw.plan.placing import Pending
from llmgw.plan.types import Action, ActionKind, Assignment, NodeState, ObservedShard, Unplaced

_RUNNING = frozenset({ShardState.READY, ShardState.STARTING, ShardState.FETCHING, ShardState.PENDING})
_GONE = frozenset({ShardState.STOPPED, ShardState.STOPPING})
_HEALTHY = frozenset({ShardState.READY, ShardState.STARTING})
_RANK = {ShardState.READY: 0, ShardState.STARTING: 1, ShardState.FETCHING: 2, ShardState.PENDING: 3,
         ShardState.FAILED: 4, ShardState.STOPPED: 5, ShardState.STOPPING: 6}


MULTI_NODE_ENGINES = frozenset({"vllm"})
"""Engines whose shards llmgw can start as ranks of one replica over several nodes (`llmgw.engines.vllm`)."""

LLAMACPP_SPAN_REFUSAL = "llama.cpp is not spread over nodes: llmgw's build has no RPC (rpc-server, -DGGML_RPC=ON)"
"""Why a llama.cpp replica larger than one node is refused on every node (docs/placement.md)."""


RENDEZVOUS_PORTS = (29500, 1000)
"""(first, count): rank 0 of a spread replica listens for its peers on a port of this range, picked from its group id
(so every rank computes the same one; two groups whose rank 0 share a node collide with odds 1 in 1000). 29500 is
torch.distributed's customary master port."""


def rendezvous_of(address: str, group: str) -> str:
    """"host:port" where rank 0 of `group` (its shard id) on `address` waits for the other ranks."""
    first, count = RENDEZVOUS_PORTS
    port = first + int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) % count
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def largest_nodes(nodes: list[NodeState]) -> dict[str, int]:
    """{GPU class: the most whole cards of that class one alive node has}."""
    out: dict[str, int] = {}
    for node in nodes:
        if not node.alive:
            continue
        counts: dict[str, int] = {}
        for gpu in node.gpus:
            if not gpu.is_mig:
                counts[gpu.gpu_class] = counts.get(gpu.gpu_class, 0) + 1
        for cls, count in counts.items():
            out[cls] = max(out.get(cls, 0), count)
    return out


class Spanning:
    """The planner's steps for replicas spread over several nodes (see the module docstring). Expects the
    attributes and methods of `llmgw.plan.placing.Placement` (mixed into the planner beside it)."""

    def init_spanning(self) -> None:
        """Set up for one pass: the largest node of each GPU class, and the spans worked out so far."""
        self.largest = largest_nodes(self.nodes)
        self.spans: dict[tuple[str, int, str], tuple[int, int] | str | None] = {}

    def span_of(self, demand: Demand) -> tuple[int, int] | str | None:
        """(nodes, GPUs per node) when `demand` spans nodes, a sentence when it should but cannot be split evenly,
        None when it fits one node (or is a CPU or MIG demand). Cached per pass."""
        cache = self.spans
        key = (demand.engine, demand.gpus, demand.gpu_class)
        if key not in cache:
            most = self.largest.get(demand.gpu_class, 0)
            span = None
            if demand.engine in MULTI_NODE_ENGINES and demand.gpus and not demand.refusal and 0 < most < demand.gpus:
                span = split_over_nodes(demand.gpus, most)
            cache[key] = span
        return cache[key]

    def spanning_refusal(self, demand: Demand) -> str:
        """Why `demand` is not spread over nodes though no alive node has enough cards of its class for it
        (`LLAMACPP_SPAN_REFUSAL` for llama.cpp), "" otherwise. Such a replica stays on the one-node path: each node
        says why it cannot hold it, and this sentence comes first, on "all nodes"."""
        most = self.largest.get(demand.gpu_class, 0)
        if demand.engine == "llama.cpp" and demand.gpus and not demand.refusal and 0 < most < demand.gpus:
            return LLAMACPP_SPAN_REFUSAL
        return ""

    def judge_spanning(self, replica_id: str, model_name: str, demand: Demand, span: tuple[int, int] | str,
                       shards: list[tuple[NodeState, ObservedShard]], taken: set[str]) -> Pending | None:
        """Stage 1 for a spread replica: keep its whole current group, keep a group serving while its replacement
        starts (a rank on a drained node or a card out for health, or a new generation), stop what is broken;
        return the replica as pending when it needs placing."""
        ranks = span[0] if isinstance(span, tuple) else 0
        groups: dict[str, dict[int, tuple[NodeState, ObservedShard]]] = {}
        for node, shard in sorted(shards, key=lambda p: (_RANK[p[1].state], p[0].node_id, p[1].shard_id)):
            if shard.state not in _GONE:
                groups.setdefault(f"{shard.fingerprint}|{shard.group}", {}).setdefault(shard.rank, (node, shard))
        judged = []
        for key, members in groups.items():
            whole = (ranks > 0 and sorted(members) == list(range(ranks))
                     and all(s.state in _RUNNING for _, s in members.values())
                     and len({n.node_id for n, _ in members.values()}) == ranks)
            current = key.startswith(demand.fingerprint + "|")
            moving = [why for why in (self._unfit(n, s, demand) for n, s in members.values()) if why] if current else []
            ready = whole and all(s.state is ShardState.READY for _, s in members.values())
            judged.append((key, members, whole, current, moving, ready))
        keepable = [j for j in judged if j[2] and j[3] and not j[4]]
        primary = min(keepable, key=lambda j: (not j[5], j[0])) if keepable else None
        ready_models = self.ready.setdefault(model_name, set())
        if primary is not None:
            members = primary[1]
            rendezvous = rendezvous_of(members[0][0].address, members[0][1].group or members[0][1].shard_id)
            for rank in range(ranks):
                node, shard = members[rank]
                assignment = Assignment(replica_id, model_name, node.node_id, shard.devices, shard.cpu_cores,
                                        shard.memory_bytes, demand.fingerprint, shard.shard_id, rank, ranks,
                                        rendezvous, group=shard.group)
                self.assignments.append(assignment)
                self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, model_name))
                self.actions.append(Action(ActionKind.KEEP, node.node_id, replica_id, shard.shard_id, model_name,
                                           assignment=assignment))
            if primary[5]:
                ready_models.add(replica_id)
        replaced = primary is not None and primary[5]
        kept, why_not = [], ""
        for key, members, whole, current, moving, ready in sorted(judged, key=lambda j: j[0]):
            if primary is not None and key == primary[0]:
                continue
            serving = whole and all(s.state in _HEALTHY for _, s in members.values())
            if whole and current and not moving and primary is not None:
                why = f"duplicate of group {primary[0].split('|')[1] or primary[1][0][1].shard_id}"
            elif replaced:
                why = "replaced: every rank of its replacement is ready"
            elif not whole:
                why = f"{replica_id} is placed again as a whole: {self._broken(members, ranks, span)}"
                why_not = why_not or why.split(": ", 1)[1]
            elif not serving:
                why = (f"moves before it served ({'; '.join(moving)})" if current
                       else "superseded by a new generation before it served")
            else:
                why = ""
            for rank in sorted(members):
                node, shard = members[rank]
                if why:
                    self.stop(node, shard, why)
                    continue
                if ready and rank == 0:
                    ready_models.add(replica_id)
                self.holds.append((node.node_id, shard.devices, shard.cpu_cores, shard.memory_bytes, None))
                self.actions.append(Action(ActionKind.KEEP, node.node_id, replica_id, shard.shard_id, model_name,
                                           reason="kept serving until every rank of its replacement is ready"))
                kept.append((node, shard))
            if not why and moving:
                why_not = why_not or f"moves: {'; '.join(moving)}"
        for node, shard in shards:  # duplicates of a rank inside one group
            chosen = groups.get(f"{shard.fingerprint}|{shard.group}", {}).get(shard.rank)
            if self.hold_draining(node, shard):  # its cards are not free until it stopped
                continue
            if shard.state not in _GONE and chosen is not None and chosen[1] is not shard:
                self.stop(node, shard, f"duplicate of rank {shard.rank} ({chosen[1].shard_id})")
        if primary is not None:
            return None
        item = Pending(replica_id, demand, taken, old=kept)
        if why_not:
            item.reason = why_not if why_not.startswith("moves") else f"placed again as a whole: {why_not}"
        elif kept:
            item.reason = f"rolling: new generation of {kept[0][1].shard_id}"
        return item

    def _unfit(self, node: NodeState, shard: ObservedShard, demand: Demand) -> str:
        """Why a running rank of the current generation must move ("" when it may stay)."""
        if node.node_id in self.evicted:
            return f"{node.node_id}: {self.closed[node.node_id]}"
        if demand.selector and not all(self.node_labels(node).get(k) == v for k, v in demand.selector):
            return f"{node.node_id} no longer matches the node selector"
        bad = unhealthy_devices(node, shard.devices)
        if bad:
            return f"{node.node_id}: GPU {', '.join(bad)} out for health"
        return ""

    @staticmethod
    def _broken(best: dict[int, tuple[NodeState, ObservedShard]], ranks: int, span) -> str:
        if not ranks:
            return str(span)
        extra = sorted(r for r in best if r >= ranks)
        if extra:
            return f"it was formed for more than {ranks} nodes (rank {extra[-1]}); the fleet now asks for {ranks}"
        missing = [r for r in range(ranks) if r not in best]
        if missing:
            return f"rank {', '.join(map(str, missing))} of {ranks} is gone"
        down = [f"rank {r} {s.state.value}" for r, (_, s) in sorted(best.items()) if s.state not in _RUNNING]
        if down:
            return ", ".join(down)
        return f"its shards share a node (a {ranks}-node group needs {ranks} nodes)"

    def place_spanning(self, item: Pending, span: tuple[int, int] | str) -> None:
        """Stage 2 for a spread replica: START one shard per rank, or INSTALL where its engine is missing, or say
        why it fits nowhere."""
        demand = item.demand
        if isinstance(span, str):
            self.unplaced.append(Unplaced(item.replica_id, demand.model, (("all nodes", span),)))
            return
        ranks, per_node = span
        offers, reasons, engines = [], {}, {}
        by_id = {n.node_id: n for n in self.alive}
        for node_id in sorted(by_id):
            node, room = by_id[node_id], self.rooms[node_id]
            if node_id in self.closed:
                reasons[node_id] = self.closed[node_id]
                continue
            if demand.selector and not room.labels_match(demand):
                reasons[node_id] = room.why_not(demand)
                continue
            if demand.gpu_class not in room.counts:
                continue  # said below, as `place_multinode` is offered only the class's nodes
            engine = room.engine_state(demand)
            if engine in ("unknown", "not installable"):
                reasons[node_id] = f"{demand.engine} is {engine} here"
                continue
            engines[node_id] = engine
            free = tuple(g.device_id for g in room.free.get(demand.gpu_class, ())
                         if g.memory_free_bytes >= demand.gpu_memory)
            link = node.interconnect
            offers.append(NodeOffer(node_id, node.address, free, link.domain, link.domain_ready,
                                    link.domain_reason, link.adapters))
        placed = place_multinode(offers, ranks, per_node)
        if not placed.placed:
            reasons.update((n, why) for n, why in placed.reasons if n)
            for node_id in sorted(by_id):
                reasons.setdefault(node_id, f"no {demand.gpu_class} GPUs")
            prefix = f"needs {ranks} nodes of {per_node} x {demand.gpu_class} on one NVLink domain or InfiniBand fabric"
            self.unplaced.append(Unplaced(item.replica_id, demand.model,
                                          (("all nodes", prefix), *sorted(reasons.items()))))
            return
        waiting = [s.node_id for s in placed.shards if engines[s.node_id] != "ready"]
        for slot in placed.shards:
            self.hold(self.rooms[slot.node_id], slot.devices, demand.cpu_cores, demand.memory, demand.model)
        if waiting:
            for node_id in waiting:
                self.install(self.rooms[node_id], demand, item.replica_id, engines[node_id])
            self.unplaced.append(Unplaced(item.replica_id, demand.model, tuple(
                (n, f"installing {demand.engine} for rank {s.rank}") for s in placed.shards
                for n in [s.node_id] if n in waiting)))
            return
        where = f"rank {{}} of {ranks} over {'NVLink domain' if placed.via == 'nvlink' else 'InfiniBand fabric'} " \
                f"{placed.fabric}{'' if placed.aligned else ' (leaves not aligned)'}"
        group = rendezvous = ""
        for slot in placed.shards:
            shard_id = new_shard_id(item.replica_id, demand.fingerprint, item.taken, slot.rank)
            item.taken.add(shard_id)
            if not group:  # rank 0 comes first
                group, rendezvous = shard_id, rendezvous_of(placed.rendezvous, shard_id)
            assignment = Assignment(item.replica_id, demand.model, slot.node_id, slot.devices, demand.cpu_cores,
                                    demand.memory, demand.fingerprint, shard_id, slot.rank, ranks,
                                    rendezvous, slot.env, group)
            self.assignments.append(assignment)
            previous = item.previous_node if item.previous_node != slot.node_id else ""
            self.actions.append(Action(ActionKind.START, slot.node_id, item.replica_id, shard_id, demand.model,
                                       assignment=assignment, reason=f"{item.reason}: {where.format(slot.rank)}",
                                       previous_node=previous))
