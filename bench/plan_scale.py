"""How long the planner takes at fleet scale.

A simulated fleet of 1,000 nodes with 8 H100-class GPUs each (NVLink, two NUMA nodes, some cards busy
with foreign processes, two zones) and a catalog of 300 models with 2,000 replicas in all (1 to 8 GPUs per
replica, tensor parallel within a node, some with a zone selector). It times:

- the full plan: every replica placed on an empty fleet (targets about 1 s);
- a no-op plan: the plan of the converged fleet, where every shard is READY and nothing changes
  (target 10 ms or less);
- a cold pass of the control plane: `llmgw.control.decide` over that fleet as a `ControlState` with no plan to
  reuse (the fleet view with agent settings, the plan, in-flight bookkeeping): what a pass after a change costs;
- a no-op pass: `decide` again after every node sent a heartbeat that changes readings only (GPU memory used,
  utilisation), as a timer pass finds the fleet at steady state (target 50 ms or less at 10,000 nodes);
- the memory the fleet registry and the pass's state hold (tracemalloc, after the timings).

Run: `.venv/bin/python bench/plan_scale.py [--nodes 1000] [--models 300] [--replicas 2000] [--repeat 5]`; the
issue's size is `--nodes 10000 --replicas 20000 --repeat 3`. Prints the times (wall median and best of `--repeat`
runs, and CPU median) and the plan's size. Pure CPU; no I/O.
"""

from __future__ import annotations

import argparse
import statistics
import time

from llmgw.control import decide
from llmgw.plan import ActionKind, Fleet, GpuState, NodeState, ObservedShard, Plan, ShardState, make_plan
from llmgw.settings.model import ClusterSettings, EngineVersion, Model, Resources, Settings, WeightsFile, frozen_map

GiB = 1024**3
ENGINE = "llama.cpp@b11434"
GPU_PATTERN = (1, 2, 4, 1, 2, 8, 1, 2, 4, 1)


def build_fleet(node_count: int) -> Fleet:
    """`node_count` nodes of 8 H100s; every 13th node has one card with foreign processes."""
    ids = tuple(str(i) for i in range(8))
    nodes = []
    for n in range(node_count):
        gpus = tuple(
            GpuState(device_id=ids[i], gpu_class="h100-80g", memory_total_bytes=80 * GiB,
                     memory_free_bytes=79 * GiB, uuid=f"GPU-{n:04d}-{i}", foreign_processes=(n % 13 == 0 and i == 7),
                     numa_node=i // 4, nvlink_peers=tuple(d for d in ids if d != ids[i]))
            for i in range(8))
        nodes.append(NodeState(f"node{n:04d}", address=f"10.{n // 256}.{n % 256}.1",
                               labels=(("zone", "a" if n % 2 else "b"),), cpu_cores=192, memory_bytes=2048 * GiB,
                               gpus=gpus, engines_installed=frozenset({ENGINE})))
    return Fleet(tuple(nodes))


def build_settings(model_count: int, replica_count: int) -> Settings:
    """`model_count` models sharing `replica_count` replicas as evenly as possible."""
    models = {}
    base, extra = divmod(replica_count, model_count)
    for m in range(model_count):
        gpus = GPU_PATTERN[m % len(GPU_PATTERN)]
        name = f"model{m:03d}"
        models[name] = Model(
            name=name, engine="llama.cpp",
            weights=(WeightsFile(f"hf://org/{name}@{'0' * 40}/w.gguf", f"{m:064x}"),),
            replicas=base + (1 if m < extra else 0),
            resources=Resources(gpus=gpus, gpu_class="h100-80g", tensor_parallel=gpus, gpu_memory_bytes=40 * GiB),
            context_size=8192, node_selector=frozen_map({"zone": "a"} if m % 7 == 0 else {}),
        )
    engines = {("llama.cpp", "b11434"): EngineVersion("llama.cpp", "b11434", default=True)}
    return Settings(cluster=ClusterSettings(name="bench"), models=frozen_map(models), engines=frozen_map(engines),
                    commit="0" * 40)


def converged(plan: Plan, fleet: Fleet) -> Fleet:
    """The fleet once every START of `plan` runs and is READY."""
    started: dict[str, list[ObservedShard]] = {}
    for action in plan.actions:
        if action.kind is ActionKind.START:
            a = action.assignment
            started.setdefault(action.node_id, []).append(ObservedShard(
                action.shard_id, action.replica_id, action.model, ShardState.READY, a.fingerprint,
                plan.settings_commit or "", a.devices, a.cpu_cores, a.memory_bytes, port=40000))
    return Fleet(tuple(NodeState(n.node_id, n.address, n.alive, n.labels, n.cpu_cores, n.memory_bytes, n.gpus,
                                 n.engines_installed, n.engines_installing, tuple(started.get(n.node_id, ())))
                       for n in fleet.nodes))


def timed(function, repeat: int) -> tuple[float, float, float, object]:
    """(median wall seconds, best wall seconds, median CPU seconds of this process, last result) of `repeat` calls.

    CPU time is printed beside wall time because the machines this runs on are often shared: wall time then
    includes waiting for a core, CPU time does not.
    """
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        cpu, start = time.process_time(), time.perf_counter()
        result = function()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), min(walls), statistics.median(cpus), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--models", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    fleet = build_fleet(args.nodes)
    settings = build_settings(args.models, args.replicas)
    full_median, full_best, full_cpu, plan = timed(lambda: make_plan(settings, fleet), args.repeat)
    starts = sum(1 for a in plan.actions if a.kind is ActionKind.START)
    gpus = sum(len(a.devices) for a in plan.assignments)
    print(f"fleet: {args.nodes} nodes x 8 GPUs; catalog: {args.models} models, {args.replicas} replicas")
    print(f"full plan:    median {full_median * 1000:8.1f} ms  best {full_best * 1000:8.1f} ms  "
          f"cpu {full_cpu * 1000:8.1f} ms  ({starts} starts, {gpus} GPUs assigned, {len(plan.unplaced)} unplaced)"
          "  target ~1000 ms (1,000 nodes), <= 2000 ms (10,000)")

    fleet = converged(plan, fleet)
    noop_median, noop_best, noop_cpu, again = timed(lambda: make_plan(settings, fleet), max(args.repeat, 20))
    if again.changes:
        raise SystemExit("the converged fleet still plans changes: the benchmark is wrong")
    print(f"no-op plan:   median {noop_median * 1000:8.1f} ms  best {noop_best * 1000:8.1f} ms  "
          f"cpu {noop_cpu * 1000:8.1f} ms  ({len(again.actions)} keeps; what a pass after a change plans)")

    state = control_state(settings, fleet)
    cold_median, cold_best, cold_cpu, (decision, state) = timed(lambda: decide(state, 0.0), args.repeat)
    if decision.send or not decision.record.converged:
        raise SystemExit("the control plane's cold pass sends something: the benchmark is wrong")
    print(f"cold decide:  median {cold_median * 1000:8.1f} ms  best {cold_best * 1000:8.1f} ms  "
          f"cpu {cold_cpu * 1000:8.1f} ms  (the whole pass with nothing to reuse: fleet view, plan, bookkeeping)")

    state = readings_beat(state, fleet, 1.0)
    pass_median, pass_best, pass_cpu, (decision, _) = timed(lambda: decide(state, 2.0), max(args.repeat, 20))
    if decision.send or not decision.record.converged:
        raise SystemExit("the control plane's no-op pass sends something: the benchmark is wrong")
    print(f"no-op decide: median {pass_median * 1000:8.1f} ms  best {pass_best * 1000:8.1f} ms  "
          f"cpu {pass_cpu * 1000:8.1f} ms  (after a readings-only heartbeat of every node)  target <= 50 ms")

    beat_median, _, beat_cpu, _ = timed(lambda: readings_beat(state, fleet, 3.0, count=1000), 3)
    print(f"heartbeats:   {beat_median * 1e6 / 1000:8.1f} us each (registry transition of a readings-only "
          f"heartbeat; cpu {beat_cpu * 1e6 / 1000:.1f} us)")
    print_memory(settings, plan, args.nodes)


