"""`llmgw upgrade --control-plane host1 --control-plane host2` over real ssh (issue 30): two control planes on one
PostgreSQL, the leader on host 1 and a standby on host 2 added by `llmgw server add`, an agent on host 3 joined with
mutual TLS serving "tiny" (the llama-server stand-in), and 16 openai SDK clients asking through haproxy in front of
both gateways throughout. The command upgrades the standby first, then the leader (which hands over to the upgraded
standby as it restarts), then runs the agents' rollout on the new leader's host; no request fails, every answered
request is billed once, every host runs the new release from /opt/llmgw/current and the engine keeps its pid. Before
that, `llmgw server upgrade host2` with a confirmation timeout of 1 s (no control plane starts that fast): not back
in time, it is switched back to the release it ran and serves again, the command fails saying so, and the upgrade
after it keeps the venv that try installed (the same signed release) instead of installing it again.

Hosts 1 and 3 get the 0.1.0 release by hand, as docs/install.md installs the first control plane (a venv in
/opt/llmgw/0.1.0, `current` linked to it): here the venv is a copy of the dependencies' venv kept on disk
(support.releases) with llmgw's wheel installed into it by pip offline, seconds instead of a minute. Host 2 gets
it from `server add`, and every upgrade installs with pip offline on the host, as on a real machine. The 0.1.1
release is the run's 0.1.0 release with llmgw's wheel raised to 0.1.1 and signed again (support.releases'
`raised_release`: the same code, told apart by its version), not a wheel built again from a copy of the checkout.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
import time
from pathlib import Path

import psycopg
import pytest

from llmgw.settings import init_repository
from support.control_plane_hosts import (
    STATE, admin_status, forwarded_postgres, give_lab_ssh, health, push_files, serve_settings, start_on,
)
from support.haproxy import start_haproxy, stop_clients_and_proxy
from support.postgres import postgres_schema, schema_url
from support.releases import dependency_venv, raised_release
from support.sdk_clients import CLIENT_ROWS, SdkClients, billing_problems
from support.settings_seed import TINY_YAML, write_seed
from support.ssh_hosts import SshHost
from support.stand_ins import python_tool
from support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
NEW = "0.1.1"
OPT = "/opt/llmgw"
LLMGW = f"{OPT}/current/bin/llmgw"
AGENT_STATE = "/var/lib/llmgw/agent"
WEIGHTS = b"GGUF stand-in weights for the control planes' upgrade\n"


CLIENT_THINK = 1.0
"""Seconds each of the 16 clients waits after an answer (`SdkClients`' think time): they ask throughout the upgrade's
two to three minutes, and at 1 s there are still about 16 requests a second in flight through every restart and
the handover; at `THINK_TIME`'s 0.25 s they sent about 9,000 requests a run, through haproxy, a gateway and the
stand-in engine each, most of this module's CPU (docs/testing.md)."""

def _seed(directory: Path, trusted_key: str) -> Path:
    """The settings: "tiny" for the project demo, the listeners on the default ports (8080-8082), a node lost after
    30 s (agents and control planes restart during the upgrade), the release key trusted."""
    seed = write_seed(directory, "tiny", TINY_YAML.format(sha=hashlib.sha256(WEIGHTS).hexdigest(), replicas=1),
                      lost="30s",
                      poll="1s")
    text = (seed / "llmgw.yaml").read_text()
    for name, port in (("gateway", 8080), ("admin", 8081), ("agents", 8082)):
        text = text.replace(f"  {name}: {{host: 127.0.0.1, port: 0}}", f"  {name}: {{host: 0.0.0.0, port: {port}}}")
    (seed / "llmgw.yaml").write_text(text + f"releases:\n  trusted_keys:\n    - {trusted_key}\n")
    return seed


def _install_by_hand(host: SshHost, release: Path, venv: Path) -> None:
    """llmgw 0.1.0 in /opt/llmgw/0.1.0 with /opt/llmgw/current linked to it (docs/install.md's first control plane),
    the venv a copy of `venv` (the dependencies, shown read-only) with llmgw's wheel installed offline."""
    host.ssh(f"mkdir -p {OPT} && cp -a {venv} {OPT}/0.1.0 && {OPT}/0.1.0/bin/python -m pip install --quiet "
             f"--no-index --no-deps --disable-pip-version-check --find-links {release}/wheels llmgw==0.1.0 && "
             f"ln -s 0.1.0 {OPT}/current && chmod o+x /root", timeout=300)


def _llmgw(host: SshHost, args: str, timeout: float = 180) -> str:
    done = host.ssh(f"{LLMGW} {args}", check=False, timeout=timeout)
    assert done.returncode == 0, f"llmgw {args} on {host.name}: {done.stdout}{done.stderr}"
    return done.stdout


def _engine_pids(status: dict) -> dict[str, int]:
    return {shard: s["pid"] for shard, s in status["nodes"]["n1"]["shards"].items() if not s.get("foreign")}


@pytest.mark.slow
def test_llmgw_upgrade_takes_the_standby_then_the_leader_then_the_agents_over_ssh_and_loses_no_request(
        ssh_hosts, netns_lab, full_release, tmp_path) -> None:
    timings: dict[str, float] = {}
    began = time.monotonic()
    new = raised_release(full_release.directory, tmp_path / f"release-{NEW}", full_release.secret_key, NEW)
    timings[f"release {NEW} built"] = time.monotonic() - began
    share = tmp_path / "share"
    (share / "mirror" / "sha256").mkdir(parents=True)
    (share / "mirror" / "sha256" / hashlib.sha256(WEIGHTS).hexdigest()).write_bytes(WEIGHTS)
    for name in ("fake_llama_server.py", "fake_llama_dialects.py"):
        shutil.copy2(ROOT / "tests" / "support" / name, share / name)
    engine = python_tool(share / "fake-llama-server", share / "fake_llama_server.py")
    seed = _seed(tmp_path / "seed", full_release.trusted_key)
    init_repository(tmp_path / "check.git", seed)  # the seed is valid settings (a clear failure here, not on a host)
    venv = dependency_venv()
    root = netns_lab.join_root()
    hosts = ssh_hosts(3, share=[sys.prefix, sys.base_prefix, str(full_release.directory.parent), str(share),
                                str(venv)])
    one, two, three = hosts
    proxy, clients = None, None
    with forwarded_postgres(root) as base, postgres_schema() as schema:
        store_url = schema_url(schema, base)
        try:
            # host 1: 0.1.0 by hand, `server init` with the shared store, the control plane started as init says
            began = time.monotonic()
            for host in (one, three):
                _install_by_hand(host, full_release.directory, venv)
            timings["0.1.0 on hosts 1 and 3 by hand"] = time.monotonic() - began
            one.ssh("mkdir -p /tmp/seed && tar -x -C /tmp/seed", input=_tar_of(seed), text=False)
            init = _llmgw(one, f"server init --from /tmp/seed --store {shlex.quote(store_url)}")
            by_hand = init.split("Run the control plane by hand:\n", 1)[1].split("\n\n", 1)[0].strip()
            assert LLMGW in by_hand, by_hand
            start_on(one, by_hand.replace("\n", " ; "), "/var/log/llmgw-server.log")
            ca = one.root / STATE.lstrip("/") / "ca" / "ca.crt"
            wait_for(lambda: (health(one.address, ca) or {}).get("leader"), 90, "host 1 to lead",
                     lambda: one.ssh("cat /var/log/llmgw-server.log").stdout)

            # host 2: a standby, added by `server add` run on host 1 from its release
            lab_ssh, repo_url = give_lab_ssh(one), serve_settings(one)
            began = time.monotonic()
            _llmgw(one, f"server add {two.name} --ssh-config {lab_ssh} --release {full_release.directory} "
                        f"--trusted-key {shlex.quote(full_release.trusted_key)} --state {STATE} --repo-url {repo_url} "
                        f"--address {two.address}", timeout=300)
            timings["server add host2"] = time.monotonic() - began

            # host 3: an agent of 0.1.0 joined over mutual TLS, dialling both control planes
            grant = json.loads(_llmgw(one, f"join-token --state {STATE} --json --ca-out /tmp/ca.crt"))
            push_files(three, "/tmp/join", {"ca.crt": ca.read_bytes()})
            _llmgw(three, f"node join --control-plane {one.address}:{grant['join_port']} --token {grant['token']} "
                          f"--ca-file /tmp/join/ca.crt --node-id n1 --state-dir {AGENT_STATE}")
            start_on(three, f"exec {LLMGW} agent --state-dir {AGENT_STATE} --control-plane {one.address}:8082 "
                            f"--control-plane {two.address}:8082 --node-id n1 --mirror {share / 'mirror'} "
                            f"--engine-binary llama.cpp@b11434={engine} --no-bandwidth-probe",
                     "/var/log/llmgw-agent.log")

            def agent_log() -> str:
                return three.ssh("tail -30 /var/log/llmgw-agent.log", check=False).stdout

            def serving(host: SshHost) -> bool:
                doc = admin_status(host, host.address)
                return doc["replicas"]["tiny-0"]["state"] == "ready" and doc["nodes"]["n1"]["state"] == "connected"

            for host in (one, two):
                wait_for(lambda h=host: serving(h), 120, f"tiny-0 ready as {host.name} sees it", agent_log)
            before = admin_status(one, one.address)
            pids = _engine_pids(before)
            assert before["nodes"]["n1"]["agent_version"] == "0.1.0" and len(pids) == 1
            key = next(w for w in _llmgw(one, f"keys create --project demo --state {STATE}").split()
                       if w.startswith("sk-llmgw-"))
            proxy, front = start_haproxy(tmp_path, [f"http://{h.address}:8080" for h in (one, two)])
            clients = SdkClients(f"{front}/v1", key, 16, think=CLIENT_THINK, model="tiny", max_tokens=8).start()
            clients.answers_after(32, 60, "through haproxy before the upgrade")

            # host 2 alone, not given time to come back: switched back to 0.1.0, serving, the command failing
            began = time.monotonic()
            failed = _run_llmgw("server", "upgrade", two.name, "--release", str(new), "--trusted-key",
                                full_release.trusted_key, "--ssh-config", str(one.ssh_config), "--confirm-timeout", "1s")
            timings["server upgrade of host 2 not back within 1 s, switched back"] = time.monotonic() - began
            print(failed.stdout + failed.stderr)
            assert failed.returncode == 1, failed.stdout + failed.stderr
            assert (f"the control plane on {two.name} did not answer with llmgw {NEW} within 1 s" in failed.stderr
                    and "it runs llmgw 0.1.0 again. Its log ends: " in failed.stderr), failed.stderr
            assert two.ssh(f"readlink {OPT}/current").stdout.strip() == "0.1.0"
            assert admin_status(two, two.address)["control_plane"]["version"] == "0.1.0"
            installed = two.ssh(f"stat -c %Y.%i {OPT}/{NEW}/release/manifest.json").stdout.strip()
            clients.answers_after(32, 60, "after the switch back")

            # the upgrade, from the operator's machine (here the test's), over ssh to every host
            began = time.monotonic()
            done = _run_upgrade(new, full_release.trusted_key, one.ssh_config, one.name, two.name)
            timings["llmgw upgrade (two control planes, one agent)"] = time.monotonic() - began
            print(done.stdout)
            assert done.returncode == 0, done.stdout + done.stderr + agent_log() + "".join(
                h.ssh("tail -40 /var/log/llmgw/server.log", check=False).stdout for h in (one, two))
            lines = done.stdout.splitlines()
            first = next(i for i, line in enumerate(lines) if "upgrading the control plane" in line)
            assert lines[first].startswith(f"[{two.name}] upgrading the control plane (stands by) from llmgw 0.1.0 "
                                           f"to {NEW}"), lines[first]
            leader_line = next(i for i, line in enumerate(lines)
                               if line.startswith(f"[{one.name}] upgrading the control plane (leads: last)"))
            assert leader_line > next(i for i, line in enumerate(lines)
                                      if line.startswith(f"[{two.name}] control plane back with llmgw {NEW}"))
            assert f"control planes on llmgw {NEW}; {two.name} leads" in done.stdout
            assert f"upgrade to llmgw {NEW} done" in done.stdout
            clients.answers_after(32, 60, "after the upgrade")
            after = admin_status(two, two.address)
            # host 2's venv of the try switched back was kept, not made again
            assert two.ssh(f"stat -c %Y.%i {OPT}/{NEW}/release/manifest.json").stdout.strip() == installed
        finally:
            stop_clients_and_proxy(clients, proxy)
            print("; ".join(f"{what} {seconds:.1f} s" for what, seconds in timings.items()))
        with psycopg.connect(schema_url(schema), autocommit=True) as conn:
            rows = list(conn.execute(CLIENT_ROWS))
        print(f"through the upgrade: {clients.figures()}; {len(rows)} usage rows")
        assert not clients.failed, (clients.figures(), clients.failed[:5])
        problems = billing_problems(clients, rows)
        assert not problems, problems[:10]
        assert after["control_plane"]["leader"] and after["control_plane"]["version"] == NEW
        standby = admin_status(one, one.address)["control_plane"]
        assert not standby["leader"] and standby["version"] == NEW
        assert after["nodes"]["n1"]["agent_version"] == NEW
        assert _engine_pids(after) == pids  # the engine kept serving through the agent's re-execution
        for host in hosts:
            assert host.ssh(f"readlink {OPT}/current").stdout.strip() == NEW, host.name


def _tar_of(directory: Path) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(directory, arcname=".")
    return buffer.getvalue()


def _run_llmgw(*args: str):
    """`llmgw ARGS` from this checkout, as the operator runs it on their machine."""
    import os
    import subprocess

    return subprocess.run([sys.executable, "-m", "llmgw.cli", *args], capture_output=True, text=True, timeout=900,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _run_upgrade(release: Path, key: str, ssh_config: Path, *planes: str):
    return _run_llmgw("upgrade", str(release), "--trusted-key", key, "--ssh-config", str(ssh_config),
                      *[a for plane in planes for a in ("--control-plane", plane)], "--confirm-timeout", "120s")
