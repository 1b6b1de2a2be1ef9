"""Slurm jobs priced into usage (llmgw.control.slurm_usage) and recorded once each on both backends: a job repeated
in later heartbeats is one row of `llmgw usage`, with its GPU-hours' (or core-hours') price."""

from __future__ import annotations

import pytest

from llmgw.control.slurm_usage import job_cost, slurm_usage
from llmgw.store import Store
from llmgw.wire import pb

PRICES = {"default": 2.0, "h100-80g": 4.0, "cpu": 0.05}


def job(job_id: str = "42", **fields) -> pb.SlurmJob:
    values = dict(job_id=job_id, partition="gpu", account="ci", user="alice", state="completed",
                  elapsed_seconds=1800, cpus=8, gpus=2, gpu_type="h100-80g", end_time=1_790_000_000.0)
    values.update(fields)
    return pb.SlurmJob(**values)


@pytest.mark.parametrize(("fields", "cost"), [
    ({}, 2 * 0.5 * 4.0),                                # typed GPUs at their class's price
    ({"gpu_type": "l40s-48g"}, 2 * 0.5 * 2.0),          # a class without a price: default
    ({"gpu_type": ""}, 2 * 0.5 * 2.0),                  # untyped GPUs: default
    ({"gpus": 0, "gpu_type": ""}, 8 * 0.5 * 0.05),      # no card: core-hours at gpu_hour_cost.cpu
])
def test_a_job_costs_its_gpu_hours_or_core_hours(fields, cost) -> None:
    assert job_cost(job(**fields), PRICES) == pytest.approx(cost)
    assert job_cost(job(gpus=0), {"default": 2.0}) == 0  # core-hours without a cpu price cost nothing


def test_a_slurm_job_is_one_usage_row_however_often_it_is_reported(store: Store) -> None:
    for _ in range(3):  # three heartbeats carry the same ended jobs
        written = [store.record_usage_once(record, request_id) for request_id, record in
                   (slurm_usage(job(), "lab", "ctl", PRICES), slurm_usage(job("43", state="failed"), "lab", "ctl", PRICES))]
    assert written == [False, False]  # the repeats wrote nothing
    [row] = store.query_usage(by="model")
    assert (row.group, row.requests, row.errors) == ("slurm/gpu", 2, 1)
    assert row.cost == pytest.approx(2 * 2 * 0.5 * 4.0)
    assert row.mean_duration_seconds == pytest.approx(1800)
    [project] = store.query_usage(by="project")
    assert project.group == "ci"
    other_cluster_id, _ = slurm_usage(job(), "other", "ctl", PRICES)
    assert store.record_usage_once(slurm_usage(job(), "other", "ctl", PRICES)[1], other_cluster_id)
