"""Benchmark: load and validate a generated settings tree of 1,000 models and 1,000 node overrides.

Usage: python bench/settings_load.py [--models N] [--nodes N] [--repeat R] [--git] [--hook-record] [--pure]
Prints the best wall time of R runs of `load_directory` (and, with --git, of `load_commit` on the same tree
committed to a bare repository; --pure forces the pure-Python YAML parser instead of ruamel.yaml.clib's).
Target on the 2-core development machine: about 2 s or less.
--hook-record (implies --git) also times what the settings watcher does for a pushed commit, the median and best
of R runs: `load_commit(..., trust_hook_record=True)` with the commit's tree not in the repository's record of
valid trees (full validation), and with it recorded as the pre-receive hook records it (no second schema check).
`--models 0 --nodes 0 --hook-record --repeat 50` times examples/cluster-repo alone.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmgw.settings import load_commit, load_directory  # noqa: E402
from llmgw.settings.repository import _seed_files, write_tree  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cluster-repo"

MODEL = """\
# yaml-language-server: $schema=../../schema/model.json
name: model-{i:04d}
engine: {engine}
weights:
  - source: hf://org/model-{i:04d}@{rev}/model.{suffix}
    sha256: {sha}
replicas: {replicas}
resources:
{resources}
context_size: 8192
engine_args: ["--seed", "{i}"]
aliases: [m{i:04d}]
prices:
  prompt_per_million: 0.{i:04d}
  completion_per_million: 1.{i:04d}
"""
NODE = """\
# yaml-language-server: $schema=../../../schema/agent.json
labels:
  rack: r{rack}
  zone: z{zone}
ignore_gpus: ["{gpu}"]
cpu_cores_reserved: 2
memory_reserved: 8Gi
heartbeat_interval: 5s
"""


def generate(root: Path, models: int, nodes: int) -> None:
    """Write the example tree plus `models` catalog files and `nodes` node overrides under `root`."""
    shutil.copytree(EXAMPLE, root)
    for i in range(models):
        gpu = i % 2 == 0
        resources = ("  gpus: 2\n  gpu_class: h100-80g\n  tensor_parallel: 2\n  memory: 64Gi" if gpu
                     else "  cpu_cores: 2\n  memory: 4Gi")
        (root / "catalog" / f"model-{i:04d}.yaml").write_text(MODEL.format(
            i=i, engine="vllm" if gpu else "llama.cpp", rev=hashlib.sha1(str(i).encode()).hexdigest(), sha=hashlib.sha256(str(i).encode()).hexdigest(),
            suffix="safetensors" if gpu else "gguf", replicas=i % 3, resources=resources))
    for n in range(nodes):
        (root / "agents" / "nodes" / f"node-{n:04d}.yaml").write_text(NODE.format(rack=n % 40, zone=n % 3, gpu=n % 8))


def median_best(repeat: int, load) -> tuple[float, float]:
    """The median and the best wall time of `repeat` runs of `load()`, in milliseconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        load()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), min(times)


def best_of(repeat: int, load) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = load()
        best = min(best, time.perf_counter() - started)
    return best, result


def hook_record(repo: Path, repeat: int) -> None:
    """Print the watcher's load of `repo`'s main branch without, then with its tree in the hook's record."""
    import pygit2

    from llmgw.cli.hook_cmds import record_valid_trees
    from llmgw.settings import validation_key

    started = time.perf_counter()
    validation_key()
    print(f"validation_key (once per process): {(time.perf_counter() - started) * 1000:.2f} ms")
    load = lambda: load_commit(repo, "main", trust_hook_record=True)  # noqa: E731
    full = median_best(repeat, load)
    record_valid_trees(repo, [str(pygit2.Repository(str(repo)).revparse_single("main").peel(pygit2.Commit).tree_id)])
    fast = median_best(repeat, load)
    for what, (median, best) in (("not recorded (full validation)", full), ("recorded by the hook", fast)):
        print(f"watcher's load, {what}: {median:.2f} ms median, {best:.2f} ms best of {repeat}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--git", action="store_true", help="also time loading the same tree from a bare repository")
    parser.add_argument("--hook-record", action="store_true",
                        help="time the watcher's load of the commit without and with the hook's record (implies --git)")
    parser.add_argument("--pure", action="store_true", help="use the pure-Python YAML parser (no ruamel.yaml.clib)")
    args = parser.parse_args()
    if args.pure:
        from llmgw.settings import parsing

        parsing._CParser = None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "settings"
        generate(root, args.models, args.nodes)
        seconds, settings = best_of(args.repeat, lambda: load_directory(root))
        print(f"load_directory: {len(settings.models)} models, {len(settings.node_agents)} node overrides: "
              f"{seconds:.2f} s (best of {args.repeat}){' [pure-Python YAML parser]' if args.pure else ''}")
        if args.git or args.hook_record:
            import pygit2

            repo = pygit2.init_repository(str(Path(tmp) / "repo.git"), bare=True, initial_head="main")
            signature = pygit2.Signature("bench", "bench@localhost")
            repo.create_commit("refs/heads/main", signature, signature, "bench", write_tree(repo, _seed_files(root)), [])
            seconds, settings = best_of(args.repeat, lambda: load_commit(Path(tmp) / "repo.git"))
            print(f"load_commit:    {len(settings.models)} models, {len(settings.node_agents)} node overrides: "
                  f"{seconds:.2f} s (best of {args.repeat})")
        if args.hook_record:
            hook_record(Path(tmp) / "repo.git", args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
