"""From bare machines to a serving fleet, over real ssh, from a real signed release (the issue's scenario, each step
timed for docs/install.md): `llmgw server init` on host 1 and its control plane running there, `llmgw node add` of
hosts 2 and 3 (CPU nodes) waiting until each is connected and its engines installable, a real llama-server replica
of Gemma on each from the control plane's mirror, a request through host 1's gateway answered by host 3, then
`llmgw node remove host3` wiping it over its agent's own stream: its root as before `node add`.

The refusals and failures of `node add` are tests/install/test_node_add.py; a module of its own so that pytest-xdist
runs it beside them (a module runs whole on one worker)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.in_process_cli import completed

CHECKOUT = Path(__file__).resolve().parents[2]


def run_llmgw(*args: str) -> subprocess.CompletedProcess:
    """`llmgw ...` from this checkout as the operator runs it, in this process (support.in_process_cli: without a
    Python start); `node add` runs as processes of its own, two at once."""
    return completed(list(args), cwd=CHECKOUT)


def _host_pids(host, program: str) -> dict[int, int]:
    """The processes of the executable named `program` in `host`'s PID namespace (that of its sshd, from /proc): the
    pid that namespace gives each (its last NSpid) -> its pid here."""
    namespace, found = os.readlink(f"/proc/{host.pid}/ns/pid"), {}
    for entry in Path("/proc").iterdir():
        try:
            if (not entry.name.isdigit() or os.readlink(entry / "ns/pid") != namespace
                    or Path(os.readlink(entry / "exe")).name != program):
                continue
            status = (entry / "status").read_text()
        except OSError:  # gone meanwhile
            continue
        found[int(re.search(r"^NSpid:.*\s(\d+)$", status, re.MULTILINE)[1])] = int(entry.name)
    return found


GEMMA = "gemma-3-270m"
SHARE_CONTROL_PLANE = [sys.prefix, sys.base_prefix]
"""What host 1 sees of this machine: the test's venv and its Python, which run the control plane from this checkout's
source pushed to the host (tests/support/ssh_hosts.py `push_llmgw_source`, as tests/install/test_server_init.py)."""


def _seed(directory: Path, engines_mirror: Path, weights_mirror: Path) -> Path:
    """The settings `server init --from` seeds host 1's repository with: the example's, with engines.yaml's `mirror:`
    and agents/default.yaml's `mirrors:` naming the control plane's mirror (its engines and weights directories),
    Gemma at 2 replicas of 1.5 cores (so one fits a node: 2 cores less the 0.5 reserved), SmolLM2 at 0, the agents'
    heartbeat at 1 s and the settings polled every second."""
    seed = Path(shutil.copytree(CHECKOUT / "examples" / "cluster-repo", directory))
    edits = {
        "engines.yaml": [("/srv/llmgw/mirror/engines", str(engines_mirror))],
        "agents/default.yaml": [("mirrors: []", f"mirrors: [{engines_mirror}, {weights_mirror}]"),
                                ("heartbeat_interval: 5s", "heartbeat_interval: 1s")],
        f"catalog/{GEMMA}.yaml": [("\nreplicas: 1\n", "\nreplicas: 2\n"), ("  cpu_cores: 0.5\n", "  cpu_cores: 1.5\n")],
        "catalog/smollm2-135m-instruct.yaml": [("\nreplicas: 1\n", "\nreplicas: 0\n")],
        "llmgw.yaml": [("poll_interval: 2s", "poll_interval: 1s")],
    }
    for name, changes in edits.items():
        text = (seed / name).read_text()
        for old, new in changes:
            assert old in text, (name, old)
            text = text.replace(old, new)
        (seed / name).write_text(text)
    return seed


def _start_node_add(host, state: Path, release) -> subprocess.Popen:
    """`llmgw node add HOST` from this checkout against host 1's control plane, its output line by line."""
    return subprocess.Popen(
        [sys.executable, "-m", "llmgw.cli", "node", "add", host.name, "--ssh-config", str(host.ssh_config),
         "--release", str(release.directory), "--trusted-key", release.trusted_key, "--state", str(state),
         "--min-disk", "1Gi"],  # the host's root is a tmpfs
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=CHECKOUT,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)})


