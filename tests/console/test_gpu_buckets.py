"""The console's GPU history: readings folded into one-minute buckets of the last hour (pure)."""

from __future__ import annotations

import math
import random

import pytest

from llmgw.console.buckets import MINUTES, FleetHistory, GpuSeries
from llmgw.console.charts import gpu_chart
from llmgw.console.views import load_class
from llmgw.control.readings import GpuSample, NodeReadings
from llmgw.control.registry import FleetRegistry
from llmgw.plan.types import GpuState, NodeState

GIB = 1 << 30


def reading(util=None, mem=None, power=None, index=0) -> GpuSample:
    return GpuSample(index=index, utilization_percent=util, memory_used_bytes=mem, power_draw_watts=power,
                      power_limit_watts=700.0)


def test_readings_of_one_minute_are_averaged_into_its_bucket():
    series = GpuSeries.empty(100).fold(100, reading(10, 2 * GIB, 100)).fold(100, reading(30, 4 * GIB, 300))
    assert series.means(100)[-1] == (100, 20.0, 3 * GIB, 200.0)


def test_a_minute_without_readings_is_none_never_zero():
    series = GpuSeries.empty(100).fold(100, reading(50, GIB, 200)).fold(102, reading(70, GIB, 200))
    means = {m[0]: m[1:] for m in series.means(102)}
    assert means[101] == (None, None, None)
    assert means[100][0] == 50.0 and means[102][0] == 70.0


def test_a_reading_the_agent_could_not_take_counts_for_nothing():
    series = GpuSeries.empty(5).fold(5, reading(40, None, 100)).fold(5, reading(None, GIB, 300))
    assert series.means(5)[-1] == (5, 40.0, GIB, 200.0)


def test_the_window_keeps_the_last_hour_and_drops_what_is_older():
    series = GpuSeries.empty(0)
    for minute in range(0, 3 * MINUTES):
        series = series.fold(minute, reading(minute % 100))
    means = series.means(3 * MINUTES - 1)
    assert len(means) == MINUTES
    assert [m[0] for m in means] == list(range(2 * MINUTES, 3 * MINUTES))
    assert [m[1] for m in means] == [float(m % 100) for m in range(2 * MINUTES, 3 * MINUTES)]
    assert series.fold(MINUTES, reading(99)) is series  # older than the window: dropped


def test_a_jump_of_more_than_an_hour_empties_every_bucket():
    series = GpuSeries.empty(10).fold(10, reading(80)).fold(10 + 5 * MINUTES, reading(20))
    means = series.means(10 + 5 * MINUTES)
    assert [m[1] for m in means if m[1] is not None] == [20.0]


def test_asking_for_a_later_minute_shows_the_old_buckets_shifted_and_the_new_ones_empty():
    series = GpuSeries.empty(10).fold(10, reading(80))
    means = series.means(40)
    assert {m[0]: m[1] for m in means}[10] == 80.0 and means[-1][1] is None
    assert all(m[1] is None for m in series.means(10 + MINUTES))


def test_folding_returns_a_new_series_and_leaves_the_old_one_as_it_was():
    first = GpuSeries.empty(1).fold(1, reading(10))
    second = first.fold(1, reading(90))
    assert first.means(1)[-1][1] == 10.0 and second.means(1)[-1][1] == 50.0


def test_a_card_holds_about_a_kilobyte_of_buckets():
    series = GpuSeries.empty(0)
    size = sum(a.itemsize * len(a) for a in (*series.sums, *series.counts))
    assert size == MINUTES * (3 * 4 + 3 * 2) == 1080


@pytest.mark.parametrize("seed", range(20))
def test_random_folds_match_a_plain_mean_per_minute(seed):
    rng = random.Random(seed)
    series, kept = GpuSeries.empty(0), {}
    minute = 0
    for _ in range(300):
        minute += rng.choice((0, 0, 0, 1, 1, 2, 7))
        value = rng.choice((None, rng.uniform(0, 100)))
        series = series.fold(minute, reading(value))
        if value is not None:
            kept.setdefault(minute, []).append(value)
    for m, util, _mem, _power in series.means(minute):
        expected = kept.get(m)
        if expected is None:
            assert util is None
        else:
            assert math.isclose(util, sum(expected) / len(expected), rel_tol=1e-5)


