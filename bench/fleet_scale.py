"""How many agents one control plane holds: simulated nodes over real gRPC streams to a real `llmgw server`.

For each fleet size (`--agents 250,500,1000,2000`) the script makes a settings repository (`llmgw repo init` from a
seed tree, tests/support/settings_seed.py: SQLite store, GPU models `base`, `base1`, ... with 2 replicas per node in
all), starts a mock engine (bench/gateway_overhead.py's) and `llmgw server` (with its gateway) each in its own
process, and `--procs` processes of bench/fleet_sim.py holding the nodes (each on its own stream, as `llmgw agent`:
8 H200 cards, readings varied per beat, a heartbeat every `--interval` s, every shard reporting the mock engine's
port). Once every node registered and the fleet converged it measures, over `--duration` seconds of steady
heartbeats (longer when needed so that the server's latest 4,096 latencies all fall inside the window):

- the control plane's CPU share (utime+stime of /proc/<pid>/stat over wall time; 1.0 = one core) and resident
  memory (VmRSS of /proc/<pid>/status);
- heartbeat latency p50/p99: from the agent's send (`Heartbeat.time`) to the control loop folding it, as the
  control plane counts it (`control_plane.load` of /api/v1/status; the latest 4,096 beats);
- the last reconcile pass's duration (`decide`'s wall time) and passes/s;
- routing-table builds per second;
- the gateway's added latency p50/p99 (one keep-alive client through the gateway to the mock engine minus the same
  client straight to it, `--gateway-seconds` each), under that load;

then commits models `roll0`, `roll1`... with `--roll` replicas in all (1 GPU each; default 2,000, at most 6 per
node) and times how long the fleet takes to converge to it (the pass reports converged); last, the gateway's added
latency again with every agent stopped (SIGSTOP: idle). Prints one table; asserts no timings.
`--quick`: 50 agents, 20 s, 300 roll-out replicas (tests/control/test_fleet_scale.py runs it, with a 2 s window,
1 s heartbeats and 1 s of gateway requests: that the benchmark runs, not its figures).
`--tls`: agents connect with mutual TLS (certificates issued by the server's CA before the agents start).
`--no-gateway`: the server without its gateway (no gateway figures). `--roll 0`: no roll-out.

Measured (issue 18, 2026-12-01, 2 cores shared with the agents' processes and other work; `--procs 4 --roll 2000
--gateway-seconds 2`, load average at start / end; docs/scale.md has the runs and their profiles):

    agents  join s   cpu  rss MiB  hb p50/p99 ms   gw+ p50/p99 load, idle   roll s (cpu s)  load
      1000    31.2  0.48      247    2.5 / 464      3.5/25.7, 4.6/47.5        36.2 (27.4)   8.8 / 13.5
      2000    91.9  0.76      412    6.9 / 919      7.2/45.0, 4.1/19.1        47.7 (42.0)   7.9 / 8.7
      2000    82.5  0.74      418    4.1 / 1,018    8.4/32.6, 7.2/214         68.7 (56.1)   5.0 / 10.9

Targets at 2,000 agents: <= 1 core and <= 1 GiB (met), roll-out <= 60 s (met in one run of three), heartbeat
p99 <= 100 ms and gateway added latency within 20% of idle (not met on this machine: docs/scale.md says why).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from settings_seed import git, write_seed  # noqa: E402  (the control plane's tests seed from it too)

import gateway_overhead as overhead  # noqa: E402  (its mock engine and load generator)
PYTHON = sys.executable
LLMGW = str(Path(sys.executable).parent / "llmgw")  # the console script (llmgw.cli.main has no __main__ guard)
TICK = os.sysconf("SC_CLK_TCK")

MODEL_YAML = """\
name: {name}
engine: llama.cpp
engine_version: b11434
weights:
  - source: https://example.invalid/{name}/{name}.gguf
    sha256: {sha}
replicas: {replicas}
resources:
  gpus: 1
  gpu_class: h200-141g
  gpu_memory: 40Gi
  cpu_cores: 1
  memory: 8Gi
