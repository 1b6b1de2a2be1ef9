"""Slurm jobs priced into llmgw's usage: one usage row per job that ended, so one bill covers both (issue 15). Pure.

The controller's agent reads the jobs that ended (`sacct`, llmgw.agent.slurm) and sends them in every heartbeat
until the control plane has recorded them and moved the sacct cursor (llmgw.control.slurm_store); `slurm_usage` turns each into a UsageRecord and the id it is recorded under,
"slurm:<cluster>:<job id>", which the usage table keeps unique (`Store.record_usage_once`), so a job repeated
in later beats, or sent by two control planes' agents' links, is counted once.

A job is model "slurm/<partition>" of project <account> (the project's Slurm account), at the time it ended,
lasting its elapsed seconds, status 200 when it completed and 500 otherwise (`llmgw usage` counts it among the
errors). Its cost is GPU-hours (GPUs x elapsed hours) at llmgw.yaml's `prices.gpu_hour_cost` for its GPU type
(the GRES type, which llmgw writes from the GPU class) or `default`; a job without GPUs is core-hours at
`gpu_hour_cost.cpu` (nothing when that is not given).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.store.gpu_hours import CPU_CLASS, hour_price
from llmgw.store.records import UsageRecord
from llmgw.wire import pb



def job_cost(job: pb.SlurmJob, gpu_hour_cost: Mapping[str, float]) -> float:
    """The job's cost in the cluster's currency (see the module docstring)."""
    hours = max(0.0, job.elapsed_seconds) / 3600.0
    if job.gpus:
        return job.gpus * hours * hour_price(gpu_hour_cost, job.gpu_type)
    return job.cpus * hours * gpu_hour_cost.get(CPU_CLASS, 0.0)


def slurm_usage(job: pb.SlurmJob, cluster: str, node: str, gpu_hour_cost: Mapping[str, float]) -> tuple[str, UsageRecord]:
    """(request id, UsageRecord) for one ended job of Slurm cluster `cluster`, reported by `node`."""
    record = UsageRecord(
        project=job.account or "-", model=f"slurm/{job.partition or '-'}", time=job.end_time, node=node,
        replica=f"slurm:{job.job_id}", duration_seconds=max(0.0, job.elapsed_seconds),
        status=200 if job.state == "completed" else 500, cost=job_cost(job, gpu_hour_cost))
    return f"slurm:{cluster}:{job.job_id}", record
