"""The autoscaler's rule: from a model's load to the replica count it wants. Pure: data in, data out.

A catalog model with `replicas: {min, max, ...}` (`llmgw.settings.model.Scaling`) has its count decided here, each
pass, from what its replicas carry (`ModelLoad`: requests running and waiting on its engines, requests the gateway
holds for it, the mean KV-cache use of its ready replicas, the TTFT p90 of its recent requests). The count is runtime state (`Scale`, kept by the
control plane in `ControlState.scales` and recorded in every audit commit), never a settings edit.

Each pass makes a *wish*, the count the load asks for now:
- queue: ceil(demand / queue_per_replica), demand = requests running + waiting + held;
- KV cache: ceil(ready * kv_cache_usage / target) while replicas publish it;
- TTFT (with a `ttft_p90` target): ceil(ready * ttft_p90 / target) while there is a p90 (requests over the last
  `TTFT_SPAN` seconds), so a p90 at twice the target asks for twice the replicas, and one under it asks for fewer;
- the largest of them, at least 1 while there is any demand, and within [max(min, 1), max].

The count follows the wishes, never at once:
- it grows when the wishes were above it for at least `UP_SHARE` (three quarters) of the last `scale_up_window`
  seconds, and the wish of this pass is above it too: each pass's wish counts until the next pass, so a sustained
  load whose queue dips for a moment between a client's requests grows the count within the window, while a burst
  shorter than three quarters of the window moves nothing. It grows to the largest count the wishes asked for
  during that share of the window (the time-weighted lower quartile of the window's wishes). The window counts only
  from the count's last change (or the rule's first pass): the wishes are kept (`Scale.wishes`) from then on;
- it shrinks when every wish for `scale_down_window` seconds was below it, to the largest of them;
- no change comes within `cooldown` seconds of the last one (so it never flaps faster than that), except waking
  a model at 0 when a request waits for it (`demand` > 0): that goes to 1 at once;
- with `min` 0, the last replicas stop (count 0) once there was no demand at all for `idle` seconds;
- the count always lies within [min, max]: a range changed in the settings moves it there at once.

`next_scale` returns the next `Scale` and the time the rule wants to be asked again (a window, the cooldown or the
idle time running out; None: nothing pending), so the caller sets a timer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmgw.settings.model import Scaling

UP_SHARE = 0.75
"""The share of the scale-up window during which the wishes must be above the count for it to grow."""

TTFT_SPAN = 60.0
"""Seconds of requests whose TTFT p90 `ModelLoad.ttft_p90` is (the control plane reads them from the usage records)."""


@dataclass(frozen=True)
class ModelLoad:
    """What one model's replicas carry at one moment.

    `ready`: replicas with a READY shard. `requests`: requests running and waiting on their engines, summed over
    ready replicas whose engines published them. `held`: requests the gateway holds for the model, waiting for a
    replica. `kv_cache_usage`: the mean KV-cache use (0..1) of the ready replicas that publish it (None: none does).
    `ttft_p90`: the 90th percentile of the time to first token (seconds) of the model's requests of the last
    `TTFT_SPAN` seconds (None: not measured, or no request).
    """

    ready: int = 0
    requests: float = 0.0
    held: int = 0
    kv_cache_usage: float | None = None
    ttft_p90: float | None = None

    @property
    def demand(self) -> float:
        """Requests running, waiting or held."""
        return self.requests + self.held


@dataclass(frozen=True)
class Ttft:
    """The TTFT p90 of a model's recent requests as the control plane last read it (`llmgw.control.autoscaling`).

    `p90`: seconds (None: no request in the span). `measured_at`: when it was read (control-plane clock; None: not
    yet). `asked_at`: when it was last asked for (a read in progress when later than `measured_at`).
    """

    p90: float | None = None
    measured_at: float | None = None
    asked_at: float | None = None


@dataclass(frozen=True)
class Scale:
    """A model's replica count as the autoscaler holds it.

    `wanted`: the count the planner places. `reason`: why it is what it is (a sentence for `llmgw status` and the
    audit). `changed_at`: when it last changed (control-plane clock; None: not since it was first set).
    `wishes`: ((time, wish), ...) each time the wish changed since `wanted` last changed (or the rule's first pass),
    only as far back as the one in force `scale_up_window` seconds ago, oldest first: the scale-up window's wishes.
    `below_since` / `down_to`: since when every wish was below `wanted`, and the largest of those wishes (None / 0:
    not so now). `busy_at`: when there was last any demand.
    """

    wanted: int
    reason: str
    changed_at: float | None = None
    wishes: tuple[tuple[float, int], ...] = ()
    below_since: float | None = None
    down_to: int = 0
    busy_at: float = 0.0


def wish(scaling: Scaling, load: ModelLoad) -> tuple[int, str]:
    """(The count `load` asks for now under `scaling`'s targets, why it asks so), before windows and cooldown:
    within [max(min, 1), max] (0 is reached only by the idle rule of `next_scale`)."""
    by_queue = math.ceil(load.demand / scaling.queue_per_replica) if load.demand > 0 else 0
    by_kv = 0
    if load.kv_cache_usage is not None and load.ready > 0:
        by_kv = math.ceil(round(load.ready * load.kv_cache_usage / scaling.kv_cache_usage, 9))
    by_ttft = 0
    timed = scaling.ttft_p90 is not None and load.ttft_p90 is not None
    if timed and load.ready > 0:
        by_ttft = math.ceil(round(load.ready * load.ttft_p90 / scaling.ttft_p90, 9))
    count = min(max(by_queue, by_kv, by_ttft, scaling.min, 1), scaling.max)
    kv = f", KV cache {load.kv_cache_usage:.0%} (target {scaling.kv_cache_usage:.0%})" \
        if load.kv_cache_usage is not None else ""
    ttft = f", TTFT p90 {_seconds(load.ttft_p90)} (target {_seconds(scaling.ttft_p90)})" if timed else ""
    why = (f"{_count(load.demand, 'request')} running, waiting or held on {load.ready} ready "
           f"(target {scaling.queue_per_replica:g} per replica){kv}{ttft}")
    return count, why


def _seconds(value: float) -> str:
    """'850 ms', '2.3 s'."""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.3g} s"


def _count(number: float, noun: str) -> str:
    """'1 request', '2 requests', '0.5 requests' (a mean)."""
    return f"{number:g} {noun}{'' if number == 1 else 's'}"


def initial_scale(scaling: Scaling, running: int, now: float) -> Scale:
    """The first `Scale` of a model (new in the settings, or a control plane that just started): the replicas
    `running` now, kept within [min, max], so a restart of the control plane scales nothing by itself."""
    wanted = min(max(running, scaling.min), scaling.max)
    return Scale(wanted, f"{_count(running, 'replica')} running when the autoscaler started; range "
                 f"{scaling.min}-{scaling.max}",
                 busy_at=now)


def next_scale(scaling: Scaling, scale: Scale, load: ModelLoad, now: float) -> tuple[Scale, float | None]:
    """The model's `Scale` after a pass at `now` (control-plane clock seconds) that read `load`, and when the rule
    wants to be asked again (None: nothing pending). `scale` itself is returned when nothing changed, so callers
    may compare by identity. See the module for the rules."""
    busy_at = now if load.demand > 0 else scale.busy_at
    count, why = wish(scaling, load)
    cooled = scale.changed_at is None or now - scale.changed_at >= scaling.cooldown
    cool_at = None if cooled or scale.changed_at is None else scale.changed_at + scaling.cooldown
    wishes = _remembered(scale.wishes, now, count, scaling.scale_up_window)
    if scale.wanted < scaling.min or scale.wanted > scaling.max:
        wanted = min(max(scale.wanted, scaling.min), scaling.max)
        return _changed(scale, wanted, f"the range in the settings is now {scaling.min}-{scaling.max}", now,
                        busy_at, count), None
    if scale.wanted == 0:
        if load.demand > 0:
            return _changed(scale, 1, f"woken: {_count(load.demand, 'request')} {'waits' if load.demand == 1 else 'wait'} for a replica", now, busy_at, count), None
        return _same(scale, busy_at=busy_at), None
    if scaling.min == 0 and load.demand == 0 and now - busy_at >= scaling.idle:
        if cooled:
            return _changed(scale, 0, f"no request for {scaling.idle:g} s (idle): the last replicas stop", now,
                            busy_at), None
        return _same(scale, busy_at=busy_at, wishes=wishes, below_since=None), cool_at
    idle_at = busy_at + scaling.idle if scaling.min == 0 else None
    if count > scale.wanted:
        up_to, due = _grown(scaling, scale.wanted, wishes, now)
        if up_to > scale.wanted and cooled:
            during = f"more asked for during {UP_SHARE:.0%} of the last {scaling.scale_up_window:g} s, now " \
                if scaling.scale_up_window > 0 else ""
            return _changed(scale, up_to, f"scaled up: {during}{why}", now, busy_at, count), None
        return _same(scale, busy_at=busy_at, wishes=wishes, below_since=None), \
            _first(max(due, cool_at or due), idle_at)
    if count < scale.wanted:
        since = scale.below_since if scale.below_since is not None else now
        down_to = max(count, scale.down_to) if scale.below_since is not None else count
        due = since + scaling.scale_down_window
        if now >= due and cooled:
            return _changed(scale, down_to, f"scaled down: for {scaling.scale_down_window:g} s {why}", now,
                            busy_at, count), _first(idle_at)
        return _same(scale, busy_at=busy_at, below_since=since, down_to=down_to, wishes=wishes), \
            _first(max(due, cool_at or due), idle_at)
    return _same(scale, busy_at=busy_at, wishes=wishes, below_since=None), _first(idle_at)


def _remembered(wishes: tuple[tuple[float, int], ...], now: float, count: int,
                window: float) -> tuple[tuple[float, int], ...]:
    """`wishes` with this pass's wish `count` at `now` (when it differs from the last), less those no longer in
    force anywhere in the last `window` seconds."""
    if not wishes or wishes[-1][1] != count:
        wishes = (*wishes, (now, count))
    start = 0
    while start + 1 < len(wishes) and wishes[start + 1][0] <= now - window:
        start += 1
    return wishes[start:]


def _grown(scaling: Scaling, wanted: int, wishes: tuple[tuple[float, int], ...], now: float) -> tuple[int, float]:
    """(The count the scale-up window's `wishes` grow `wanted` to at `now` (`wanted` itself: not yet), the earliest
    time they might): the largest count asked for during `UP_SHARE` of the window, once the wishes cover it."""
    window = scaling.scale_up_window
    if window <= 0:
        return wishes[-1][1], now
    if wishes[0][0] > now - window:
        return wanted, wishes[0][0] + window  # the window reaches back past the last change
    needed = UP_SHARE * window
    held: dict[int, float] = {}  # wish -> seconds it was in force within the window
    for (at, count), (until, _) in zip(wishes, (*wishes[1:], (now, 0))):
        held[count] = held.get(count, 0.0) + until - max(at, now - window)
    grown, above = wanted, 0.0
    for count in sorted(held, reverse=True):
        above += held[count]
        if count <= wanted:
            break
        if above >= needed - 1e-9:
            grown = count
            break
    short = needed - sum(t for c, t in held.items() if c > wanted)
    return grown, now + max(short, 0.0) if grown == wanted else now


def _first(*times: float | None) -> float | None:
    return min((t for t in times if t is not None), default=None)


def _changed(scale: Scale, wanted: int, reason: str, now: float, busy_at: float, count: int | None = None) -> Scale:
    """`scale` changed to `wanted` at `now`; the scale-up window starts again from this pass's wish `count`."""
    wishes = () if count is None else ((now, count),)
    if wanted == scale.wanted:
        return _same(scale, busy_at=busy_at, wishes=wishes, below_since=None)
    return Scale(wanted, reason, changed_at=now, wishes=wishes, busy_at=busy_at)


def _same(scale: Scale, **changes) -> Scale:
    """`scale` with `changes`, or `scale` itself when they change nothing (the time of demand aside from that,
    compared too: a busy model's `busy_at` moves each pass)."""
    if changes.get("below_since", scale.below_since) is None:
        changes["down_to"] = 0
    if all(getattr(scale, k) == v for k, v in changes.items()):
        return scale
    return replace(scale, **changes)