context_size: 4096
"""

CHAT = json.dumps({"model": "base", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "Say ok eight times, please."}]}).encode()


def make_repo(work: Path, agents: int, interval: float) -> tuple[Path, Path]:
    """A bare settings repository (`llmgw repo init`) and a clone to commit to: (repo, clone)."""
    total = 2 * agents  # a model has at most 1,024 replicas: "base" holds the first 1,000, "base1"... the rest
    seed = write_seed(work / "seed", "base", MODEL_YAML.format(name="base", sha="a" * 64, replicas=min(1000, total)),
                      name="scale", poll="1s", interval="10s", lost="30s", action_timeout="60s",
                      heartbeat=f"{interval:g}s")
    for part, first in enumerate(range(1000, total, 1000), start=1):
        (seed / "catalog" / f"base{part}.yaml").write_text(
            MODEL_YAML.format(name=f"base{part}", sha="a" * 64, replicas=min(1000, total - first)))
    repo = work / "settings.git"
    subprocess.run([LLMGW, "repo", "init", str(repo), "--from", str(seed)], check=True,
                   capture_output=True)
    clone = work / "clone"
    git("clone", "-q", str(repo), str(clone), cwd=work)
    return repo, clone


def proc_figures(pid: int) -> tuple[float, int]:
    """(CPU seconds used, resident bytes) of process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return cpu, rss


class Admin:
    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def status(self) -> dict:
        request = urllib.request.Request(self.url + "/api/v1/status", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.load(answer)


def start_server(work: Path, repo: Path, tls: bool, gateway: bool) -> tuple[subprocess.Popen, Admin, int, int]:
    """`llmgw server`, with its gateway or not: (process, admin API, agents' port, gateway's port or 0)."""
    state = work / "state"
    argv = [LLMGW, "server", "--repo", str(repo), "--state", str(state)]
    if tls:
        argv.append("--tls")
    if not gateway:
        argv.append("--no-gateway")
    server = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=work)
    admin_url, port, gateway_port = "", 0, 0
    assert server.stderr is not None
    for line in server.stderr:
        if line.startswith("admin API"):
            admin_url = line.split()[2]
        if line.startswith("gateway"):
            gateway_port = int(line.split()[1].rsplit(":", 1)[1].split("/")[0])
        if line.startswith("agents"):
            port = int(line.split()[2])
            break
    if not port:
        raise SystemExit(f"llmgw server did not start: {server.stderr.read()}")
    shutil_drain(server, work / "server.log")
    return server, Admin(admin_url, (state / "admin-token").read_text().strip()), port, gateway_port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gateway_added(gateway_port: int, key: str, engine_port: int, engine_pid: int, server_pid: int,
                  seconds: float) -> tuple[float, float, int]:
    """(added p50 ms, added p99 ms, errors): one keep-alive client through the gateway to the mock engine, minus the
    same client straight to the engine, `seconds` each (bench/gateway_overhead.py's load generator)."""
    path = b"/v1/chat/completions"
    through = overhead.measure(gateway_port, path, key, 1, seconds, server_pid, CHAT)
    direct = overhead.measure(engine_port, path, "engine-key", 1, seconds, engine_pid, CHAT)
    return through["p50"] - direct["p50"], through["p99"] - direct["p99"], through["errors"]


def shutil_drain(process: subprocess.Popen, log: Path) -> None:
    """Keep copying the server's stderr to `log` in a thread so it never blocks on a full pipe."""
    import threading

    def drain() -> None:
        assert process.stderr is not None
        with log.open("a") as out:
            for line in process.stderr:
                out.write(line)
                out.flush()

    threading.Thread(target=drain, daemon=True).start()


def issue_certificates(work: Path, agents: int) -> Path:
    """Node certificates for sim00000.. signed by the server's CA (as Join would), in one directory."""
    from llmgw.wire import CertificateAuthority
    from llmgw.wire.tls import make_key_and_csr

    ca = CertificateAuthority.load_or_create(work / "state" / "ca")
    out = work / "tls"
    out.mkdir()
    (out / "ca.pem").write_bytes(ca.certificate_pem)
    for n in range(agents):
        node = f"sim{n:05d}"
        key, csr = make_key_and_csr(node)
        (out / f"{node}.pem").write_bytes(ca.sign_csr(csr, node))
        (out / f"{node}.key").write_bytes(key)
    return out


def summary(doc: dict) -> str:
    """Node states, replica states, failures and the last pass of a status document, in one line."""
    from collections import Counter

    nodes = Counter(n.get("state") for n in doc.get("nodes", {}).values())
    replicas = Counter((r.get("model"), r.get("state", "?"), "unplaced" in r) for r in doc.get("replicas", {}).values())
    return (f"nodes {dict(nodes)}; replicas {dict(replicas)}; failures {doc.get('failures', [])[:3]}; "
            f"last pass {doc.get('pass')}")


def wait_for(condition, timeout: float, what: str, admin: Admin, every: float = 1.0) -> dict:
    """Poll the status document every `every` seconds until `condition(doc)`; SystemExit after `timeout` seconds.
    (The whole document costs the server about 1.6 ms per node here: poll a large fleet less often.)"""
    deadline = time.monotonic() + timeout
    while True:
        doc = admin.status()
        if condition(doc):
            return doc
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g} s waiting for {what}: {summary(doc)}")
        time.sleep(every)