def test_bare_machines_to_a_serving_fleet_server_init_node_add_two_cpu_nodes_gemma_answered_by_host3_then_node_remove(
        ssh_hosts, full_release, llama_server_binary, gemma_gguf, tmp_path) -> None:
    """The issue's scenario, each step timed (docs/install.md): `server init` on host 1 and its control plane run
    there (as user llmgw, from this checkout's source: no systemd on the hosts); `node add` of hosts 2 and 3 at
    once from the signed release, each waiting until its node is connected and its engines installable (its agent
    reads the control plane's mirror: this machine's cached llama.cpp build and Gemma mirror, shown read-only on
    the hosts as an NFS export of the control plane's would be; never built per host); each node then runs a real
    llama-server replica of Gemma from that mirror, and the openai SDK's request through host 1's gateway is
    answered by the replica on host 3 (the response names it, the usage row on host 1 names host 3, and the engine
    runs in host 3's PID namespace). Then `llmgw node remove host3` drains it, its agent wipes the host over its own
    stream (no ssh) and stops, and it is forgotten: host 3's root is as it was before `node add`, its certificate
    revoked."""
    from openai import OpenAI

    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin
    from llmgw.wire import CertificateAuthority
    from support.ssh_hosts import SOURCE, push_llmgw_source
    from support.waiting import wait_for

    times: dict[str, float] = {}
    started = time.monotonic()
    engines_mirror = llama_server_binary.parents[3]  # <cache>/engines, holding llama.cpp/b11434/bin/llama-server
    weights_mirror = gemma_gguf.parents[1]  # <cache>/mirror, holding sha256/<digest>
    control, = ssh_hosts(1, share=SHARE_CONTROL_PLANE)
    node2, node3 = ssh_hosts(2, share=[str(engines_mirror), str(weights_mirror)])
    before = node3.snapshot()
    times["three hosts started"] = time.monotonic() - started

    # host 1: server init, then its control plane as init says to run it where systemd does not run
    started = time.monotonic()
    push_llmgw_source(control)
    control.ssh("chmod o+x /root")  # the user llmgw reaches the shared venv's Python under /root (a release is in /opt)
    seed = _seed(tmp_path / "seed", engines_mirror, weights_mirror)
    archive = subprocess.run(["tar", "-c", "-C", str(seed), "."], capture_output=True, check=True).stdout
    control.ssh("mkdir /tmp/seed && tar -x -C /tmp/seed", input=archive, text=False)
    llmgw = f"PYTHONPATH={SOURCE} {sys.prefix}/bin/llmgw"
    init = control.ssh(f"{llmgw} server init --from /tmp/seed --listen {control.address}")
    by_hand = init.stdout.split("Run the control plane by hand:\n", 1)[1].split("\n\n", 1)[0].strip()
    times["server init"] = time.monotonic() - started
    control.ssh(f"export PYTHONPATH={SOURCE}; ( {by_hand.replace(chr(10), ' ; ')} ) >/tmp/server.log 2>&1 &")
    state = control.root / "var" / "lib" / "llmgw" / "server"
    server_log = lambda: control.ssh("cat /tmp/server.log", check=False).stdout  # noqa: E731
    wait_for(lambda: (state / "admin-url").is_file(), 120, "the control plane on host 1", server_log)
    url, token = resolve_admin(None, None, state)
    with AdminClient(url, token, ca_file=admin_ca_file(state)) as admin:
        status = lambda: admin.get("/api/v1/status")  # noqa: E731
        wait_for(lambda: status()["control_plane"]["agents_port"], 60, "the admin API", server_log)
        times["server init to the control plane answering"] = time.monotonic() - started

        # hosts 2 and 3 at once
        started = time.monotonic()
        adds = {host.name: _start_node_add(host, state, full_release) for host in (node2, node3)}
        steps: dict[str, list[tuple[float, str]]] = {name: [] for name in adds}

        def follow(name: str) -> None:  # each line of its output with the time it came
            for line in adds[name].stdout:
                steps[name].append((time.monotonic() - started, line.rstrip("\n")))
        readers = [threading.Thread(target=follow, args=(name,)) for name in adds]
        for reader in readers:
            reader.start()
        outputs = {}
        for reader, (name, add) in zip(readers, adds.items()):
            reader.join(timeout=600)
            add.wait(timeout=60)
            outputs[name] = "\n".join(line for _, line in steps[name])
            times[f"node add {name}"] = time.monotonic() - started
        ends = [at for at, _ in steps[node3.name][1:]] + [times[f"node add {node3.name}"]]
        for (at, line), end in zip(steps[node3.name], ends):
            print(f"  {end - at:6.1f} s  {line}")  # how long each step of host 3's node add took
        for name, add in adds.items():
            agent_log = (node2 if name == node2.name else node3).ssh("cat /var/log/llmgw/agent.log", check=False)
            assert add.returncode == 0, outputs[name] + agent_log.stdout + server_log()
            lines = outputs[name].splitlines()
            assert f"[{name}] node {name} connected (connected); waiting until its engines are installable" in lines
            assert re.fullmatch(rf"node {name} connected and its engines installable: mirror {engines_mirror}: 0 "
                                rf"weights files, engines [^;]*llama\.cpp@b11434[^;]*; mirror {weights_mirror}: \d+ "
                                r"weights files?, engines none", lines[-1]), lines[-1]
        nodes = status()["nodes"]
        assert {node2.name, node3.name} <= set(nodes) and nodes[node3.name]["release_key"] == full_release.key_id

        # each node runs a replica of Gemma, from the mirror
        def placed() -> dict | None:
            replicas = {r: v for r, v in status()["replicas"].items() if v.get("model") == GEMMA}
            return replicas if len(replicas) == 2 and all(v.get("state") == "ready" for v in replicas.values()) \
                else None
        replicas = wait_for(placed, 180, "two Gemma replicas ready", lambda: f"{status()}\n{server_log()}")
        times["node add to both replicas ready"] = time.monotonic() - started
        assert {v["node"] for v in replicas.values()} == {node2.name, node3.name}, replicas
        on_host3, = [r for r, v in replicas.items() if v["node"] == node3.name]

        # a request through the gateway on host 1, answered by host 3's replica
        started = time.monotonic()
        key = admin.post("/api/v1/keys", {"project": "demo", "name": "scenario"})["key"]
        client = OpenAI(base_url=f"{status()['control_plane']['gateway_url']}/v1", api_key=key, max_retries=0,
                        timeout=120)
        answered = []
        for attempt in range(12):  # the router spreads requests over both replicas
            raw = client.chat.completions.with_raw_response.create(
                model=GEMMA, max_tokens=8, temperature=0, seed=1,
                messages=[{"role": "user", "content": f"Count to {attempt + 3}."}])
            answered.append(raw.headers["x-llmgw-replica"])
            if answered[-1] == on_host3:
                break
        assert answered[-1] == on_host3, answered
        answer = raw.parse()
        assert answer.usage.completion_tokens > 0, answer
        request_id = raw.headers["x-request-id"]
        read = (f"runuser -u llmgw -- env PYTHONPATH={SOURCE} {sys.prefix}/bin/python -c "
                "'import sys; from llmgw.store import open_store; "
                "r = open_store(\"/var/lib/llmgw/server/llmgw.sqlite3\").usage_of_request(sys.argv[1]); "
                "print(r.node, r.replica, r.model) if r else sys.exit(1)' " + request_id)
        usage = wait_for(lambda: (done := control.ssh(read, check=False)).returncode == 0 and done.stdout.split(),
                         30, "the request's usage row on host 1")
        assert usage == [node3.name, on_host3, GEMMA], usage
        times[f"requests until host 3 answered ({len(answered)})"] = time.monotonic() - started

    # the engine that answered is host 3's: in its PID namespace, run from its own disk under /var/lib/llmgw
    (engine_pid, _), = _host_pids(node3, "llama-server").items()
    engine = node3.ssh(f"readlink /proc/{engine_pid}/exe && tr '\\0' ' ' < /proc/{engine_pid}/cmdline").stdout
    assert engine.startswith("/var/lib/llmgw/engines/llama.cpp/b11434/bin/llama-server\n"), engine
    assert " /var/lib/llmgw/weights/" in engine, engine
    listed = run_llmgw("nodes", "--state", str(state))
    assert f"  llmgw 0.1.0, from a release signed by key {full_release.key_id}" in listed.stdout, listed.stdout
    refused = node3.ssh("/opt/llmgw/current/bin/llmgw wipe --yes", check=False)
    assert refused.returncode == 1 and "an llmgw agent runs here" in refused.stderr
    certificate = node3.ssh("cat /var/lib/llmgw/agent/tls/node.crt").stdout.encode()

    # node remove: drained (its replica has nowhere else to go: --force after 1 s), wiped over the agent's stream
    started = time.monotonic()
    removed = run_llmgw("node", "remove", node3.name, "--state", str(state), "--drain-timeout", "1", "--force",
                        "--author-name", "Ops", "--author-email", "ops@example.com")
    times["node remove host3"] = time.monotonic() - started
    assert removed.returncode == 0, removed.stdout + removed.stderr
    lines = removed.stdout.splitlines()
    assert lines[0].startswith(f"[{node3.name}] drained (settings at ")
    listed = [re.fullmatch(rf"\[{node3.name}\] /var/lib/llmgw-install/journal.json lists (\d+) things llmgw made on "
                           r"this machine \(newest first\):", line) for line in lines]
    listed = next(match for match in listed if match)
    assert lines[-2] == f"[{node3.name}] wiped: {listed[1]} removed or restored, 0 already gone; no journal left", lines
    assert lines[-1].startswith(f"node {node3.name} removed: 1 certificate revoked, node secret forgotten; ")
    # the agent stops itself once it answered (its stream ends, then the process): no process of llmgw's is left
    wait_for(lambda: not _host_pids(node3, "llama-server") and not _host_pids(node3, "python3.11"), 30,
             "the agent and its engine on host 3 to end", lambda: str(_host_pids(node3, "python3.11")))
    assert node3.snapshot() == before
    with AdminClient(url, token, ca_file=admin_ca_file(state)) as admin:
        assert node3.name not in admin.get("/api/v1/status")["nodes"]
    assert CertificateAuthority.load_or_create(state / "ca").is_certificate_revoked(certificate)
    for step, seconds in times.items():
        print(f"{step}: {seconds:.1f} s")