def readings_beat(state, fleet: Fleet, now: float, count: int | None = None):
    """`state` after a heartbeat of the first `count` nodes (all: None) that changes readings only: every card's
    used memory moves by a few MiB (never across the catalog's 40 GiB need), cards held by foreign processes stay
    held, shards and engines as before."""
    from llmgw.control.readings import GpuSample, NodeReadings

    registry = state.fleet
    for n, node in enumerate(fleet.nodes[:count]):
        readings = NodeReadings(at=now, gpus=tuple(
            GpuSample(index=i, utilization_percent=float((n + i) % 100), memory_used_bytes=(1 + n % 7) * 2**20,
                       foreign_pids=(4242,) if gpu.foreign_processes else ())
            for i, gpu in enumerate(node.gpus)))
        registry, changed = registry.heartbeat(node.node_id, now, shards=node.shards,
                                               engines_installed=node.engines_installed, readings=readings)
        if changed:
            raise SystemExit("a readings-only heartbeat was placement-relevant: the benchmark is wrong")
    return state.with_fleet(registry)


def print_memory(settings: Settings, plan: Plan, node_count: int) -> None:
    """Bytes a converged fleet's state holds: the nodes as reported (GPUs, shards), the fleet registry, and a cold
    pass's plan and basis (tracemalloc while building them again, after the timings)."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    fleet = build_fleet(node_count)
    fleet = converged(plan, fleet)
    nodes = tracemalloc.get_traced_memory()[0] - base
    state = control_state(settings, fleet)
    registry = tracemalloc.get_traced_memory()[0] - base - nodes
    _, state = decide(state, 0.0)
    total = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    count = len(fleet.nodes)
    print(f"memory:       {total / 2**20:8.1f} MiB in all: {nodes / 2**20:.1f} MiB the {count} nodes as reported "
          f"({nodes / count / 1024:.1f} KiB a node), {registry / 2**20:.1f} MiB the registry, "
          f"{(total - nodes - registry) / 2**20:.1f} MiB a pass's plan and basis (tracemalloc)")


def control_state(settings: Settings, fleet: Fleet):
    """A leader's `ControlState` holding `fleet`, every node connected (its agent listing every feature) and its agent
    settings acknowledged, the registry judging free memory against the catalog's needs as `llmgw server` sets it."""
    from llmgw.control import ControlState, FleetRegistry
    from llmgw.control.reports import memory_thresholds
    from llmgw.control.state import Leadership, WatchState, frozen
    from llmgw.plan import agent_settings_fingerprint
    from llmgw.wire.features import ALL

    registry = FleetRegistry(lost_after=30.0, memory_thresholds=memory_thresholds(settings))  # as the plane sets it
    for node in fleet.nodes:
        registry, _ = registry.register(node, 0.0, features=ALL)  # agents of this version
    acked = {n.node_id: agent_settings_fingerprint(settings, n.node_id) for n in fleet.nodes}
    return ControlState(watch=WatchState(settings=settings), fleet=registry, leadership=Leadership(True, "bench"),
                        acked_settings=frozen(acked))


if __name__ == "__main__":
    main()
