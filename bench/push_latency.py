"""Time from `git push` returning to the reconcile pass for the pushed commit starting.

A real control plane (in this process) watches a bare settings repository made by `init_repository` (with its
hooks); each round clones nothing, but commits a change of a catalog model's replicas in a working clone and runs
`git push` (the git CLI, so pre-receive validates and post-receive notifies the admin API). The latency is the
start of the first reconcile pass that uses the pushed commit minus the moment `git push` returned (negative:
the pass started before the push command had finished returning). Target: 200 ms or less with the hook.

    .venv/bin/python bench/push_latency.py [--rounds 10] [--no-hook]

--no-hook removes the notify URL, so only polling (llmgw.yaml's poll_interval, 2 s here) finds the commit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pygit2
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmgw.control import ControlConfig, ControlPlane  # noqa: E402
from llmgw.settings import NOTIFY_URL_KEY, init_repository  # noqa: E402
from llmgw.settings.model import Listener  # noqa: E402

SEED = {
    "llmgw.yaml": "name: bench\nreconcile:\n  poll_interval: 2s\n  interval: 30s\n",
    "catalog/tiny.yaml": ("name: tiny\nengine: llama.cpp\nweights:\n  - source: https://example.invalid/t.gguf\n"
                          "    sha256: " + "ab" * 32 + "\nreplicas: 1\nresources:\n  cpu_cores: 0.1\n"
                          "  memory: 64Mi\n"),
}


def git(*args: str, cwd: Path) -> None:
    env = dict(os.environ, GIT_AUTHOR_NAME="Bench", GIT_AUTHOR_EMAIL="bench@example.com",
               GIT_COMMITTER_NAME="Bench", GIT_COMMITTER_EMAIL="bench@example.com")
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


async def measure(rounds: int, hook: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        seed = root / "seed"
        for name, text in SEED.items():
            (seed / name).parent.mkdir(parents=True, exist_ok=True)
            (seed / name).write_text(text)
        (seed / "engines.yaml").write_text((ROOT / "examples" / "cluster-repo" / "engines.yaml").read_text())
        repo = root / "settings.git"
        init_repository(repo, seed)
        any_port = Listener(port=0)
        plane = ControlPlane(ControlConfig(
            repo=str(repo), state_dir=root / "state", gateway=False, set_notify_url=hook,
            admin_listener=any_port, agents_listener=any_port,
        ))
        if not hook:
            config = pygit2.Repository(str(repo)).config
            if NOTIFY_URL_KEY in config:
                del config[NOTIFY_URL_KEY]
        latencies = []
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            checkout = root / "checkout"
            await trio.to_thread.run_sync(lambda: git("clone", "-q", str(repo), str(checkout), cwd=root))
            for n in range(rounds):
                path = checkout / "catalog" / "tiny.yaml"
                path.write_text(path.read_text().replace(f"replicas: {n % 2 + 1}", f"replicas: {(n + 1) % 2 + 1}"))
                await trio.to_thread.run_sync(lambda: git("commit", "-qam", f"round {n}", cwd=checkout))
                began = time.time()
                await trio.to_thread.run_sync(lambda: git("push", "-q", "origin", "HEAD:main", cwd=checkout))
                returned = time.time()
                head = pygit2.Repository(str(repo)).references["refs/heads/main"].target
                record = None
                while record is None:
                    record = next((p for p in plane.passes if p.settings_commit == str(head)), None)
                    if record is None:
                        await trio.sleep(0.002)
                latencies.append((record.started_at - returned, record.started_at - began))
                await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
        return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-hook", action="store_true", help="Find commits by polling only.")
    args = parser.parse_args()
    latencies = trio.run(measure, args.rounds, not args.no_hook)
    ms = [after * 1000 for after, _ in latencies]
    whole = [since * 1000 for _, since in latencies]
    mode = "polling only (poll_interval 2 s)" if args.no_hook else "post-receive hook"
    print(f"push -> reconcile pass start, {mode}, {len(ms)} pushes:")
    print(f"  median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms, min {min(ms):.0f} ms "
          f"(negative: the pass began before `git push` returned)")
    print(f"  from `git push` starting: median {statistics.median(whole):.0f} ms, max {max(whole):.0f} ms "
          f"(includes the pre-receive validation)")
    if not args.no_hook:
        print(f"  target <= 200 ms: {'met' if max(ms) <= 200 else 'NOT met'}")


if __name__ == "__main__":
    main()
