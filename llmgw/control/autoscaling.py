"""The autoscaler in the control plane: each pass reads every autoscaled model's load from the fleet and moves its
wanted replica count (`llmgw.plan.autoscaling` holds the rule). Pure.

The count is runtime state (`ControlState.scales`, a `Scale` per model whose catalog file gives `replicas: {min,
max}`), never a settings edit: the planner is told it (`make_plan(replicas=...)`), the status document shows it with
the last decision's reason (`scales_status`: `llmgw status`, every audit commit's status.yaml), and /metrics exports
it beside the ready count.

- `model_loads`: per model, its ready replicas, the requests running and waiting on their engines (the agents'
  last fresh readings of each READY shard's /metrics, `llmgw.agent.engine_load`), the mean KV-cache use, and the
  requests the gateway holds for it (`ControlState.held`, told by `held_changed`), and for a model with a
  `ttft_p90` target the TTFT p90 of its recent requests (`ControlState.ttfts`, while its last read is fresh).
- `watch_ttfts` (each pass): for each model with a `ttft_p90` target, every `TTFT_EVERY` seconds a `MeasureTtft`
  effect: the handler reads the TTFT of its successful requests of the last `TTFT_SPAN` seconds, and only those
  sent since its count last changed (the replicas that served them are the ones counted), from the usage records
  the gateway writes; `ttft_measured` takes the p90 in.
- `watch_scales` (each pass): a `Scale` for each autoscaled model (first from the replicas running, so a restart
  of the control plane scales nothing by itself; while the control plane is still recovering its fleet, taken
  from what runs again at every pass, since nodes that run replicas may not have reconnected yet), moved by
  `next_scale`, with a timer for when the rule wants to look again; scales of models no longer autoscaled are
  dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from llmgw.control.effects import Effect, MeasureTtft
from llmgw.control.state import ControlState, frozen
from llmgw.identity import ShardState
from llmgw.plan.autoscaling import TTFT_SPAN, ModelLoad, Scale, Ttft, initial_scale, next_scale
from llmgw.settings.model import Settings

_RUNNING = frozenset({ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING, ShardState.READY})
TTFT_EVERY = 5.0
"""Seconds between two reads of a model's TTFT p90; a read older than 3 of them no longer counts."""


def autoscaled(settings: Settings) -> dict[str, object]:
    """The catalog models whose replica count the autoscaler decides (a range, llmgw runs them), by name."""
    return {name: m.scaling for name, m in settings.models.items() if m.scaling is not None and not m.endpoints}


def model_loads(state: ControlState, now: float, models: Mapping[str, object]) -> dict[str, ModelLoad]:
    """{model: ModelLoad} of the `models` named, from the fleet's live nodes and their fresh readings at `now`
    (control-plane clock) and the requests the gateway holds. A model with nothing running has a ModelLoad of 0."""
    ready: dict[str, set[str]] = {name: set() for name in models}
    requests: dict[str, float] = dict.fromkeys(models, 0.0)
    kv: dict[str, list[float]] = {name: [] for name in models}
    for record in state.fleet.records():
        if record.lost:
            continue
        readings = record.readings if record.readings is not None and record.readings.fresh(now) else None
        engines = {r.shard_id: r.engine for r in readings.shards} if readings is not None else {}
        for shard in record.state.shards:
            if shard.model not in ready or shard.adopted_foreign or shard.state is not ShardState.READY:
                continue
            ready[shard.model].add(shard.replica_id)
            engine = engines.get(shard.shard_id)
            if engine is None:
                continue
            requests[shard.model] += (engine.requests_running or 0.0) + (engine.requests_waiting or 0.0)
            if engine.kv_cache_usage is not None:
                kv[shard.model].append(engine.kv_cache_usage)
    return {name: ModelLoad(ready=len(ready[name]), requests=requests[name], held=state.held.get(name, 0),
                            kv_cache_usage=sum(kv[name]) / len(kv[name]) if kv[name] else None,
                            ttft_p90=_fresh_ttft(state.ttfts.get(name), now))
            for name in models}


def _fresh_ttft(ttft: Ttft | None, now: float) -> float | None:
    if ttft is None or ttft.measured_at is None or now - ttft.measured_at > 3 * TTFT_EVERY:
        return None
    return ttft.p90


