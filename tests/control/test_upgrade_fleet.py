"""`llmgw upgrade` on real processes: `llmgw server` and two `llmgw agent`s, each run from a release installed as
`llmgw node add` installs it (<root>/opt/llmgw/<version> venvs, `current` linked to one) in a directory of its own,
serving two replicas of the llama-server stand-in.

Releases are built from this checkout with the version raised (0.1.1), and once more (0.1.2) with an agent that
exits at start, each llmgw's own wheel beside the same dependency wheels (support.releases keeps those on disk).
The control plane runs the 0.1.2 tree (control planes are upgraded first: `llmgw upgrade` refuses a release newer
than the control plane; 0.1.2's control plane is sound, only its agent is broken). Both nodes start on 0.1.0, a
copy of the dependencies venv kept on disk with llmgw's wheel added. Upgrading to 0.1.1: every agent receives it
over its stream, installs it (pip, offline, as on a real node), re-executes itself (same pid) and registers with
0.1.1; every engine keeps its pid; requests through the gateway succeed throughout (counted). Upgrading to 0.1.2:
the first node's new agent exits at start, its watcher rolls it back to 0.1.1 by itself, and the upgrade stops
with that reason; the second node is not touched.

Slow: the three offline pip installs the agents make themselves (20-35 s each on a loaded 2-core machine) are most
of its 2-3 minutes; the releases take 5-7 s each, the first install 6.5 s (not counting the one download of the
dependency wheels and their venv into the cache: 88 s and 39 s at load 12, once per change of the dependencies)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from llmgw.agent.upgrading import switch_current
from llmgw.cli import upgrade_cmds
from llmgw.release import MANIFEST, PUBLIC_KEY_FILE, RECORD_DIR, SIGNATURE, keygen, read_public_key
from llmgw.settings import init_repository
from support.leftovers import kill_processes_naming
from support.in_process_cli import run_llmgw
from support.releases import dependency_wheels, install_from_venv, release_beside, version_tree
from support.waiting import wait_for

from .conftest import write_seed

ROOT = Path(__file__).resolve().parents[2]
EXIT_AT_START = "import sys; sys.exit('this llmgw agent exits at start (a broken release)')\n"


def _tree(target: Path, version: str, broken: bool = False) -> Path:
    """This checkout at `version` (support.releases.version_tree); `broken`: its agent command exits at once."""
    version_tree(target, version)
    if broken:
        agent = target / "llmgw" / "cli" / "agent_cmds.py"
        agent.write_text(agent.read_text().replace(
            '        """Run this node\'s agent: discover, register, run the shards the control plane assigns."""\n',
            '        """Run this node\'s agent: discover, register, run the shards the control plane assigns."""\n'
            f"        {EXIT_AT_START}", 1))
        assert EXIT_AT_START in agent.read_text()
    return target


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """{version: (release directory, source tree)} for 0.1.0 (this checkout), 0.1.1 and 0.1.2 (broken), signed by
    one key, each llmgw's own wheel beside the same dependency wheels (support.releases: downloaded once, kept on
    disk); and the key line."""
    root = tmp_path_factory.mktemp("releases")
    secret, public = keygen(root / "keys")
    wheels = dependency_wheels()
    built = {}
    for version, broken in (("0.1.0", False), ("0.1.1", False), ("0.1.2", True)):
        source = ROOT if version == "0.1.0" else _tree(root / f"src-{version}", version, broken)
        started = time.monotonic()
        built[version] = (release_beside(wheels, root / f"release-{version}", secret, source), source)
        print(f"release {version} built in {time.monotonic() - started:.1f} s")
    return built, read_public_key(public).line


def _install_node(release: Path, opt: Path, template: Path | None) -> None:
    """<opt>/0.1.0 with `release` installed (the dependencies venv kept on disk with llmgw's wheel added, as pip
    installs them offline, or a copy of `template`'s venv: it runs by `python -m`, so its place does not matter),
    its record, and <opt>/current linked to it. The upgrades the test makes install with pip, as agents do."""
    venv = opt / "0.1.0"
    opt.mkdir(parents=True)
    if template is None:
        install_from_venv(venv, release / "wheels", "0.1.0")
    else:
        shutil.copytree(template, venv, symlinks=True)
    (venv / RECORD_DIR).mkdir(exist_ok=True)
    for name in (MANIFEST, SIGNATURE):
        shutil.copy2(release / name, venv / RECORD_DIR / name)
    switch_current(opt, "0.1.0")


