"""The forecast of a settings change: what each changed model will do under the traffic it had (pure).

`forecast_change(base, head, fleet, plan, load)` answers, for every model whose settings or placement the change
touches, from the fleet's measured speeds and the last days' traffic (a `RecordedLoad`: `llmgw fleet snapshot`
writes one beside the fleet, from the store's usage records and the speeds routing uses):

- **tokens/s**: the completion tokens per second the model will make at the busiest hour of the window, and its
  capacity (what its replicas can make at most with that traffic's mix of prompt and completion);
- **TTFT p90** now (measured) and after;
- **GPU-hours per day** (replicas placed x GPUs each x 24) and what they cost at `gpu_hour_cost`;
- **quota headroom per project** that may use the model: its busiest-hour requests per minute and tokens per
  minute, and its tokens per day, against its own quota in HEAD.

The model (stated so that it can be checked: `bench/forecast.py` measures its error on real replicas):

    p, c      mean prompt and completion tokens per request of the model over the window
    λ         requests per second at the busiest clock hour (the window's mean when the hour is not known)
    P, D      a replica's prefill and decode tokens per second (the whole replica: `ReplicaSpeed`), the mean of
              the model's measured replicas (new replicas are taken to run as fast)
    s         = p / P + c / D: seconds of a whole replica one request takes
    ρ         = λ s / N: the share of its N placed replicas' time that the traffic takes (utilisation)
    capacity  = N c / s completion tokens per second; expected = min(λ c, capacity)
    TTFT p90  = t0 / (1 - ρ), where t0, the p90 without queueing, is the measured p90 times (1 - ρ now) when the
              model has replicas and measured TTFTs now, else p / P; none (overloaded) when ρ >= `SATURATED`.

A figure that cannot be had is None with the reason in `unknown` (no measured speed, no traffic). Units: seconds,
tokens, requests; costs in the cluster's currency.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgw.plan.types import ActionKind, Fleet, Plan, ShardState
from llmgw.routes import ReplicaSpeed
from llmgw.settings.model import Settings

SATURATED = 0.95
"""The utilisation from which a replica set is taken to be overloaded: its queue grows, TTFT has no bound."""

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class Traffic:
    """One project's requests to one model over the load's window: counts and token sums (prompt, completion)."""

    model: str
    project: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int = 0


@dataclass(frozen=True)
class ModelLoad:
    """One model's load over the window: `busiest_hour_requests` the requests of its busiest clock hour (0: not
    known), `ttft_p90_seconds` the p90 of the TTFTs recorded (None: none recorded) over `ttft_requests`."""

    model: str
    busiest_hour_requests: int = 0
    ttft_p90_seconds: float | None = None
    ttft_requests: int = 0


@dataclass(frozen=True)
class RecordedLoad:
    """What the fleet did over the last `window_seconds` up to `until` (ISO 8601 UTC, "" unknown): the speeds of
    its replicas (replica id -> `ReplicaSpeed`), the traffic per (model, project), and the load per model."""

    window_seconds: float
    until: str = ""
    speeds: Mapping[str, ReplicaSpeed] = field(default_factory=dict)
    traffic: tuple[Traffic, ...] = ()
    models: Mapping[str, ModelLoad] = field(default_factory=dict)


@dataclass(frozen=True)
class QuotaHeadroom:
    """One project's use against its own quota in HEAD (None: no limit of that kind): requests and tokens per
    minute at the model's busiest hour, tokens per day on the window's mean; its use of every model counts."""

    project: str
    requests_per_minute: float
    requests_per_minute_limit: int | None
    tokens_per_minute: float
    tokens_per_minute_limit: int | None
    tokens_per_day: float
    tokens_per_day_limit: int | None

    def shares(self) -> dict[str, float]:
        """Kind -> the share of the limit used (only the kinds with a limit; above 1: the quota refuses some)."""
        out = {}
        for kind in ("requests_per_minute", "tokens_per_minute", "tokens_per_day"):
            limit = getattr(self, f"{kind}_limit")
            if limit is not None:
                out[kind] = getattr(self, kind) / limit if limit else float("inf")
        return out


@dataclass(frozen=True)
class ModelForecast:
    """The forecast of one changed model (see the module docstring for each figure's definition).

    `replicas_before` the replicas ready now, `replicas_after` those HEAD's plan places; `requests_per_second` λ;
    `demand_tokens_per_second` λ c; `capacity_*`/`expected_tokens_per_second`/`utilisation_*`/`ttft_p90_*`: None
    when unknown (`unknown` says why). `gpu_hours_per_day_*` and `cost_per_day_*` (None: no gpu_hour_cost for
    the class). `quotas`: the projects that may use the model in HEAD, by name.
    """

    model: str
    replicas_before: int
    replicas_after: int
    requests_per_second: float
    demand_tokens_per_second: float
    capacity_before: float | None
    capacity_after: float | None
    expected_tokens_per_second: float | None
    utilisation_before: float | None
    utilisation_after: float | None
    ttft_p90_before: float | None
    ttft_p90_after: float | None
    gpu_hours_per_day_before: float
    gpu_hours_per_day_after: float
    cost_per_day_before: float | None
    cost_per_day_after: float | None
    quotas: tuple[QuotaHeadroom, ...] = ()
    unknown: tuple[str, ...] = ()

    @property
    def overloaded(self) -> bool:
        """True when the traffic needs more than the placed replicas give (utilisation >= SATURATED)."""
        return self.utilisation_after is not None and self.utilisation_after >= SATURATED


def changed_models(base: Settings, head: Settings, plan: Plan) -> tuple[str, ...]:
    """The models whose settings differ between `base` and `head` (added and removed ones too) or that HEAD's plan
    starts, stops or restarts a shard of, by name."""
    names = {m for m in set(base.models) | set(head.models) if base.models.get(m) != head.models.get(m)}
    names.update(a.model for a in plan.actions if a.model and a.kind in (ActionKind.START, ActionKind.STOP,
                                                                         ActionKind.RESTART))
    return tuple(sorted(names))


def _ready_replicas(fleet: Fleet) -> dict[str, dict[str, int]]:
    """Model -> replica id -> GPUs its ready shards hold, on alive nodes."""
    out: dict[str, dict[str, int]] = {}
    for node in fleet.nodes:
        if not node.alive:
            continue
        for shard in node.shards:
            if shard.state is ShardState.READY and shard.replica_id:
                held = out.setdefault(shard.model, {})
                held[shard.replica_id] = held.get(shard.replica_id, 0) + len(shard.devices)
    return out


def _planned_replicas(plan: Plan) -> dict[str, dict[str, int]]:
    """Model -> replica id -> GPUs its assignments hold (of a rolling replica, the new generation's)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for a in plan.assignments:
        groups = out.setdefault(a.model, {}).setdefault(a.replica_id, {})
        groups[a.group or a.shard_id] = groups.get(a.group or a.shard_id, 0) + len(a.devices)
    return {model: {rid: max(groups.values()) for rid, groups in replicas.items()}
            for model, replicas in out.items()}


def _speed_of(model: str, fleet: Fleet, speeds: Mapping[str, ReplicaSpeed]) -> ReplicaSpeed | None:
    """The mean speed of `model`'s measured replicas (replica ids of its shards in `fleet`), or None."""
    ids = sorted({s.replica_id for n in fleet.nodes for s in n.shards if s.model == model and s.replica_id in speeds})
    if not ids:
        return None
    return ReplicaSpeed(prefill_tokens_per_second=sum(speeds[r].prefill_tokens_per_second for r in ids) / len(ids),
                        decode_tokens_per_second=sum(speeds[r].decode_tokens_per_second for r in ids) / len(ids))


def _cost(settings: Settings, model: str, gpu_hours: float) -> float | None:
    spec = settings.models.get(model)
    prices = settings.cluster.gpu_hour_cost
    rate = prices.get(spec.resources.gpu_class or "", prices.get("default")) if spec is not None else None
    return None if rate is None or not gpu_hours else gpu_hours * rate


def _peak_rates(load: RecordedLoad) -> dict[str, float]:
    """Model -> requests per second at its busiest hour (the window's mean when that hour is not known)."""
    totals: dict[str, int] = {}
    for t in load.traffic:
        totals[t.model] = totals.get(t.model, 0) + t.requests
    out = {}
    for model, requests in totals.items():
        busiest = load.models.get(model, ModelLoad(model)).busiest_hour_requests
        out[model] = busiest / HOUR if busiest else requests / load.window_seconds if load.window_seconds else 0.0
    return out


def quota_headroom(head: Settings, load: RecordedLoad, project: str) -> QuotaHeadroom:
    """`project`'s use (every model it used over the window) against its own quota in `head` (see `QuotaHeadroom`):
    each model's share of the project's requests scaled to that model's busiest hour."""
    peaks = _peak_rates(load)
    totals: dict[str, int] = {}
    for t in load.traffic:
        totals[t.model] = totals.get(t.model, 0) + t.requests
    rpm = tpm = tokens = 0.0
    for t in load.traffic:
        if t.project != project or not t.requests:
            continue
        rate = peaks.get(t.model, 0.0) * t.requests / totals[t.model]
        rpm += rate * 60
        tpm += rate * 60 * (t.prompt_tokens + t.completion_tokens) / t.requests
        tokens += t.prompt_tokens + t.completion_tokens
    per_day = tokens * DAY / load.window_seconds if load.window_seconds else 0.0
    spec = head.projects.get(project)
    quota = spec.quota if spec is not None else None
    return QuotaHeadroom(project, rpm, getattr(quota, "requests_per_minute", None), tpm,
                         getattr(quota, "tokens_per_minute", None), per_day, getattr(quota, "tokens_per_day", None))


def _users(head: Settings, model: str) -> tuple[str, ...]:
    """The projects of `head` that may use `model` (by name or alias, or all models), by name."""
    spec = head.models.get(model)
    names = {model, *(spec.aliases if spec is not None else ())}
    return tuple(sorted(p.name for p in head.projects.values() if "*" in p.models or names & set(p.models)))


@dataclass(frozen=True)
class Figures:
    """What `replicas` replicas do under one traffic (the module docstring's model): `capacity` and `expected`
    completion tokens per second, `utilisation` ρ (infinite: traffic and no replica), `ttft_p90` seconds (None:
    overloaded, or no TTFT to start from)."""

    capacity: float
    expected: float
    utilisation: float
    ttft_p90: float | None


def request_seconds(prompt: float, completion: float, speed: ReplicaSpeed) -> float:
    """s: the seconds of a whole replica running at `speed` that one request of `prompt` and `completion` tokens
    takes."""
    return prompt / speed.prefill_tokens_per_second + completion / speed.decode_tokens_per_second


def unloaded_ttft(prompt: float, speed: ReplicaSpeed, measured_p90: float | None = None,
                  utilisation_now: float | None = None) -> float:
    """t0, the TTFT p90 without queueing: the measured p90 times (1 - ρ now) when both are given and ρ now is below
    SATURATED, else one prompt's prefill, `prompt` / P."""
    if measured_p90 is not None and utilisation_now is not None and utilisation_now < SATURATED:
        return measured_p90 * (1.0 - utilisation_now)
    return prompt / speed.prefill_tokens_per_second


def figures(prompt: float, completion: float, rate: float, speed: ReplicaSpeed, replicas: int,
            t0: float | None) -> Figures:
    """The `Figures` of `replicas` replicas at `speed` under `rate` requests per second of `prompt` and `completion`
    tokens (means), TTFT from `t0` (`unloaded_ttft`). Raises ValueError when a request takes no time (no tokens)."""
    s = request_seconds(prompt, completion, speed)
    if s <= 0:
        raise ValueError("a request of no tokens takes no time: nothing to forecast")
    rho = rate * s / replicas if replicas else (float("inf") if rate else 0.0)
    capacity = replicas * completion / s
    ttft = None if t0 is None or rho >= SATURATED else t0 / (1.0 - rho)
    return Figures(capacity, min(rate * completion, capacity), rho, ttft)


def forecast_model(model: str, base: Settings, head: Settings, fleet: Fleet, plan: Plan,
                   load: RecordedLoad) -> ModelForecast:
    """The forecast of one model (see the module docstring); `fleet` as the plan saw it."""
    before = _ready_replicas(fleet).get(model, {})
    after = _planned_replicas(plan).get(model, {})
    mine = [t for t in load.traffic if t.model == model]
    requests = sum(t.requests for t in mine)
    unknown = []
    lam = _peak_rates(load).get(model, 0.0)
    p = sum(t.prompt_tokens for t in mine) / requests if requests else 0.0
    c = sum(t.completion_tokens for t in mine) / requests if requests else 0.0
    speed = _speed_of(model, fleet, load.speeds)
    if not requests:
        unknown.append("no traffic recorded in the window")
    if speed is None:
        unknown.append("no measured speed (run `llmgw bench` on a replica of it)")
    measured = load.models.get(model, ModelLoad(model)).ttft_p90_seconds
    now = then = None
    if speed is not None and requests:
        if p + c <= 0:
            unknown.append("no tokens recorded in the window")
        else:
            now = figures(p, c, lam, speed, len(before), None)
            t0 = unloaded_ttft(p, speed, measured if before else None, now.utilisation)
            then = figures(p, c, lam, speed, len(after), t0)
    gpu_before = 24.0 * sum(before.values())
    gpu_after = 24.0 * sum(after.values())
    return ModelForecast(
        model=model, replicas_before=len(before), replicas_after=len(after), requests_per_second=lam,
        demand_tokens_per_second=lam * c, capacity_before=now and now.capacity, capacity_after=then and then.capacity,
        expected_tokens_per_second=then and then.expected, utilisation_before=now and now.utilisation,
        utilisation_after=then and then.utilisation, ttft_p90_before=measured if before else None,
        ttft_p90_after=then and then.ttft_p90,
        gpu_hours_per_day_before=gpu_before, gpu_hours_per_day_after=gpu_after,
        cost_per_day_before=_cost(base, model, gpu_before), cost_per_day_after=_cost(head, model, gpu_after),
        quotas=tuple(quota_headroom(head, load, name) for name in _users(head, model)), unknown=tuple(unknown),
    )


def forecast_change(base: Settings, head: Settings, fleet: Fleet, plan: Plan,
                    load: RecordedLoad) -> tuple[ModelForecast, ...]:
    """The forecast of each model the change from `base` to `head` touches (`changed_models`), by name; `plan` is
    HEAD's plan against `fleet` (the fleet as that plan saw it), `load` what the fleet did lately."""
    return tuple(forecast_model(m, base, head, fleet, plan, load) for m in changed_models(base, head, plan))


def forecast_lines(forecasts: tuple[ModelForecast, ...]) -> list[str]:
    """One line of plain text per forecast, as `llmgw plan` prints them ("forecast gemma-3-270m: 1 -> 2 replicas,
    13.0 of 52.4 completion tokens/s at the busiest hour, TTFT p90 2.90 s -> 1.95 s, 0 -> 0 GPU-hours/day")."""
    def seconds(value: float | None) -> str:
        return "?" if value is None else f"{value:.2f} s"

    lines = []
    for f in forecasts:
        if f.capacity_after is None or f.expected_tokens_per_second is None:
            tokens = "not forecast: " + "; ".join(f.unknown)
        else:
            tokens = (f"{f.expected_tokens_per_second:.1f} of {f.capacity_after:.1f} completion tokens/s at the "
                      f"busiest hour, TTFT p90 {seconds(f.ttft_p90_before)} -> "
                      f"{'overloaded' if f.overloaded else seconds(f.ttft_p90_after)}")
        lines.append(f"forecast {f.model}: {f.replicas_before} -> {f.replicas_after} replicas, {tokens}, "
                     f"{f.gpu_hours_per_day_before:g} -> {f.gpu_hours_per_day_after:g} GPU-hours/day")
    return lines


def _finite(value: float | None) -> float | None:
    """`value`, or None for infinity (JSON has no infinity: a model with traffic and no replica)."""
    return None if value is None or value == float("inf") else value


def forecast_to_json(forecast: ModelForecast) -> dict:
    """One model's forecast as JSON-ready data (docs/review.md, "The forecast"); an infinite utilisation (traffic
    and no replica) is null, with `overloaded` true."""
    return {
        "model": forecast.model, "replicas_before": forecast.replicas_before, "replicas_after": forecast.replicas_after,
        "requests_per_second": forecast.requests_per_second,
        "demand_tokens_per_second": forecast.demand_tokens_per_second,
        "capacity_before": forecast.capacity_before, "capacity_after": forecast.capacity_after,
        "expected_tokens_per_second": forecast.expected_tokens_per_second,
        "utilisation_before": _finite(forecast.utilisation_before),
        "utilisation_after": _finite(forecast.utilisation_after), "overloaded": forecast.overloaded,
        "ttft_p90_before": forecast.ttft_p90_before, "ttft_p90_after": forecast.ttft_p90_after,
        "gpu_hours_per_day_before": forecast.gpu_hours_per_day_before,
        "gpu_hours_per_day_after": forecast.gpu_hours_per_day_after,
        "cost_per_day_before": forecast.cost_per_day_before, "cost_per_day_after": forecast.cost_per_day_after,
        "quotas": [{"project": q.project, "requests_per_minute": q.requests_per_minute,
                    "requests_per_minute_limit": q.requests_per_minute_limit,
                    "tokens_per_minute": q.tokens_per_minute, "tokens_per_minute_limit": q.tokens_per_minute_limit,
                    "tokens_per_day": q.tokens_per_day, "tokens_per_day_limit": q.tokens_per_day_limit}
                   for q in forecast.quotas],
        "unknown": list(forecast.unknown),
    }