def watch_ttfts(state: ControlState, now: float, now_unix: float) -> tuple[ControlState, list[Effect]]:
    """(Each pass at `now`, control-plane clock; `now_unix` the same moment in unix seconds.) A `MeasureTtft` for
    each model with a `ttft_p90` target whose TTFT was last asked for `TTFT_EVERY` seconds ago or more (or never),
    with a timer for the next; the reads of models without such a target dropped. `state` itself and no effect
    when nothing is due."""
    settings = state.settings
    targets = [name for name, scaling in (autoscaled(settings) if settings is not None else {}).items()
               if scaling.ttft_p90 is not None]
    ttfts = {name: t for name, t in state.ttfts.items() if name in targets}
    effects: list[Effect] = []
    timers = list(state.timers)
    for name in sorted(targets):
        ttft = ttfts.get(name, Ttft())
        if ttft.asked_at is not None and now - ttft.asked_at < TTFT_EVERY:
            continue
        since = now_unix - TTFT_SPAN
        scale = state.scales.get(name)
        if scale is not None and scale.changed_at is not None:
            since = max(since, now_unix - (now - scale.changed_at))
        effects.append(MeasureTtft(name, since, now))
        ttfts[name] = replace(ttft, asked_at=now)
        timers.append((now + TTFT_EVERY, f"TTFT of {name}"))
    if not effects and len(ttfts) == len(state.ttfts):
        return state, []
    return replace(state, ttfts=frozen(ttfts), timers=tuple(timers)), effects


def ttft_measured(model: str, p90: float | None, asked_at: float):
    """The transition of `MeasureTtft`'s answer: `model`'s TTFT p90 (None: no request in the span) as asked at
    `asked_at`; an answer older than the one held is dropped. Not placement-relevant by itself: the next pass
    reads it."""

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        ttft = state.ttfts.get(model)
        if ttft is None or (ttft.measured_at is not None and ttft.measured_at >= asked_at):
            return state, False
        ttfts = {**state.ttfts, model: replace(ttft, p90=p90, measured_at=asked_at)}
        return replace(state, ttfts=frozen(ttfts)), False

    return transition


def running_replicas(state: ControlState, model: str) -> int:
    """How many replicas of `model` have a shard pending, starting or ready on a live node."""
    return len({shard.replica_id for record in state.fleet.records() if not record.lost
                for shard in record.state.shards
                if shard.model == model and shard.state in _RUNNING and not shard.adopted_foreign})


def watch_scales(state: ControlState, now: float) -> ControlState:
    """(Each pass at `now`, control-plane clock.) The next `ControlState.scales` and a timer for when the rule wants
    to look again; `state` itself when nothing changed."""
    settings = state.settings
    models = autoscaled(settings) if settings is not None else {}
    if not models and not state.scales:
        return state
    loads = model_loads(state, now, models)
    scales: dict[str, Scale] = {}
    timers = list(state.timers)
    latched = state.recovering.recovered is not None  # a pass saw the fleet back (llmgw.control.recovering)
    for name, scaling in sorted(models.items()):
        scale = state.scales.get(name) if latched else None  # recovering: follow what runs, decide nothing yet
        if scale is None:
            running = running_replicas(state, name)
            scale = initial_scale(scaling, max(running, 1 if loads[name].demand > 0 else 0), now)
        scale, again = next_scale(scaling, scale, loads[name], now)
        scales[name] = scale
        if again is not None and again > now and (again, f"autoscaler of {name}") not in timers:
            timers.append((again, f"autoscaler of {name}"))
    if scales == dict(state.scales) and len(timers) == len(state.timers):
        return state
    return replace(state, scales=frozen(scales), timers=tuple(timers))


def held_changed(model: str, count: int):
    """The transition of the gateway's word that `count` requests wait for `model` (`llmgw.gateway.holding`):
    placement-relevant when requests began to wait (a pass wakes the model at once)."""

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        before = state.held.get(model, 0)
        if count == before:
            return state, False
        held = {k: v for k, v in state.held.items() if k != model}
        if count > 0:
            held[model] = count
        return replace(state, held=frozen(held)), before == 0 and count > 0

    return transition


def wanted_counts(scales: Mapping[str, Scale]) -> Mapping[str, int]:
    """What the planner is told (`make_plan(replicas=...)`): model -> wanted count."""
    return frozen({name: s.wanted for name, s in scales.items()})


def scales_status(state: ControlState, now: float) -> dict[str, dict]:
    """The scales as status.yaml and `llmgw status` show them: per model its range, the wanted and ready counts,
    the requests the gateway holds for it and the last decision's reason."""
    settings = state.settings
    models = autoscaled(settings) if settings is not None else {}
    loads = model_loads(state, now, models)
    out = {}
    for name, scale in sorted(state.scales.items()):
        scaling = models.get(name)
        load = loads.get(name, ModelLoad())
        out[name] = {"min": getattr(scaling, "min", None), "max": getattr(scaling, "max", None),
                     "wanted": scale.wanted, "ready": load.ready, "held": load.held, "reason": scale.reason}
    return out


def scale_line(name: str, entry: Mapping) -> str:
    """One sentence on a model's entry of `scales_status`, for `llmgw status` and the audit commit's message."""
    return (f"{name}: {entry['wanted']} wanted, {entry['ready']} ready, {entry['held']} held "
            f"(range {entry['min']}-{entry['max']}): {entry['reason']}")
