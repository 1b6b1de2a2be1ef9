"""Builders of settings and fleets for the planner's tests (plain data, as the control plane builds them).

GPU nodes follow the shape of the real H200 capture in shared/fixtures/nvidia-h200 (8 devices "0".."7",
NVLink between all of them, two NUMA nodes of four); other classes use the same shape.
"""

from __future__ import annotations

from dataclasses import replace

from llmgw.plan import Fleet, GpuState, NodeState, ObservedShard, Plan, ShardState, fingerprint, make_plan
from llmgw.settings.model import (
    AgentSettings, ClusterSettings, EngineVersion, Model, Resources, Settings, WeightsFile, frozen_map,
)

GiB = 1024**3
LLAMA = "llama.cpp@b11434"
WEIGHTS = (WeightsFile("hf://google/gemma-3-270m@" + "a" * 40 + "/gemma.gguf", "ab" * 32),)


def model(name: str, *, replicas: int = 1, gpus: int = 0, gpu_class: str | None = None, tp: int = 1,
          pp: int = 1, cores: float = 1.0, memory: int | None = None, gpu_memory: int | None = None,
          selector: dict | None = None, args: tuple[str, ...] = (), context: int | None = None,
          version: str | None = None, engine: str = "llama.cpp", endpoints=()) -> Model:
    return Model(
        name=name, engine=engine, weights=WEIGHTS, engine_version=version, replicas=replicas,
        resources=Resources(gpus=gpus, gpu_class=gpu_class, gpu_memory_bytes=gpu_memory, tensor_parallel=tp,
                            pipeline_parallel=pp, cpu_cores=cores, memory_bytes=memory),
        context_size=context, engine_args=args, endpoints=endpoints, node_selector=frozen_map(selector),
    )


def settings(*models: Model, stopped: bool = False, allow_empty: bool = False, node_agents=None,
             commit: str | None = "c0ffee" * 6 + "abcd") -> Settings:
    engines = {("llama.cpp", "b11434"): EngineVersion("llama.cpp", "b11434", default=True),
               ("llama.cpp", "b12000"): EngineVersion("llama.cpp", "b12000")}
    agents = {k: v for k, v in (node_agents or {}).items()}
    return Settings(
        cluster=ClusterSettings(name="test", serving_stopped=stopped, allow_empty=allow_empty),
        models=frozen_map({m.name: m for m in models}), engines=frozen_map(engines),
        node_agents=frozen_map(agents), commit=commit,
    )


def gpu_node(node_id: str, *, count: int = 8, gpu_class: str = "h100-80g", free: int = 80 * GiB,
             foreign: tuple[int, ...] = (), labels: dict | None = None, alive: bool = True,
             engines=(LLAMA,), installing=(), shards=(), nvlink: bool = True, numa: bool = True,
             mig: bool = False, cpu_cores: float = 64, memory: int = 512 * GiB) -> NodeState:
    ids = [f"MIG-{node_id}-{i}" if mig else str(i) for i in range(count)]
    gpus = tuple(
        GpuState(device_id=ids[i], gpu_class=gpu_class, memory_total_bytes=80 * GiB, memory_free_bytes=free,
                 foreign_processes=i in foreign, is_mig=mig,
                 numa_node=(i * 2 // count if numa and not mig else None),
                 nvlink_peers=tuple(d for d in ids if d != ids[i]) if nvlink and not mig else ())
        for i in range(count))
    return NodeState(node_id, address=f"10.0.0.{node_id[-1]}", alive=alive,
                     labels=tuple(sorted((labels or {}).items())), cpu_cores=cpu_cores, memory_bytes=memory,
                     gpus=gpus, engines_installed=frozenset(engines), engines_installing=frozenset(installing),
                     shards=tuple(shards))


def cpu_node(node_id: str, *, cores: float = 8, memory: int = 32 * GiB, labels: dict | None = None,
             alive: bool = True, engines=(LLAMA,), installing=(), shards=()) -> NodeState:
    return NodeState(node_id, alive=alive, labels=tuple(sorted((labels or {}).items())), cpu_cores=cores,
                     memory_bytes=memory, engines_installed=frozenset(engines),
                     engines_installing=frozenset(installing), shards=tuple(shards))


def shard(m: Model, n: int, *, state: ShardState = ShardState.READY, devices=(), version: str = "b11434",
          fp: str | None = None, shard_id: str | None = None, foreign: bool = False, cores: float | None = None,
          memory: int | None = None) -> ObservedShard:
    replica = f"{m.name}-{n}"
    gpu = m.resources.gpus > 0
    return ObservedShard(
        shard_id=shard_id or f"{replica}/0", replica_id=replica, model=m.name, state=state,
        fingerprint=fp if fp is not None else fingerprint(m, version), devices=tuple(devices),
        cpu_cores=0.0 if gpu else (m.resources.cpu_cores if cores is None else cores),
        memory_bytes=0 if gpu else ((m.resources.memory_bytes or 0) if memory is None else memory),
        adopted_foreign=foreign,
    )


def fleet(*nodes: NodeState) -> Fleet:
    return Fleet(nodes=tuple(nodes))


def converge(s: Settings, f: Fleet, *, state: ShardState = ShardState.READY) -> Fleet:
    """The fleet after the agents did what `make_plan(s, f)` asked (starts/restarts done, stops gone)."""
    plan = make_plan(s, f)
    return apply_plan(plan, f, state=state)


def apply_plan(plan: Plan, f: Fleet, *, state: ShardState = ShardState.READY) -> Fleet:
    from llmgw.plan import ActionKind

    stops = {(a.node_id, a.shard_id) for a in plan.actions if a.kind is ActionKind.STOP}
    starts: dict[str, list[ObservedShard]] = {}
    restarts = {(a.node_id, a.shard_id) for a in plan.actions if a.kind is ActionKind.RESTART}
    installs: dict[str, set[str]] = {}
    for a in plan.actions:
        if a.kind is ActionKind.START:
            asg = a.assignment
            starts.setdefault(a.node_id, []).append(ObservedShard(
                a.shard_id, a.replica_id, a.model, state, asg.fingerprint, plan.settings_commit or "",
                asg.devices, asg.cpu_cores, asg.memory_bytes, rank=asg.rank, group=asg.group))
        elif a.kind is ActionKind.INSTALL:
            installs.setdefault(a.node_id, set()).add(a.engine)
    nodes = []
    for node in f.nodes:
        kept = tuple(
            replace(s, state=state) if (node.node_id, s.shard_id) in restarts else s
            for s in node.shards if (node.node_id, s.shard_id) not in stops)
        nodes.append(replace(node, shards=kept + tuple(starts.get(node.node_id, ())),
                             engines_installed=node.engines_installed | installs.get(node.node_id, set())))
    return Fleet(tuple(nodes))


def agents(**per_node: AgentSettings) -> dict:
    return per_node