def registered(*node_ids: str) -> FleetRegistry:
    registry = FleetRegistry(lost_after=30.0)
    for node_id in node_ids:
        node = NodeState(node_id, gpus=(GpuState("0", "h200-141g", 141 * GIB, 141 * GIB),))
        registry, _ = registry.register(node, 0.0)
    return registry


def test_one_heartbeat_is_folded_once_however_often_the_fleet_is_sampled():
    registry = registered("n1")
    registry, _ = registry.heartbeat("n1", 1.0, readings=NodeReadings(at=1.0, gpus=(reading(60),)))
    history = FleetHistory().folded(registry.records(), 7)
    again = history.folded(registry.records(), 7)
    assert again.node("n1")[0] is history.node("n1")[0]
    registry, _ = registry.heartbeat("n1", 2.0, readings=NodeReadings(at=2.0, gpus=(reading(20),)))
    assert history.folded(registry.records(), 7).node("n1")[0].means(7)[-1][1] == 40.0


def test_a_node_gone_from_the_fleet_loses_its_history():
    registry = registered("n1", "n2")
    for node_id in ("n1", "n2"):
        registry, _ = registry.heartbeat(node_id, 1.0, readings=NodeReadings(at=1.0, gpus=(reading(5),)))
    history = FleetHistory().folded(registry.records(), 1)
    assert set(history.nodes) == {"n1", "n2"}
    only_n1 = FleetRegistry(30.0, records={"n1": registry.get("n1")})
    assert set(history.folded(only_n1.records(), 2).nodes) == {"n1"}


def test_the_chart_draws_a_line_per_metric_scaled_to_percent_and_breaks_at_gaps():
    series = GpuSeries.empty(0)
    for minute in (0, 1, 2, 5, 6):
        series = series.fold(minute, reading(50, 70 * GIB, 350))
    svg = gpu_chart(series, 59, 140 * GIB, 700.0, "GPU 0 of n1")
    assert svg.count('<polyline class="util"') == 2  # minutes 0-2 and 5-6, broken by the gap
    assert svg.count('<polyline class="mem"') == 2 and svg.count('<polyline class="power"') == 2
    assert ",102.0" in svg  # 50 %: half way down the 148-pixel-high plot that starts 28 pixels from the top
    assert 'aria-label="GPU 0 of n1"' in svg


def test_the_chart_leaves_out_power_when_the_limit_is_unknown():
    series = GpuSeries.empty(0).fold(0, reading(50, GIB, 350)).fold(1, reading(50, GIB, 350))
    svg = gpu_chart(series, 1, 140 * GIB, None, "x")
    assert 'class="power"' not in svg and 'class="util"' in svg
    assert "power % of" not in svg and "utilisation %" in svg and "memory % of 140GiB" in svg  # the legend


@pytest.mark.parametrize(("percent", "name"), [
    (None, "load-unknown"), (0.0, "load-idle"), (9.9, "load-idle"), (10.0, "load-low"), (39.9, "load-low"),
    (40.0, "load-mid"), (69.9, "load-mid"), (70.0, "load-high"), (100.0, "load-high"),
])
def test_loads_get_the_colour_class_of_their_band(percent, name):
    assert load_class(percent) == name


def test_a_mig_instance_is_its_own_tile_without_readings_and_a_whole_card_keeps_its_own():
    from llmgw.console.views import gpu_tiles

    registry = FleetRegistry(lost_after=30.0)
    node = NodeState("a100", gpus=(
        GpuState("MIG-1111", "a100-80g-mig-3g.40gb", 40 * GIB, 40 * GIB, uuid="MIG-1111", is_mig=True),
        GpuState("1", "a100-80g", 80 * GIB, 80 * GIB, uuid="GPU-2222"),
    ))
    registry, _ = registry.register(node, 0.0)
    registry, _ = registry.heartbeat("a100", 0.0, readings=NodeReadings(at=0.0, gpus=(
        reading(90, index=0), reading(20, index=1))))
    mig, whole = gpu_tiles(registry.get("a100"), now=1.0)
    assert (mig.device_id, mig.mig, mig.load, mig.gpu_class) == ("MIG-1111", True, "load-unknown",
                                                                 "a100-80g-mig-3g.40gb")
    assert (whole.device_id, whole.index, whole.mig, whole.load) == ("1", 1, False, "load-low")
    assert all(t.utilization_percent is None for t in gpu_tiles(registry.get("a100"), now=61.0))  # stale
