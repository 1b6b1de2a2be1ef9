"""Replicas' GPU-hours shared among projects in proportion to use (llmgw.store.gpu_hours), a pure function of the
usage records: hand-made cases, and 60 seeded random loads checked for its rules (every replica's shares add up to
the time any request ran on it, no share is negative or longer than its request, and a request alone has its whole
duration)."""

from __future__ import annotations

import random

import pytest

from llmgw.store import UsageRecord
from llmgw.store.gpu_hours import ReplicaSize, gpu_hours, shares_of_use

SIZES = {"big": ReplicaSize(2, "h200-141g"), "tiny": ReplicaSize(0, "", 0.5), "odd": ReplicaSize(1, "b200-192g")}
PRICES = {"h200-141g": 4.0, "default": 3.0, "cpu": 0.1}


def use(project: str, start: float, seconds: float, model: str = "big", replica: str | None = "big-0",
        status: int = 200) -> UsageRecord:
    return UsageRecord(project=project, model=model, time=start + seconds, replica=replica,
                       duration_seconds=seconds, status=status)


def test_a_request_alone_holds_every_gpu_of_its_replica_for_its_duration_and_two_at_once_share_them():
    records = [use("a", 0, 3600), use("b", 7200, 1800), use("b", 7200, 1800)]
    rows = {(r.project, r.model): r for r in gpu_hours(records, SIZES, PRICES)}
    assert rows["a", "big"].gpu_hours == pytest.approx(2.0) and rows["a", "big"].cost == pytest.approx(8.0)
    # b's two requests ran together for half an hour: the replica's 2 GPUs for 0.5 h, whoever sent them
    assert rows["b", "big"].gpu_hours == pytest.approx(1.0) and rows["b", "big"].requests == 2


def test_overlapping_projects_split_the_overlap_and_idle_time_is_nobodys():
    # a runs 0-60 s, b 30-90 s, on one replica; 90-1000 s nobody
    records = [use("a", 0, 60), use("b", 30, 60), use("a", 1000, 10)]
    shares = {(r.project, r.time): s for r, s in shares_of_use(records)}
    assert shares["a", 60] == pytest.approx(45.0) and shares["b", 90] == pytest.approx(45.0)
    assert shares["a", 1010] == pytest.approx(10.0)


def test_cpu_replicas_count_core_hours_gpu_classes_without_a_price_take_the_default_and_slurm_rows_are_left_out():
    records = [use("a", 0, 7200, model="tiny", replica="tiny-0"), use("a", 0, 3600, model="odd", replica="odd-0"),
               use("a", 0, 3600, model="slurm/gpu", replica="slurm:17"), use("a", 0, 5, replica=None, status=429),
               use("a", 0, 3600, model="gone", replica="gone-0")]
    rows = {r.model: r for r in gpu_hours(records, SIZES, PRICES)}
    assert (rows["tiny"].gpu_hours, rows["tiny"].core_hours) == (0.0, pytest.approx(1.0))
    assert rows["tiny"].cost == pytest.approx(0.1)
    assert rows["odd"].gpu_hours == pytest.approx(1.0) and rows["odd"].cost == pytest.approx(3.0)
    assert rows["gone"].requests == 1 and rows["gone"].gpu_hours == 0.0  # no longer in the catalog: no size
    assert set(rows) == {"tiny", "odd", "gone"}
    assert set(rows["tiny"].to_json()) == {"project", "model", "requests", "gpu_hours", "core_hours", "cost"}


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


@pytest.mark.parametrize("seed", range(60))
def test_shares_add_up_to_the_time_each_replica_was_used(seed):
    rng = random.Random(seed)
    records = []
    for _ in range(rng.randint(1, 40)):
        start = rng.choice([rng.uniform(0, 500), float(rng.randint(0, 50) * 10)])  # shared edges too
        seconds = rng.choice([0.0, rng.uniform(0.01, 120), 10.0])
        records.append(use(rng.choice("abc"), start, seconds, replica=f"big-{rng.randint(0, 2)}"))
    shares = shares_of_use(records)
    assert len(shares) == len(records)
    for record, share in shares:
        assert -1e-9 <= share <= record.duration_seconds + 1e-9
        others = [r for r in records if r.replica == record.replica and r is not record
                  and r.time - r.duration_seconds < record.time and r.time > record.time - record.duration_seconds
                  and r.duration_seconds > 0]
        if not others:
            assert share == pytest.approx(record.duration_seconds)
    for replica in {r.replica for r in records}:
        used = _union([(r.time - r.duration_seconds, r.time) for r in records if r.replica == replica])
        assert sum(s for r, s in shares if r.replica == replica) == pytest.approx(used, abs=1e-6)
    total = sum(row.gpu_hours for row in gpu_hours(records, SIZES, PRICES))
    assert total == pytest.approx(2 * sum(s for _r, s in shares) / 3600, abs=1e-9)