def _pids(status: dict, node: str) -> dict[str, int]:
    """{shard id: engine pid} of the shards `node`'s agent runs (not the engines it sees that it did not start: both
    agents run on this one machine, so each may list the other's as foreign)."""
    return {shard: s["pid"] for shard, s in status["nodes"][node]["shards"].items() if not s.get("foreign")}


@pytest.mark.slow
def test_upgrade_rolls_agents_node_by_node_engines_serving_and_a_broken_release_rolls_back(
        tmp_path, weights_mirror, fake_engine, releases, monkeypatch):
    built, key_line = releases
    monkeypatch.setattr(upgrade_cmds, "POLL", 0.2)  # `llmgw upgrade` (run in this process) sees the end sooner
    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha, replicas=2)
    llmgw_yaml = (seed / "llmgw.yaml").read_text()  # a node is lost after 30 s, as by default (not the tests' 3 s:
    assert "node_lost_after: 3s" in llmgw_yaml  # an agent re-executing itself is away for seconds here)
    (seed / "llmgw.yaml").write_text(llmgw_yaml.replace("node_lost_after: 3s", "node_lost_after: 30s"))
    with open(seed / "llmgw.yaml", "a") as file:
        file.write(f"releases:\n  trusted_keys:\n    - {key_line}\n")
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    (built["0.1.0"][0] / PUBLIC_KEY_FILE).unlink(missing_ok=True)
    started = time.monotonic()
    for node, template in (("n1", None), ("n2", tmp_path / "n1" / "opt" / "0.1.0")):
        _install_node(built["0.1.0"][0], tmp_path / node / "opt", template)
        shutil.copy2(built["0.1.0"][0].parent / "keys" / "llmgw-release.pub",
                     tmp_path / node / "opt" / "0.1.0" / RECORD_DIR / PUBLIC_KEY_FILE)
    print(f"0.1.0 installed on two nodes in {time.monotonic() - started:.1f} s")

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    logs, procs = {}, {}
    state = tmp_path / "state"

    def spawn(name: str, argv: list[str], extra_env: dict[str, str]) -> subprocess.Popen:
        logs[name] = tmp_path / f"{name}.log"
        procs[name] = subprocess.Popen(argv, stdout=open(logs[name], "ab"), stderr=subprocess.STDOUT,
                                       start_new_session=True, env={**env, **extra_env}, cwd=tmp_path)
        return procs[name]

    def show() -> str:
        return "\n".join(f"--- {name}\n{path.read_text()[-4000:]}" for name, path in logs.items())

    import sys

    server_tree = built["0.1.2"][1]  # the control plane first: it runs 0.1.2
    spawn("server", [sys.executable, "-P", "-m", "llmgw.cli", "server", "--repo", str(repo), "--state", str(state),
                     "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0"],
          {"PYTHONPATH": str(server_tree)})
    agent_pids: dict[str, int] = {}
    done = threading.Event()
    answers: list[int] = []
    refused: list[str] = []
    pids: dict[str, dict[str, int]] = {}
    try:
        wait_for(lambda: (state / "admin-url").is_file() and (state / "admin-token").is_file(), 90, "the server",
                 show)
        admin_url, admin_token = (state / "admin-url").read_text().strip(), (state / "admin-token").read_text().strip()
        admin = httpx.Client(base_url=admin_url, timeout=30, headers={"Authorization": f"Bearer {admin_token}"})
        plane = wait_for(lambda: admin.get("/api/v1/status").json()["control_plane"], 30, "the admin API", show)
        assert plane["version"] == "0.1.2"
        for node in ("n1", "n2"):
            python = tmp_path / node / "opt" / "current" / "bin" / "python"
            agent_pids[node] = spawn(node, [
                str(python), "-P", "-m", "llmgw.cli", "agent", "--control-plane",
                f"127.0.0.1:{plane['agents_port']}", "--node-id", node, "--state-dir", str(tmp_path / node / "state"),
                "--mirror", str(mirror), "--heartbeat-interval", "200ms", "--insecure", "--no-bandwidth-probe",
                "--engine-binary", f"llama.cpp@b11434={fake_engine}"], {}).pid

        def status() -> dict:
            return admin.get("/api/v1/status").json()

        def ready() -> bool:  # both nodes registered too: under load n2 may take both replicas before n1 registers
            doc = status()
            return (all(r["state"] == "ready" for r in doc["replicas"].values()) and len(doc["replicas"]) == 2
                    and {"n1", "n2"} <= set(doc["nodes"]))

        wait_for(ready, 120, "both replicas ready and both nodes registered", show)
        before = status()
        assert {n: before["nodes"][n]["agent_version"] for n in ("n1", "n2")} == {"n1": "0.1.0", "n2": "0.1.0"}
        pids = {n: _pids(before, n) for n in ("n1", "n2")}
        assert sum(len(p) for p in pids.values()) == 2
        key = admin.post("/api/v1/keys", json={"project": "demo", "name": "upgrade"}).json()["key"]

        def keep_asking() -> None:  # one request after another through the gateway, each counted
            with httpx.Client(base_url=plane["gateway_url"], timeout=30,
                              headers={"Authorization": f"Bearer {key}"}) as client:
                while not done.is_set():
                    reply = client.post("/v1/chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                    answers.append(reply.status_code)
                    if reply.status_code != 200:
                        refused.append(f"{time.strftime('%H:%M:%S')} {reply.status_code} {reply.text[:300]}")
                    time.sleep(0.05)

        asker = threading.Thread(target=keep_asking, daemon=True)
        asker.start()
        wait_for(lambda: len(answers) >= 3, 30, "requests flowing", show)

        started = time.monotonic()
        code, out, err = run_llmgw(["upgrade", str(built["0.1.1"][0]), "--url", admin_url, "--token", admin_token,
                                    "--confirm-timeout", "90s"])
        upgrade_seconds = time.monotonic() - started
        assert code == 0, out + err + show()
        print(out)
        print(f"upgrade of two nodes to 0.1.1: {upgrade_seconds:.1f} s")
        assert "upgrade to llmgw 0.1.1 done" in out
        after = status()
        assert {n: after["nodes"][n]["agent_version"] for n in ("n1", "n2")} == {"n1": "0.1.1", "n2": "0.1.1"}
        assert {n: _pids(after, n) for n in ("n1", "n2")} == pids  # every engine kept its pid
        for node in ("n1", "n2"):
            assert procs[node].poll() is None  # the same agent process, re-executed
            assert os.readlink(tmp_path / node / "opt" / "current") == "0.1.1"
            assert not (tmp_path / node / "state" / "upgrade-pending.json").exists()  # confirmed
        upgrade = after["upgrade"]
        assert upgrade["state"] == "done" and [n["phase"] for n in upgrade["nodes"]] == ["done", "done"]
        counted = len(answers)
        wait_for(lambda: len(answers) >= counted + 3, 30, "requests after the upgrade", show)
        done.set()
        asker.join(30)
        assert answers and set(answers) == {200}, "\n".join(refused) + show()
        print(f"{len(answers)} requests through the upgrade, all answered 200")

        # A release whose agent exits at start: n1 rolls back by itself to 0.1.1, the upgrade stops, n2 untouched.
        code, out, err = run_llmgw(["upgrade", str(built["0.1.2"][0]), "--url", admin_url, "--token", admin_token,
                                    "--confirm-timeout", "60s"])
        assert code == 1, out + err + show()
        assert "upgrade to llmgw 0.1.2 failed: node n1 came back with llmgw 0.1.1, not 0.1.2: the upgrade to llmgw " \
               "0.1.2 was rolled back to 0.1.1: the agent of llmgw 0.1.2 exited before it registered" in out, out
        final = status()
        assert [n["phase"] for n in final["upgrade"]["nodes"]] == ["failed", "waiting"]
        assert {n: final["nodes"][n]["agent_version"] for n in ("n1", "n2")} == {"n1": "0.1.1", "n2": "0.1.1"}
        assert os.readlink(tmp_path / "n1" / "opt" / "current") == "0.1.1"
        assert os.readlink(tmp_path / "n2" / "opt" / "current") == "0.1.1"
        assert {n: _pids(final, n) for n in ("n1", "n2")} == pids  # the rolled-back agent adopted them again
        assert "this llmgw agent exits at start" in logs["n1"].read_text()
    finally:
        done.set()
        for node in ("n1", "n2"):  # the agent now running: the pid in its state directory's lock (a rollback
            lock = tmp_path / node / "state" / "agent.lock"  # starts a new process)
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        for shards in pids.values():
            for pid in shards.values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        kill_processes_naming(tmp_path)  # engines of a run that failed before `pids` was read (they outlive agents)
