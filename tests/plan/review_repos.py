"""Helpers of the review tests: real git repositories (the git CLI) seeded from examples/cluster-repo, pull-request
branches laid over them, and the fleet they run on (an 8 x H100 node and a CPU node) as snapshot files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from plan_fleets import GiB, cpu_node, gpu_node

from llmgw.plan import Fleet, ObservedShard, ShardState, fingerprint
from llmgw.plan.forecasting import ModelLoad, RecordedLoad, Traffic
from llmgw.plan.snapshot import FleetSnapshot, snapshot_to_json
from llmgw.routes import ReplicaSpeed
from llmgw.settings import Settings, load_commit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cluster-repo"
GPU_NODE = "gpu-node-01"  # examples/cluster-repo/agents/nodes/gpu-node-01.yaml: zone eu-west-1, GPU 7 ignored
CPU_NODE = "cpu-node-01"
LLAMA = "catalog/llama-3.1-70b-instruct.yaml"


def git(repo: Path, *args: str) -> str:
    """Run the git CLI in `repo`; its stdout. Raises AssertionError with git's stderr on failure.

    Author, committer and dates are fixed, so the same edits give the same commit ids (docs/review.md shows them).
    """
    env = dict(os.environ, GIT_AUTHOR_NAME="Ada", GIT_AUTHOR_EMAIL="ada@example.com",
               GIT_COMMITTER_NAME="Ada", GIT_COMMITTER_EMAIL="ada@example.com",
               GIT_AUTHOR_DATE="2026-12-01T02:00:00Z", GIT_COMMITTER_DATE="2026-12-01T02:00:00Z")
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode:
        raise AssertionError(f"git {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


def example_repo(path: Path) -> Path:
    """A git work tree at `path` holding examples/cluster-repo as one commit on main."""
    shutil.copytree(EXAMPLE, path)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "the example settings")
    return path


def edit(path: Path, rel: str, old: str, new: str) -> None:
    """Replace the one occurrence of `old` in the file `rel` of `path` with `new`."""
    text = (path / rel).read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {rel}"
    (path / rel).write_text(text.replace(old, new))


def branch(repo: Path, name: str, edits: list[tuple[str, str, str]], start: str = "main") -> str:
    """Commit `edits` ((file, old, new) each) on a new branch `name` from `start`; back on main after. The commit."""
    git(repo, "checkout", "-q", "-b", name, start)
    for rel, old, new in edits:
        edit(repo, rel, old, new)
    git(repo, "commit", "-q", "-am", f"{name}")
    commit = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return commit


def replicas(n: int) -> tuple[str, str, str]:
    """The edit that sets the 70B model's replicas to `n` (0 in the example)."""
    return (LLAMA, "\nreplicas: 0\n", f"\nreplicas: {n}\n")


def example_fleet(settings: Settings) -> Fleet:
    """The fleet converged to the example `settings`: the 8 x H100 node (no shards) and a CPU node running
    gemma-3-270m-0 and smollm2-135m-instruct-0 (ready, with the fingerprints `settings` give them)."""
    running = []
    for port, name in enumerate(("gemma-3-270m", "smollm2-135m-instruct"), start=20000):
        model = settings.models[name]
        running.append(ObservedShard(f"{name}-0/0", f"{name}-0", name, ShardState.READY,
                                     fingerprint(model, model.engine_version), settings.commit or "", (),
                                     model.resources.cpu_cores, GiB, port))
    return Fleet((
        gpu_node(GPU_NODE, engines=("llama.cpp@b11434", "vllm@0.11.0"), labels={"zone": "eu-west-1"}),
        cpu_node(CPU_NODE, cores=8, memory=32 * GiB, shards=tuple(running)),
    ))


def write_snapshot(path: Path, fleet: Fleet, commit: str | None, taken_at: str = "2026-12-01T02:00:00Z",
                   load: RecordedLoad | None = None) -> Path:
    """`fleet` (and `load`, when given) as a snapshot file at `path`."""
    path.write_text(json.dumps(snapshot_to_json(FleetSnapshot(fleet, taken_at, commit, load)), indent=2))
    return path


def example_load() -> RecordedLoad:
    """Three days of load on `example_fleet`: gemma-3-270m's replica measured at one engine thread's speeds on this
    project's machines (DESIGN.md: about 38 decode tokens/s per thread), used by three projects; SmolLM2 by demo."""
    return RecordedLoad(
        window_seconds=3 * 86400.0, until="2026-12-01T02:00:00Z",
        speeds={"gemma-3-270m-0": ReplicaSpeed(250.0, 38.0, 1, 1764554400.0, "metrics"),
                "smollm2-135m-instruct-0": ReplicaSpeed(600.0, 90.0, 1, 1764554400.0, "bench")},
        traffic=(Traffic("gemma-3-270m", "demo", 9000, 2_700_000, 900_000, 12),
                 Traffic("gemma-3-270m", "ci", 1200, 120_000, 60_000),
                 Traffic("gemma-3-270m", "assistants", 600, 300_000, 90_000),
                 Traffic("smollm2-135m-instruct", "demo", 3000, 450_000, 150_000)),
        models={"gemma-3-270m": ModelLoad("gemma-3-270m", 480, 2.9, 10_800),
                "smollm2-135m-instruct": ModelLoad("smollm2-135m-instruct", 150, 0.4, 3000)},
    )


def example_snapshot(repo: Path, path: Path, load: RecordedLoad | None = None) -> Path:
    """A snapshot file of `example_fleet` (and `load`) for the settings on main of `repo`."""
    settings = load_commit(repo, "main")
    return write_snapshot(path, example_fleet(settings), settings.commit, load=load)


def docs_example(root: Path) -> tuple[Path, Path]:
    """The repository and snapshot of the comment shown in docs/review.md: (repository, snapshot file) under `root`.

    Branch scale-70b raises llama-3.1-70b-instruct to 4 replicas, gemma-3-270m to 2, a project's requests per minute
    and a price; the snapshot holds `example_load`.
    """
    repo = example_repo(root / "settings")
    snapshot = example_snapshot(repo, root / "fleet.json", example_load())
    branch(repo, "scale-70b", [replicas(4), ("projects.yaml", "requests_per_minute: 600\n", "requests_per_minute: 1200\n"),
                               (LLAMA, "prompt_per_million: 0.60", "prompt_per_million: 0.75"),
                               ("catalog/gemma-3-270m.yaml", "\nreplicas: 1\n", "\nreplicas: 2\n")])
    return repo, snapshot
