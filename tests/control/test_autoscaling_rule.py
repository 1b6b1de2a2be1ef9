"""The autoscaler's rule (`llmgw.plan.autoscaling`) driven pass by pass on trio's MockClock with seeded loads.

Rules checked on 60 seeds, each a different range, targets, windows, pass interval and load sequence (bursts shorter
and longer than the windows, plateaus, silences longer than the idle time, KV-cache use with and without queues):
- the wanted count never leaves [min, max];
- two changes never come within `cooldown` of each other, except waking a model at 0 for a waiting request;
- the count never drops to 0 while a request runs, waits or is held;
- it grows only when the passes since its last change cover the last `scale_up_window`, their wishes (each in force
  until the next pass) were above it for at least three quarters of that window, and this pass's wish is above it,
  and never past the count asked for during three quarters of the window (a burst shorter than that moves nothing);
- it shrinks only when every pass of the last `scale_down_window` wished it lower, and never past what those
  passes wished;
- a model at 0 with a request waiting is woken at once.
Half the seeds also set a TTFT p90 target and feed TTFT p90s (steady, spiking shorter than the window, lasting).
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from llmgw.plan.autoscaling import UP_SHARE, ModelLoad, Scale, initial_scale, next_scale, wish
from llmgw.settings.model import Scaling


def _scaling(rng: random.Random) -> Scaling:
    low = rng.choice([0, 0, 1, 2])
    return Scaling(min=low, max=low + rng.randint(1, 5), queue_per_replica=rng.choice([1, 2, 4, 8]),
                   kv_cache_usage=rng.choice([0.5, 0.8, 0.9]), scale_up_window=rng.choice([0, 5, 30]),
                   scale_down_window=rng.choice([0, 30, 300]), cooldown=rng.choice([0, 10, 60]),
                   idle=rng.choice([20, 120, 600]), ttft_p90=rng.choice([None, 0.5, 2.0]))


def _loads(rng: random.Random, passes: int):
    """A sequence of (seconds to the next pass, requests, held, KV-cache use, TTFT p90) of plateaus, bursts,
    silences and slow answers."""
    out = []
    while len(out) < passes:
        kind = rng.choice(["silence", "plateau", "burst", "kv", "slow"])
        length = rng.randint(1, 40)
        level = rng.choice([0, 1, 3, 10, 40])
        for _ in range(length):
            gap = rng.choice([1.0, 2.0, 5.0, 10.0])
            if kind == "silence":
                out.append((gap, 0.0, 0, None, None))
            elif kind == "plateau":
                out.append((gap, float(level + rng.randint(0, 2)), 0, rng.choice([None, 0.3]), rng.choice([None, 0.2])))
            elif kind == "burst":
                out.append((gap, float(rng.randint(0, 60)), rng.randint(0, 3), None, rng.choice([None, 5.0])))
            elif kind == "slow":  # few requests, answered slowly (a long prompt, a slow node)
                out.append((gap, float(rng.randint(1, 2)), 0, None, rng.uniform(0.1, 8.0)))
            else:
                out.append((gap, float(rng.randint(0, 2)), 0, rng.random(), None))
    return out[:passes]


@pytest.mark.parametrize("seed", range(60))
async def test_the_count_stays_in_range_and_never_flaps_within_the_cooldown(
        seed: int, autojump_clock: trio.testing.MockClock) -> None:
    rng = random.Random(seed)
    scaling = _scaling(rng)
    scale: Scale = initial_scale(scaling, rng.randint(0, 8), trio.current_time())
    assert scaling.min <= scale.wanted <= scaling.max
    history: list[tuple[float, int, int]] = []  # (time, wish, wanted before the pass)
    changes: list[tuple[float, int, int, float]] = []  # (time, before, after, demand)
    for gap, requests, held, kv, ttft in _loads(rng, 300):
        await trio.sleep(gap)
        now = trio.current_time()
        ready = scale.wanted if rng.random() < 0.8 else max(0, scale.wanted - 1)  # replicas still starting
        load = ModelLoad(ready=ready, requests=requests if ready else 0.0, held=held if ready else held + int(requests),
                         kv_cache_usage=kv if ready else None, ttft_p90=ttft if ready else None)
        before = scale.wanted
        history.append((now, wish(scaling, load)[0], before))
        scale, again = next_scale(scaling, scale, load, now)
        assert again is None or again > now - 1e-9
        assert scaling.min <= scale.wanted <= scaling.max, (seed, scale)
        if scale.wanted != before:
            assert scale.reason
            changes.append((now, before, scale.wanted, load.demand))
            if scale.wanted == 0:
                assert load.demand == 0, "the last replica stopped while a request ran, waited or was held"
            elif before == 0:
                assert load.demand > 0 and scale.wanted == 1
            elif scale.wanted > before:
                _assert_grown_within_the_rule(scaling, history, changes[-2][0] if len(changes) > 1 else None,
                                              before, scale.wanted, seed)
            elif scale.wanted < before and scale.wanted > 0:
                window = [w for t, w, _ in history if t >= now - scaling.scale_down_window]
                assert all(w < before for w in window) and scale.wanted >= max(window), (seed, now, window)
        if before == 0 and load.demand > 0:
            assert scale.wanted == 1, "a model at 0 with a request waiting was not woken"
    for (t1, *_), (t2, before, _after, demand) in zip(changes, changes[1:]):
        if not (before == 0 and demand > 0):
            assert t2 - t1 >= scaling.cooldown, (seed, changes)


def _assert_grown_within_the_rule(scaling: Scaling, history: list[tuple[float, int, int]], changed_at: float | None,
                                  before: int, after: int, seed: int) -> None:
    """The growth from `before` to `after` at the last pass of `history` kept the scale-up rule: the passes since
    the last change (`changed_at`; None: since the first pass) cover the window, the wish was above `before` for
    three quarters of it and at this pass, and `after` was asked for during three quarters of it."""
    now, current, _ = history[-1]
    window = scaling.scale_up_window
    assert current > before, (seed, now, "grew on a pass that did not ask for more")
    if window == 0:
        assert after <= current, (seed, now)
        return
    passes = [(t, w) for t, w, _ in history if changed_at is None or t >= changed_at]
    assert passes[0][0] <= now - window + 1e-9, (seed, now, "grew before its history covered the window")
    start = now - window

    def seconds(check) -> float:
        return sum(max(0.0, until - max(at, start)) for (at, w), (until, _) in zip(passes, [*passes[1:], (now, 0)])
                   if check(w))

    needed = UP_SHARE * window - 1e-6
    assert seconds(lambda w: w > before) >= needed, (seed, now, passes)
    assert seconds(lambda w: w >= after) >= needed, (seed, now, after, passes)


async def test_a_sustained_queue_brings_the_count_to_max_and_silence_to_zero(
        autojump_clock: trio.testing.MockClock) -> None:
    """(~0 s) min 0, max 3, 2 requests per replica: a queue of 10 for longer than the window gives 3; a burst shorter
    than the window gives nothing; silence longer than the idle time stops the last replica; a request wakes it."""
    scaling = Scaling(min=0, max=3, queue_per_replica=2, scale_up_window=30, scale_down_window=60, cooldown=20,
                      idle=120)
    scale = initial_scale(scaling, 1, trio.current_time())
    assert scale.wanted == 1

    async def passes(seconds: float, load: ModelLoad) -> None:
        nonlocal scale
        end = trio.current_time() + seconds
        while trio.current_time() < end:
            await trio.sleep(5)
            scale, _ = next_scale(scaling, scale, load, trio.current_time())

    await passes(20, ModelLoad(ready=1, requests=10))  # a burst shorter than the scale-up window
    assert scale.wanted == 1
    await passes(30, ModelLoad(ready=1, requests=1))
    await passes(35, ModelLoad(ready=1, requests=10))
    assert scale.wanted == 3 and "scaled up" in scale.reason
    await passes(30, ModelLoad(ready=3, requests=3))  # wishes 2, not yet for the whole scale-down window
    assert scale.wanted == 3
    await passes(40, ModelLoad(ready=3, requests=3))
    assert scale.wanted == 2 and "scaled down" in scale.reason
    await passes(125, ModelLoad(ready=2))
    assert scale.wanted == 0 and "idle" in scale.reason
    scale, _ = next_scale(scaling, scale, ModelLoad(held=1), trio.current_time() + 1)
    assert scale.wanted == 1 and "woken" in scale.reason


@pytest.mark.parametrize("seed", range(5))
async def test_a_sustained_load_whose_queue_dips_between_requests_grows_within_the_window(
        seed: int, autojump_clock: trio.testing.MockClock) -> None:
    """(~0 s) The benchmark's case: 4 requests per replica, a 10 s scale-up window, a pass every 0.5 s. 8 closed-loop
    clients on 1 replica read as 8 running or waiting, but on one pass in five as 4 (the moment between a
    client's answer and its next request): a wish for 1. The count grows to 2 within the 10 s window (each dip
    started the window again under the former every-pass rule, so it grew only after a 10 s stretch without one).
    A load as high that lasts 7 s, under three quarters of the window, grows nothing."""
    rng = random.Random(seed)
    scaling = Scaling(min=0, max=2, queue_per_replica=4, scale_up_window=10, scale_down_window=10, cooldown=5,
                      idle=20)
    scale = initial_scale(scaling, 1, trio.current_time())
    for _ in range(20):  # the burst's 4 requests on the replica that woke: a wish for 1
        await trio.sleep(0.5)
        scale, _ = next_scale(scaling, scale, ModelLoad(ready=1, requests=4), trio.current_time())
    began = trio.current_time()
    dips, offset = 0, rng.randrange(5)
    while scale.wanted == 1 and trio.current_time() - began < 30:
        await trio.sleep(0.5)
        dip = (round((trio.current_time() - began) / 0.5) + offset) % 5 == 0
        dips += dip
        scale, _ = next_scale(scaling, scale, ModelLoad(ready=1, requests=4.0 if dip else 8.0), trio.current_time())
    assert dips > 0
    assert scale.wanted == 2 and "scaled up" in scale.reason
    assert trio.current_time() - began <= scaling.scale_up_window, (seed, trio.current_time() - began, dips)

    scale = initial_scale(scaling, 1, trio.current_time())
    for number in range(60):  # 7 s of 40 requests, dips included, then 23 s of 2
        await trio.sleep(0.5)
        requests = (4.0 if (number + offset) % 5 == 0 else 40.0) if number < 14 else 2.0
        scale, _ = next_scale(scaling, scale, ModelLoad(ready=1, requests=requests), trio.current_time())
        assert scale.wanted == 1, (seed, number)


def test_kv_cache_use_above_its_target_asks_for_more_replicas() -> None:
    scaling = Scaling(min=1, max=8, queue_per_replica=100, kv_cache_usage=0.5)
    assert wish(scaling, ModelLoad(ready=2, requests=1, kv_cache_usage=0.9))[0] == 4
    assert wish(scaling, ModelLoad(ready=2, requests=1, kv_cache_usage=0.5))[0] == 2
    assert wish(scaling, ModelLoad(ready=8, requests=1, kv_cache_usage=1.0))[0] == 8  # never above max


def test_a_range_changed_in_the_settings_moves_the_count_into_it_at_once() -> None:
    scale = Scale(wanted=5, reason="", changed_at=0.0)
    scale, _ = next_scale(Scaling(min=1, max=2, cooldown=600), scale, ModelLoad(ready=5, requests=50), 1.0)
    assert scale.wanted == 2 and "range" in scale.reason


def test_a_ttft_p90_above_its_target_asks_for_replicas_in_proportion() -> None:
    scaling = Scaling(min=1, max=8, queue_per_replica=100, ttft_p90=1.0)
    assert wish(scaling, ModelLoad(ready=2, requests=1, ttft_p90=2.0))[0] == 4
    assert wish(scaling, ModelLoad(ready=2, requests=1, ttft_p90=1.0))[0] == 2
    assert wish(scaling, ModelLoad(ready=4, requests=1, ttft_p90=0.3))[0] == 2
    assert wish(scaling, ModelLoad(ready=3, requests=1, ttft_p90=9.0))[0] == 8  # never above max
    assert wish(scaling, ModelLoad(ready=2, requests=1, ttft_p90=None))[0] == 1  # no request measured
    count, why = wish(scaling, ModelLoad(ready=2, requests=1, ttft_p90=2.5))
    assert count == 5 and "TTFT p90 2.5 s (target 1 s)" in why
    untimed = Scaling(min=1, max=8, queue_per_replica=100)  # no TTFT target: a slow TTFT moves nothing
    count, why = wish(untimed, ModelLoad(ready=2, requests=1, ttft_p90=9.0))
    assert count == 1 and "TTFT" not in why


async def test_a_slow_ttft_that_lasts_the_window_grows_the_count_a_spike_does_not(
        autojump_clock: trio.testing.MockClock) -> None:
    """(~0 s) min 1, max 4, TTFT p90 target 500 ms, a queue target no load reaches: a p90 of 2 s for less than the
    scale-up window moves nothing; once it asked for more during three quarters of the window it grows the count to
    the most asked for during that time (p90s of 1 s, then 2 s, from 1 replica: 2); within the cooldown a slower p90
    waits; a p90 under the target for the scale-down window brings it down."""
    scaling = Scaling(min=1, max=4, queue_per_replica=100, ttft_p90=0.5, scale_up_window=20, scale_down_window=60,
                      cooldown=30, idle=600)
    scale = initial_scale(scaling, 1, trio.current_time())
    changes: list[tuple[float, int]] = []

    async def passes(seconds: float, ready: int, ttft: float | None) -> None:
        nonlocal scale
        end = trio.current_time() + seconds
        while trio.current_time() < end:
            await trio.sleep(5)
            before = scale.wanted
            scale, _ = next_scale(scaling, scale, ModelLoad(ready=ready, requests=2, ttft_p90=ttft),
                                  trio.current_time())
            if scale.wanted != before:
                changes.append((trio.current_time(), scale.wanted))

    await passes(15, 1, 2.0)  # a spike shorter than the window
    await passes(10, 1, 0.2)
    assert scale.wanted == 1 and not changes
    await passes(10, 1, 1.0)  # wishes 2 ...
    await passes(15, 1, 2.0)  # ... then 4: the window's smallest wish is 2
    assert scale.wanted == 2 and "scaled up" in scale.reason and "TTFT p90 2 s (target 500 ms)" in scale.reason
    assert changes == [(45.0, 2)]  # from 30 s on it asked for more: 15 s of the 20 s window
    await passes(20, 2, 1.0)  # wishes 4, but within the cooldown and the window since the change
    assert scale.wanted == 2
    await passes(10, 2, 1.0)
    assert scale.wanted == 4
    await passes(55, 4, 0.1)  # wishes 1, not yet for the whole scale-down window
    assert scale.wanted == 4
    await passes(10, 4, 0.1)
    assert scale.wanted == 1 and "scaled down" in scale.reason
    for (t1, _), (t2, _) in zip(changes, changes[1:]):
        assert t2 - t1 >= scaling.cooldown
