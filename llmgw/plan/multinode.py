"""Multi-node placement: one replica over several nodes (pipeline or tensor parallel across machines). Pure.

`make_plan` calls it for every replica that needs more GPUs than one node has (`llmgw.plan.spanning`); it is
tested on its own with seeded random fleets (tests/plan/test_multinode_invariants.py) and through the planner
(tests/plan/test_multinode_planning.py).

The order of preference (issue 14):
1. one multi-node NVLink domain, on nodes whose every card joined the domain and whose IMEX is up
   (`NodeOffer.domain_ready`); the shards are told `NCCL_MNNVL_ENABLE=1`;
2. else one InfiniBand fabric (named by its lowest subnet manager GUID, so two physical fabrics are never taken
   for one whatever an operator calls them): nodes whose adapters hang from the same leaves first (one leaf, or
   rails aligned: every node's Nth adapter on the Nth rail's leaf), then any nodes of the fabric; the shards are
   told `NCCL_IB_HCA` naming their adapters on that fabric;
3. else refuse, with each node's reason.
Within a tier, the group that fits with the fewest spare nodes wins (best fit), then the lowest name; within a
group, nodes with the fewest free devices that still fit, then node id. Rank 0 is the first node chosen; its
address is the rendezvous address.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.identity import ShardState
from llmgw.plan.types import Interconnect, NodeState
from llmgw.tools.node_report import NodeHealthReport


@dataclass(frozen=True)
class NodeOffer:
    """What one alive node offers a multi-node replica.

    `free` the device ids of the demanded GPU class that are free (healthy, not held, no foreign processes);
    `domain` the node's NVLink domain (ClusterUUID; None: none) and `domain_ready` whether every card joined it
    and IMEX is up (`domain_reason` says why not); `adapters` ((adapter, fabric id, leaf), ...) of its active
    InfiniBand ports in rail order (fabric "" unknown, leaf "" unknown).
    """

    node_id: str
    address: str
    free: tuple[str, ...]
    domain: str | None = None
    domain_ready: bool = False
    domain_reason: str = ""
    adapters: tuple[tuple[str, str, str], ...] = ()

    def fabrics(self) -> tuple[str, ...]:
        return tuple(sorted({fabric for _, fabric, _ in self.adapters if fabric}))

    def leaves(self, fabric: str) -> tuple[str, ...]:
        """The leaf of each of its adapters on `fabric`, in rail order ("" where unknown)."""
        return tuple(leaf for _, f, leaf in self.adapters if f == fabric)


@dataclass(frozen=True)
class ShardSlot:
    """One shard of the replica: its `rank` (0 the rendezvous), `node_id`, `devices`, and the environment it is
    started with (NCCL variables)."""

    rank: int
    node_id: str
    devices: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class MultiNodePlacement:
    """Where a multi-node replica goes: `via` "nvlink" or "infiniband", `fabric` the domain's ClusterUUID or the
    InfiniBand fabric id, `aligned` whether its nodes share their leaves (always True over NVLink),
    `rendezvous` rank 0's address, `shards` by rank. Or a refusal: `shards` empty and `reasons` ((node, why), ...)
    for every node offered, plus ("", why) when no node was offered."""

    via: str = ""
    fabric: str = ""
    aligned: bool = False
    rendezvous: str = ""
    shards: tuple[ShardSlot, ...] = ()
    reasons: tuple[tuple[str, str], ...] = ()

    @property
    def placed(self) -> bool:
        return bool(self.shards)


def split_over_nodes(gpus: int, largest: int, nodes: int | None = None) -> tuple[int, int] | str:
    """(nodes, devices per node) for a replica of `gpus` devices (tp x pp) when the largest node has `largest`
    free devices of the class; `nodes` as the settings give it (None: as few as fit). A replica that fits on one
    node gives (1, gpus). Returns a sentence instead when it cannot be split evenly."""
    if gpus <= 0:
        return "a multi-node replica needs GPUs"
    if nodes is not None:
        if nodes <= 0 or gpus % nodes:
            return f"{gpus} GPUs cannot be split evenly over {nodes} nodes"
        return nodes, gpus // nodes
    for count in range(1, gpus + 1):
        if gpus % count == 0 and gpus // count <= max(largest, 0):
            return count, gpus // count
    return f"no split of {gpus} GPUs fits nodes with at most {largest} free"


def _pick(offers: list[NodeOffer], count: int) -> list[NodeOffer]:
    """`count` offers: fewest free devices first (best fit), then node id."""
    return sorted(offers, key=lambda o: (len(o.free), o.node_id))[:count]


def _slots(chosen: list[NodeOffer], per_node: int, env_of) -> tuple[ShardSlot, ...]:
    return tuple(ShardSlot(rank, offer.node_id, offer.free[:per_node], env_of(offer))
                 for rank, offer in enumerate(sorted(chosen, key=lambda o: o.node_id)))


def place_multinode(offers: Iterable[NodeOffer], nodes: int, per_node: int) -> MultiNodePlacement:
    """Place one replica of `nodes` shards with `per_node` devices each over `offers` (see the module
    docstring). Deterministic: the order of `offers` does not matter. Never raises."""
    offers = sorted(offers, key=lambda o: o.node_id)
    if not offers:
        return MultiNodePlacement(reasons=(("", "no alive node offers the GPU class"),))
    fit = [o for o in offers if len(o.free) >= per_node]
    reasons = {o.node_id: f"{len(o.free)} of {per_node} GPUs free" for o in offers if len(o.free) < per_node}

    domains: dict[str, list[NodeOffer]] = {}
    for offer in fit:
        if offer.domain and offer.domain_ready:
            domains.setdefault(offer.domain, []).append(offer)
    usable = sorted((len(group), name) for name, group in domains.items() if len(group) >= nodes)
    if usable:
        name = usable[0][1]
        chosen = _pick(domains[name], nodes)
        slots = _slots(chosen, per_node, lambda o: (("NCCL_MNNVL_ENABLE", "1"),))
        return MultiNodePlacement("nvlink", name, True, _address(chosen, slots), slots)

    candidates: list[tuple[int, int, str, tuple[str, ...], list[NodeOffer]]] = []
    fabrics: dict[str, list[NodeOffer]] = {}
    for offer in fit:
        for fabric in offer.fabrics():
            fabrics.setdefault(fabric, []).append(offer)
    for fabric, group in fabrics.items():
        by_leaves: dict[tuple[str, ...], list[NodeOffer]] = {}
        for offer in group:
            leaves = offer.leaves(fabric)
            if leaves and all(leaves):
                by_leaves.setdefault(leaves, []).append(offer)
        for leaves, aligned in by_leaves.items():
            if len(aligned) >= nodes:
                candidates.append((0, len(aligned), fabric, leaves, aligned))
        if len(group) >= nodes:
            candidates.append((1, len(group), fabric, (), group))
    if candidates:
        rank, _, fabric, _, group = min(candidates, key=lambda c: (c[0], c[1], c[2], c[3]))
        chosen = _pick(group, nodes)

        def env(offer: NodeOffer, fabric: str = fabric) -> tuple[tuple[str, str], ...]:
            adapters = [ca for ca, f, _ in offer.adapters if f == fabric]
            return (("NCCL_IB_HCA", ",".join(adapters)),)

        slots = _slots(chosen, per_node, env)
        return MultiNodePlacement("infiniband", fabric, rank == 0, _address(chosen, slots), slots)

    for offer in fit:
        why = []
        if offer.domain and not offer.domain_ready:
            why.append(f"NVLink domain {offer.domain} not ready ({offer.domain_reason or 'IMEX or a card'})")
        elif offer.domain:
            why.append(f"NVLink domain {offer.domain} has {len(domains.get(offer.domain, []))} of {nodes} nodes")
        if offer.fabrics():
            why.append("; ".join(f"InfiniBand fabric {f} has {len(fabrics[f])} of {nodes} nodes"
                                 for f in offer.fabrics()))
        if not why:
            why.append("in no NVLink domain and on no known InfiniBand fabric")
        reasons[offer.node_id] = "; ".join(why)
    return MultiNodePlacement(reasons=tuple(sorted(reasons.items())))


def _address(chosen: list[NodeOffer], slots: tuple[ShardSlot, ...]) -> str:
    first = slots[0].node_id
    return next(o.address for o in chosen if o.node_id == first)


def interconnect_of(report: NodeHealthReport | None,
                    leaves: Mapping[tuple[str, int], str] | None = None) -> Interconnect:
    """What a node offers a spread replica, from its health report (None: nothing known yet).

    Its NVLink domain is ready when every card joined it and IMEX is configured (the reason says which is
    missing); its adapters are its active InfiniBand ports (by adapter and port order) with their fabric ids, and
    the leaf switch of each from `leaves` ({(adapter, port): leaf GUID}, from the fabric map,
    `llmgw.tools.adapter_leaves`; "" where not known).
    """
    if report is None:
        return Interconnect()
    domain = report.domain.domain
    ready = domain is not None and report.imex
    reason = report.domain.reason if domain is None else "" if ready else "IMEX is not up on this node"
    leaves = leaves or {}
    adapters = tuple((p.ca, report.port_fabric(p.ca, p.port), leaves.get((p.ca, p.port), ""))
                     for p in sorted(report.ib_ports, key=lambda p: (p.ca, p.port))
                     if p.link_layer.lower() == "infiniband" and p.state.lower() == "active"
                     and report.port_fabric(p.ca, p.port))
    return Interconnect(domain, ready, reason, adapters)


_NOT_HOLDING = (ShardState.STOPPED, ShardState.FAILED)


def offers_for(nodes: Iterable[NodeState], gpu_class: str) -> tuple[NodeOffer, ...]:
    """What each alive node offers a spread replica of `gpu_class`, from the fleet alone (`NodeState.interconnect`):
    free devices are whole cards of the class, healthy, without foreign processes, held by no shard that still
    runs. The planner builds its offers from its own running tally instead (`llmgw.plan.spanning`); this is the
    same view for a fleet at rest (status pages, tests)."""
    offers = []
    for node in nodes:
        if not node.alive:
            continue
        held = {d for s in node.shards if s.state not in _NOT_HOLDING for d in s.devices}
        free = tuple(g.device_id for g in node.gpus if g.gpu_class == gpu_class and not g.is_mig
                     and not g.unhealthy and not g.foreign_processes and g.device_id not in held)
        link = node.interconnect
        offers.append(NodeOffer(node.node_id, node.address, free, link.domain, link.domain_ready,
                                link.domain_reason, link.adapters))
    return tuple(offers)