def converged_to(commit: str | None, agents: int):
    def check(doc: dict) -> bool:
        nodes = doc.get("nodes", {})
        connected = sum(1 for n in nodes.values() if n.get("state") == "connected")
        last = doc.get("pass") or {}
        return (len(nodes) >= agents and connected >= agents and bool(last.get("converged"))
                and (commit is None or last.get("settings_commit") == commit))
    return check


def measure(agents: int, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"fleet-scale-{agents}-"))
    sims: list[subprocess.Popen] = []
    server = None
    engine_port = free_port()
    engine = subprocess.Popen([PYTHON, str(ROOT / "bench" / "gateway_overhead.py"), "mock", str(engine_port)])
    try:
        repo, clone = make_repo(work, agents, args.interval)
        server, admin, port, gateway_port = start_server(work, repo, args.tls, not args.no_gateway)
        tls_dir = issue_certificates(work, agents) if args.tls else None
        started = time.monotonic()
        per = -(-agents // args.procs)
        for first in range(0, agents, per):
            argv = [PYTHON, str(ROOT / "bench" / "fleet_sim.py"), "--address", f"127.0.0.1:{port}", "--first",
                    str(first), "--count", str(min(per, agents - first)), "--interval", str(args.interval),
                    "--engine-port", str(engine_port)]
            if args.stagger:
                argv += ["--stagger", str(args.stagger)]
            if args.agent_keepalive:
                argv += ["--keepalive", str(args.agent_keepalive)]
            if tls_dir:
                argv += ["--tls-dir", str(tls_dir)]
            sims.append(subprocess.Popen(argv, stdout=(work / f"sim-{first}.log").open("w"), stderr=subprocess.STDOUT,
                                         cwd=work))
        doc = wait_for(converged_to(None, agents), args.timeout, f"{agents} nodes registered and converged", admin,
                       max(1.0, agents / 200))
        initial = time.monotonic() - started
        time.sleep(args.interval)  # let every node beat once more before the window
        # The server keeps the latest 4,096 heartbeat latencies: the window is long enough that all of them are
        # steady-state beats, none from joining and the first roll-out.
        duration = args.duration if args.quick else max(args.duration, 1.1 * 4096 * args.interval / agents)
        doc0, cpu0, t0 = admin.status(), *proc_figures(server.pid)[:1], time.monotonic()
        time.sleep(duration)
        cpu1, rss = proc_figures(server.pid)
        t1 = time.monotonic()
        doc1 = admin.status()
        load0, load1 = doc0["control_plane"]["load"], doc1["control_plane"]["load"]
        window = t1 - t0
        steady = {
            "cpu": (cpu1 - cpu0) / window,
            "rss_mib": rss / 1024**2,
            "hb_p50_ms": (load1["heartbeat_latency_p50"] or 0) * 1000,
            "hb_p99_ms": (load1["heartbeat_latency_p99"] or 0) * 1000,
            "pass_ms": (doc1.get("pass") or {}).get("duration", 0) * 1000,
            "passes_s": (load1["passes"] - load0["passes"]) / window,
            "tables_s": (load1["table_rebuilds"] - load0["table_rebuilds"]) / window,
            "folds_s": (load1["folded"] - load0["folded"]) / window,
        }
        print(f"steady state: {json.dumps({k: round(v, 3) for k, v in steady.items()})}", file=sys.stderr, flush=True)
        from llmgw.store import open_store, store_url_for_state

        nan = float("nan")
        figures = ()
        steady["gw_load_p50"] = steady["gw_load_p99"] = steady["gw_idle_p50"] = steady["gw_idle_p99"] = nan
        errors = 0
        if gateway_port:
            key = open_store(store_url_for_state(str(work / "state"))).create_api_key("demo")[1]
            time.sleep(2.0)  # the gateway reads new keys from the store
            figures = (gateway_port, key, engine_port, engine.pid, server.pid, args.gateway_seconds)
            steady["gw_load_p50"], steady["gw_load_p99"], errors = gateway_added(*figures)
        result = {"agents": agents, "initial_s": initial, **steady, "roll": 0, "rollout_s": 0.0,
                  "rollout_cpu_s": 0.0, "roll_seen": 0, "tls": args.tls}
        roll = min(args.roll, 6 * agents)
        if roll:
            result.update(roll_out(roll, clone, server, admin, agents, args))
        if figures:
            for sim in sims:  # idle: the agents stop (SIGSTOP: their streams stay open, nothing changes)
                sim.send_signal(signal.SIGSTOP)
            time.sleep(1.0)
            result["gw_idle_p50"], result["gw_idle_p99"], idle_errors = gateway_added(*figures)
            result["gw_errors"] = errors + idle_errors
        return result
    finally:
        for sim in sims:
            sim.send_signal(signal.SIGKILL)
        if server is not None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
        for sim in sims:
            sim.wait()
        engine.kill()
        engine.wait()
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def roll_out(roll: int, clone: Path, server: subprocess.Popen, admin: Admin, agents: int,
             args: argparse.Namespace) -> dict:
    """Commit `roll` more replicas (1 GPU each) and wait until the fleet converged to that commit: seconds, the
    server's CPU seconds meanwhile, and how many of them the status document shows."""
    for part, first in enumerate(range(0, roll, 1000)):  # a model has at most 1,024 replicas
        (clone / "catalog" / f"roll{part}.yaml").write_text(
            MODEL_YAML.format(name=f"roll{part}", sha="b" * 64, replicas=min(1000, roll - first)))
    git("add", "-A", cwd=clone)
    git("commit", "-qm", f"roll out {roll} replicas", cwd=clone)
    clock = time.monotonic()
    cpu_roll0 = proc_figures(server.pid)[0]
    git("push", "-q", "origin", "HEAD:main", cwd=clone)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    done = wait_for(converged_to(commit, agents), args.timeout, f"the roll-out of {roll} replicas", admin,
                    max(1.0, agents / 200))
    rollout = time.monotonic() - clock
    cpu_roll = proc_figures(server.pid)[0] - cpu_roll0
    ready = sum(1 for r in done.get("replicas", {}).values()
                if isinstance(r, dict) and str(r.get("model")).startswith("roll"))
    return {"roll": roll, "rollout_s": rollout, "rollout_cpu_s": cpu_roll, "roll_seen": ready}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", default="250,500,1000,2000", help="fleet sizes, comma-separated")
    parser.add_argument("--procs", type=int, default=4, help="processes of simulated agents")
    parser.add_argument("--interval", type=float, default=5.0, help="heartbeat interval, seconds")
    parser.add_argument("--duration", type=float, default=None,
                        help="steady-state window, seconds [default: 30; 20 with --quick]")
    parser.add_argument("--roll", type=int, default=2000, help="replicas of the roll-out commit (<= 6 per node; "
                        "0: no roll-out)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each convergence")
    parser.add_argument("--tls", action="store_true", help="agents over mutual TLS")
    parser.add_argument("--stagger", type=float, default=0.0,
                        help="seconds between two nodes' connects in each agent process (0: fleet_sim's 5 ms)")
    parser.add_argument("--agent-keepalive", type=float, default=0.0,
                        help="an experiment: seconds between the simulated agents' keepalive pings (0: 2 s, as agents)")
    parser.add_argument("--no-gateway", action="store_true", help="the server without its gateway")
    parser.add_argument("--gateway-seconds", type=float, default=3.0,
                        help="seconds of gateway (and direct) requests under load and idle")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (server.log, sim-*.log)")
    parser.add_argument("--quick", action="store_true",
                        help="50 agents, 2 processes, 300 replicas, a 20 s window unless --duration says otherwise")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.procs, args.roll = "50", 2, 300
    if args.duration is None:
        args.duration = 20.0 if args.quick else 30.0
    print(f"{'agents':>6} {'tls':>3} {'join s':>7} {'cpu':>5} {'rss MiB':>7} {'hb p50 ms':>9} {'hb p99 ms':>9} "
          f"{'pass ms':>7} {'pass/s':>6} {'tables/s':>8} {'folds/s':>7} {'gw+ p50/p99 load':>16} {'gw+ p50/p99 idle':>16} "
          f"{'roll':>5} {'roll s':>6} {'roll cpu s':>10}",
          flush=True)
    for size in (int(a) for a in args.agents.split(",")):
        r = measure(size, args)
        print(f"{r['agents']:>6} {'on' if r['tls'] else 'off':>3} {r['initial_s']:>7.1f} {r['cpu']:>5.2f} "
              f"{r['rss_mib']:>7.0f} {r['hb_p50_ms']:>9.1f} {r['hb_p99_ms']:>9.1f} {r['pass_ms']:>7.1f} "
              f"{r['passes_s']:>6.2f} {r['tables_s']:>8.2f} {r['folds_s']:>7.1f} "
              f"{r['gw_load_p50']:>7.2f}/{r['gw_load_p99']:<8.2f} {r['gw_idle_p50']:>7.2f}/{r['gw_idle_p99']:<8.2f} "
              f"{r['roll']:>5} {r['rollout_s']:>6.1f} "
              f"{r['rollout_cpu_s']:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
