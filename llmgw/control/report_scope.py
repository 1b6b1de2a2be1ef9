"""What a node's reports may change: only its own (issue 25, item 4). Pure.

A node's identity is proven at Register (`llmgw.control.node_identity`, or its certificate); after that, every
message of its stream speaks for that node id only, and these checks bound what it may say:

- **Slurm's ended jobs** (`Heartbeat.slurm.finished_jobs`, `finished_until`) are billed into usage and move the
  cluster's sacct cursor. Only the node slurm.yaml names `controller` may send them, for slurm.yaml's
  `cluster_name`, at most `SLURM_JOBS_MAX` jobs a beat (the agent's own cap, `llmgw.agent.slurm.MAX_FINISHED`),
  times no later than `CLOCK_SKEW` seconds past the control plane's clock, no job ending before the cursor less the
  agent's margin (`CURSOR_MARGIN`) and the skew, and each job's length, GPUs and CPUs within `JOB_BOUNDS`.
  `slurm_report_problem` says what is wrong; the whole report is then left out (nothing recorded, the cursor
  unmoved). A `finished_until` before the cursor never moves it back (`llmgw.control.events.slurm_jobs_reported`).
- **Prefix-cache blocks** (`KvBlocks`) only for a replica one of the node's own reported shards runs, or to remove
  an entry the node made itself (`blocks_problem`); how many a replica may hold is capped in
  `llmgw.control.kv_blocks`.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from llmgw.agent.slurm import CURSOR_MARGIN, MAX_FINISHED

CLOCK_SKEW = 300.0
"""Seconds a node's clock may run ahead of the control plane's in what it reports."""
SLURM_JOBS_MAX = MAX_FINISHED
JOB_BOUNDS = {"elapsed_seconds": 366 * 86400.0, "gpus": 100_000, "cpus": 10_000_000}
"""The most one ended Slurm job may report: a year's length, and GPUs and CPUs past any cluster's."""


def slurm_report_problem(node_id: str, report, slurm, cursor: float, unix_now: float) -> str | None:
    """Why the ended jobs in pb SlurmReport `report` from `node_id` may not be recorded, or None when they may.

    `slurm`: the SlurmSettings in force; `cursor`: the cluster's sacct cursor the control plane holds (unix seconds,
    0 none); `unix_now`: the control plane's clock (unix seconds)."""
    if not slurm.enabled or node_id != slurm.controller:
        return (f"node {node_id!r} sent ended Slurm jobs but is not the Slurm controller "
                f"({slurm.controller or 'none'} in slurm.yaml); they are not recorded")
    if report.cluster_name and report.cluster_name != slurm.cluster_name:
        return (f"node {node_id!r} sent ended jobs of Slurm cluster {report.cluster_name!r}, not of "
                f"{slurm.cluster_name!r}; they are not recorded")
    if len(report.finished_jobs) > SLURM_JOBS_MAX:
        return f"node {node_id!r} sent {len(report.finished_jobs)} ended Slurm jobs in one beat, more than {SLURM_JOBS_MAX}"
    latest = unix_now + CLOCK_SKEW
    until = report.finished_until
    if not math.isfinite(until) or until < 0 or until > latest:
        return (f"node {node_id!r} sent Slurm jobs complete until {until!r}, which is not between 0 and the control "
                f"plane's clock plus {CLOCK_SKEW:g} s; they are not recorded")
    earliest = cursor - CURSOR_MARGIN - CLOCK_SKEW if cursor else -math.inf
    for job in report.finished_jobs:
        if not math.isfinite(job.end_time) or not earliest <= job.end_time <= latest:
            return (f"node {node_id!r} sent Slurm job {job.job_id!r} ending at {job.end_time!r}, outside the times "
                    "it may report (from the sacct cursor less its margin to the control plane's clock)")
        for field, bound in JOB_BOUNDS.items():
            value = getattr(job, field)
            if not (math.isfinite(value) and 0 <= value <= bound):
                return f"node {node_id!r} sent Slurm job {job.job_id!r} with {field} {value!r}, above {bound:g}"
    return None


def blocks_problem(node_id: str, replica_id: str, runs: Collection[str], removes_its_own: bool = False) -> str | None:
    """Why `node_id` may not send prefix-cache blocks for `replica_id`, or None: `runs` are the replica ids of the
    shards it reports as its own (Register, heartbeats, shard status; engines llmgw did not start left out).
    `removes_its_own`: the update only removes an entry `node_id` itself made (its shard stopped, so its heartbeats
    no longer list the replica): always allowed."""
    if replica_id not in runs and not removes_its_own:
        return (f"node {node_id!r} sent prefix-cache blocks for replica {replica_id!r}, which none of its shards "
                "runs; they are ignored")
    return None
