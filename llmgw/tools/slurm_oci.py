"""Slurm's oci.conf for slurm.yaml `containers: runc` (issue 37), as every Slurm node's agent writes it. Pure.

The control plane sends the word `runc`, never text: each RunTime* line of oci.conf is a command slurmstepd runs
through /bin/sh (as the job's user), so the agent renders the file from this template only, with the runc it finds
on its node. With the file beside slurm.conf, `srun --container=BUNDLE` and `sbatch --container=BUNDLE` run the
step's tasks inside that OCI bundle (a directory holding config.json and its root file system): slurmstepd copies
the bundle's config.json into the step's spool directory (%b) with the task's command and environment, then runs
RunTimeRun there. Without the file a node ignores `--container` ("OCI Container not configured") and runs the
step outside any container.

Measured on Debian's slurm-wlm 22.05.8 and runc 1.1.5 (tests/slurm/test_slurm_containers.py):
- RunTimeCreate + RunTimeStart hang the step with runc: `runc create` leaves `runc init` holding the pipe slurmstepd
  reads to its end. RunTimeRun (`runc run`, in the foreground) works: the task's output reaches srun and its exit
  code is the step's.
- 22.05 replaces %n (node), %u (user name), %j (job), %s (step), %t (task) and %b (the step's bundle directory), not
  %U (a later version's uid: "fatal: _generate_pattern: unexpected replacement character: U").
- runc keeps its state in its default root (/run/runc for root; for other users runc's rootless mode with
  $XDG_RUNTIME_DIR/runc, which the job's environment must carry). A root inside %b keeps slurmstepd from removing
  the step's spool directory afterwards.
- The bundle's config.json must say `"terminal": false` (runc's `runc spec` writes true): with a terminal, runc waits
  for a console socket that Slurm never gives, and the step hangs.

Format: oci.conf(5) of Slurm 22.05 (slurm.schedmd.com/oci.conf.html; required: RunTimeQuery, RunTimeKill,
RunTimeDelete and either RunTimeRun or RunTimeCreate with RunTimeStart).
"""

from __future__ import annotations

import re

RUNTIMES = ("runc",)
"""The runtimes llmgw writes oci.conf for (slurm.yaml `containers`, besides `none`)."""

OCI_CONF_KEYS = frozenset({"RunTimeQuery", "RunTimeRun", "RunTimeKill", "RunTimeDelete"})
"""Every key `oci_conf` writes."""

CONTAINER_ID = "%n.%u.%j.%s.%t"
"""One container per task: node, user, job, step and task (Slurm's own example)."""

_PROGRAM = re.compile(r"/[A-Za-z0-9._+/-]+")


def oci_conf(runtime: str, program: str) -> str:
    """oci.conf's text for `runtime` (one of RUNTIMES) run as `program` (its absolute path on the node).

    Raises ValueError naming the value when `runtime` is not one llmgw writes for, or `program` is not an absolute
    path of letters, digits and `._+/-` (it is written into shell commands)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"no oci.conf for the container runtime {runtime!r}: llmgw writes it for "
                         f"{', '.join(RUNTIMES)}")
    if not _PROGRAM.fullmatch(program) or "/../" in program:
        raise ValueError(f"{program!r} is not an absolute path oci.conf can name")
    commands = {
        "RunTimeQuery": f"{program} state {CONTAINER_ID}",
        "RunTimeRun": f"{program} run {CONTAINER_ID} -b %b",
        "RunTimeKill": f"{program} kill -a {CONTAINER_ID}",
        "RunTimeDelete": f"{program} delete --force {CONTAINER_ID}",
    }
    lines = ["# Written by llmgw (slurm.yaml containers: runc): edits here are overwritten.",
             *(f'{key}="{command}"' for key, command in commands.items())]
    return "\n".join(lines) + "\n"
