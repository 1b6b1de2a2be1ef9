"""The autoscaler's rule (`llmgw.plan.autoscaling`) driven pass by pass on trio's MockClock with seeded loads.

Rules checked on 60 seeds, each a different range, targets, windows, pass interval and load sequence (bursts shorter
and longer than the windows, plateaus, silences longer than the idle time, KV-cache use with and without queues):
- the wanted count never leaves [min, max];
- two changes never come within `cooldown` of each other, except waking a model at 0 for a waiting request;
- the count never drops to 0 while a request runs, waits or is held;
- it grows only when every pass of the last `scale_up_window` wished it higher, and shrinks only when every pass of
  the last `scale_down_window` wished it lower (a burst shorter than the window moves nothing), and never past
  what those passes wished;
- a model at 0 with a request waiting is woken at once.
Half the seeds also set a TTFT p90 target and feed TTFT p90s (steady, spiking shorter than the window, lasting).
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from llmgw.plan.autoscaling import ModelLoad, Scale, initial_scale, next_scale, wish
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
                window = [w for t, w, _ in history if t >= now - scaling.scale_up_window]
                assert all(w > before for w in window) and scale.wanted <= min(window), (seed, now, window)
            elif scale.wanted < before and scale.wanted > 0:
                window = [w for t, w, _ in history if t >= now - scaling.scale_down_window]
                assert all(w < before for w in window) and scale.wanted >= max(window), (seed, now, window)
        if before == 0 and load.demand > 0:
            assert scale.wanted == 1, "a model at 0 with a request waiting was not woken"
    for (t1, *_), (t2, before, _after, demand) in zip(changes, changes[1:]):
        if not (before == 0 and demand > 0):
            assert t2 - t1 >= scaling.cooldown, (seed, changes)


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
    scale-up window moves nothing; for longer it grows the count to the smallest wish of the window (from 1 at
    1 s: 2); within the cooldown a slower p90 waits; a p90 under the target for the scale-down window brings it down."""
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
    await passes(25, 2, 1.0)  # wishes 4, but within the cooldown and the window since the change
    assert scale.wanted == 2
    await passes(10, 2, 1.0)
    assert scale.wanted == 4
    await passes(55, 4, 0.1)  # wishes 1, not yet for the whole scale-down window
    assert scale.wanted == 4
    await passes(10, 4, 0.1)
    assert scale.wanted == 1 and "scaled down" in scale.reason
    for (t1, _), (t2, _) in zip(changes, changes[1:]):
        assert t2 - t1 >= scaling.cooldown
