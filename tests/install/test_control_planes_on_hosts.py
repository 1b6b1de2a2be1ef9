"""Control planes on hosts of their own over real ssh (issue 28): `llmgw server init` on host 1 (its defaults:
`--listen 0.0.0.0`, no `--tls-hostname`) on the machine's PostgreSQL, an agent on host 3 joined to it with mutual
TLS across hosts, `llmgw server add host2` run on host 1 from a signed release, SIGKILL of host 1's control plane:
host 2 leads and its gateway takes the API key made on host 1. Then `llmgw backup` on host 1, hosts 1 and 2 lost,
`llmgw restore` on a fresh host 4 that takes host 1's address: the agent reconnects to it with the certificate it
had (no new join), and the key and the usage row are in the restored store (`llmgw keys list`, `llmgw usage`).

Hosts 1, 3 and 4 run this checkout's llmgw from its source with the test's venv shown read-only (as
tests/install/test_server_init.py); host 2 gets the signed release with its dependency wheels, installed by
`server add`. The commands whose answers it reads (`keys create`, `join-token`, `keys list`, `usage`, `status`,
the second `restore`'s refusal) run in the test's process on the host's state directory (no Python start on the
host); `server init`, `node join`, `server add`, `backup` and `restore` run on the hosts. PostgreSQL (127.0.0.1:5432
of the root namespace) is reached from the hosts through a forwarder on the lab's root address (DESIGN.md, "Known
traps"), in schemas of the test's own. The settings repository is the one
`server init` made on host 1, which host 2 fetches from `git daemon` there (`--repo-url git://...`).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import httpx

from llmgw.store import UsageRecord, open_store
from support.control_plane_hosts import (
    STATE, admin_status, forwarded_postgres, give_lab_ssh, health, push_files, serve_settings, start_on,
)
from support.in_process_cli import run_llmgw
from support.postgres import postgres_schema, schema_url
from support.ssh_hosts import SOURCE, SshHost, push_llmgw_source
from support.waiting import wait_for

AGENT_STATE = "/var/lib/llmgw-agent"
LLMGW = f"PYTHONPATH={SOURCE} {sys.prefix}/bin/llmgw"


def _llmgw(host: SshHost, args: str, timeout: float = 120) -> str:
    """Run `llmgw ARGS` on `host` as root; its stdout. Fails the test with its output when it fails."""
    done = host.ssh(f"{LLMGW} {args}", check=False, timeout=timeout)
    assert done.returncode == 0, f"llmgw {args} on {host.name}: {done.stdout}{done.stderr}"
    return done.stdout


def _here(host: SshHost, address: str, args: list[str]) -> str:
    """Run `llmgw ARGS --state S` in the test's process (support.in_process_cli: no Python start on the host), S the
    control plane's state directory on `host` as this machine sees it (the host's root), its admin API at `address`
    (its admin-url names 127.0.0.1, as the host reaches it): for the commands whose answers this test reads (keys,
    join tokens, usage, status), which reach the store and the admin API as from the host; their stdout. Fails the
    test with their output when they fail."""
    code, out, err = run_llmgw([*args, "--state", str(host.root / STATE.lstrip("/"))],
                               env={"LLMGW_ADMIN_URL": f"https://{address}:8081"})
    assert code == 0, f"llmgw {' '.join(args)} for {host.name}: {out}{err}"
    return out


def _connected(host: SshHost, address: str) -> bool:
    node = admin_status(host, address).get("nodes", {}).get("n1")
    return bool(node) and node.get("state") == "connected"


def _kill_control_plane(host: SshHost) -> None:
    """SIGKILL the control plane on `host` (the processes of the user llmgw there, by id) and wait until gone."""
    pids = host.ssh("pgrep -u llmgw").stdout.split()
    assert pids, "no control plane runs on " + host.name
    host.ssh(f"kill -KILL {' '.join(pids)} && while pgrep -u llmgw >/dev/null; do sleep 0.05; done")


def _move_address(lab, source: str, target: str, address: str) -> None:
    """The lab host `source`'s address moves to `target` (a machine replaced at the address its agents dial);
    the neighbours' ARP caches are flushed so they find the new one at once."""
    prefix = lab.network.prefixlen
    subprocess.run(["ip", "-n", lab.hosts[source].netns, "addr", "del", f"{address}/{prefix}", "dev", "eth0"],
                   check=True)
    subprocess.run(["ip", "-n", lab.hosts[target].netns, "addr", "add", f"{address}/{prefix}", "dev", "eth0"],
                   check=True)
    for host in lab.hosts.values():
        subprocess.run(["ip", "-n", host.netns, "neigh", "flush", "all"], check=False)
    subprocess.run(["ip", "neigh", "flush", "dev", f"{lab.prefix}-r"], check=False)


def test_server_add_failover_then_backup_and_restore_on_a_fresh_host_with_the_agent_on_tls_across_hosts(
        ssh_hosts, netns_lab, full_release, tmp_path) -> None:
    timings: dict[str, float] = {}
    root = netns_lab.join_root()
    hosts = ssh_hosts(4, share=[sys.prefix, sys.base_prefix, str(full_release.directory.parent)])
    one, two, three, four = hosts
    for host in (one, three, four):
        push_llmgw_source(host)
        host.ssh("chmod o+x /root")  # the user llmgw reaches the shared venv's Python under /root
    try:
        with forwarded_postgres(root) as base, postgres_schema() as schema, postgres_schema() as restored_schema:
            store_url, restored_url = schema_url(schema, base), schema_url(restored_schema, base)

            # host 1: `server init` with its defaults and the shared store, started as init says
            began = time.monotonic()
            init = _llmgw(one, f"server init --store {shlex.quote(store_url)}")
            timings["server init"] = time.monotonic() - began
            by_hand = init.split("Run the control plane by hand:\n", 1)[1].split("\n\n", 1)[0].strip()
            start_on(one, by_hand.replace("\n", " ; ") + " --lease 3s", "/var/log/llmgw-server.log")
            ca = one.root / STATE.lstrip("/") / "ca" / "ca.crt"
            wait_for(lambda: health(one.address, ca), 90, "host 1's admin API at its address (named by the certificate of a listener on 0.0.0.0)",
                     lambda: one.ssh("cat /var/log/llmgw-server.log").stdout)
            timings["host 1 serving"] = time.monotonic() - began
            created = _here(one, one.address, ["keys", "create", "--project", "demo"])
            key = next(word for word in created.split() if word.startswith("sk-llmgw-"))
            store = open_store(schema_url(schema))
            try:  # a usage row as the gateway writes one (no engine runs here)
                store.record_usage(UsageRecord(project="demo", model="gemma-3-270m", time=time.time(),
                                               prompt_tokens=5, completion_tokens=7))
            finally:
                store.close()

            # host 3: an agent joined to host 1 over mutual TLS, dialling host 1's address
            grant = json.loads(_here(one, one.address, ["join-token", "--json", "--ca-out", str(tmp_path / "ca.crt")]))
            push_files(three, "/tmp/join", {"ca.crt": ca.read_bytes()})
            _llmgw(three, f"node join --control-plane {one.address}:{grant['join_port']} --token "
                      f"{grant['token']} --ca-file /tmp/join/ca.crt --node-id n1 --state-dir {AGENT_STATE}")
            certificate = (three.root / AGENT_STATE.lstrip("/") / "tls" / "node.crt").read_bytes()
            start_on(three, f"{LLMGW} agent --state-dir {AGENT_STATE} --control-plane {one.address}:8082 --node-id n1",
                   "/var/log/llmgw-agent.log")
            wait_for(lambda: _connected(one, one.address), 60, "the agent on host 3 at host 1",
                     lambda: three.ssh("cat /var/log/llmgw-agent.log").stdout)

            # host 1 runs `server add host2`: ssh to host 2 (the lab's key), the release shown read-only, the
            # settings repository served by git daemon to host 2
            lab_ssh = give_lab_ssh(one)
            repo_url = serve_settings(one)
            began = time.monotonic()
            added = one.ssh(f"{LLMGW} server add {two.name} --ssh-config {lab_ssh} --release "
                            f"{full_release.directory} --trusted-key {shlex.quote(full_release.trusted_key)} --state "
                            f"{STATE} --repo-url {repo_url} --address {two.address}",
                            check=False, timeout=300)
            timings["server add"] = time.monotonic() - began
            assert added.returncode == 0, added.stdout + added.stderr + two.ssh(
                "cat /var/log/llmgw/server.log", check=False).stdout
            assert added.stdout.splitlines()[-1].startswith(
                f"control plane {two.name} added: llmgw 0.1.0 (stands by), agents at {two.address}:8082 in "
                "control_planes: (commit ")
            assert (two.root / STATE.lstrip("/") / "ca" / "ca.key").read_bytes() == (ca.parent / "ca.key").read_bytes()
            assert one.ssh(f"find {STATE}/settings.git ! -user llmgw").stdout == ""  # committed as its owner
            wait_for(lambda: _connected(two, two.address), 90, "the agent at host 2 (control_planes:, mutual TLS)",
                     lambda: three.ssh("cat /var/log/llmgw-agent.log").stdout)

            _kill_control_plane(one)
            killed = time.monotonic()
            wait_for(lambda: (health(two.address, ca) or {}).get("leader") is True, 60, "host 2 to lead",
                     lambda: two.ssh("cat /var/log/llmgw/server.log").stdout)
            timings["host 2 leads after the SIGKILL"] = time.monotonic() - killed
            models = f"http://{two.address}:8080/v1/models"
            assert httpx.get(models, headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code == 200
            assert httpx.get(models, headers={"Authorization": f"Bearer {key}x"}, timeout=5).status_code == 401
            assert _connected(two, two.address)

            # backup on host 1 (its state and the shared store, which holds host 2's lease: the restored
            # control plane's fencing token passes the one the agent saw last)
            began = time.monotonic()
            backup = _llmgw(one, f"backup --state {STATE} /root/llmgw.tar.gz")
            timings["backup"] = time.monotonic() - began
            assert "holds the CA's private key" in backup
            archive = (one.root / "root" / "llmgw.tar.gz").read_bytes()

            # hosts 1 and 2 are lost; host 4 is restored from the archive and takes host 1's address
            one.stop()
            two.stop()
            _move_address(netns_lab, one.name, four.name, one.address)
            push_files(four, "/root/backups", {"llmgw.tar.gz": archive})
            began = time.monotonic()
            restored = _llmgw(four, f"restore /root/backups/llmgw.tar.gz --state {STATE} --store "
                                f"{shlex.quote(restored_url)}")
            timings["restore"] = time.monotonic() - began
            assert "Start it with: llmgw server" in restored
            again = run_llmgw(["restore", str(four.root / "root" / "backups" / "llmgw.tar.gz"), "--state",
                               str(four.root / STATE.lstrip("/")), "--store", restored_url])
            assert again[0] == 1 and "is not empty" in again[2], again
            four.ssh(f"git -C {STATE}/settings.git rev-parse refs/llmgw/audit")  # the audit history came along
            start_on(four, f"{LLMGW} server --repo {STATE}/settings.git --state {STATE} --store "
                         f"{shlex.quote(restored_url)} --tls --gateway 0.0.0.0:8080 --admin 0.0.0.0:8081 "
                         "--agents 0.0.0.0:8082 --lease 3s", "/var/log/llmgw-server.log")
            started = time.monotonic()
            wait_for(lambda: _connected(four, one.address), 90, "the agent at host 4 (host 1's address), no new join",
                     lambda: four.ssh("cat /var/log/llmgw-server.log").stdout + three.ssh(
                         "tail -20 /var/log/llmgw-agent.log").stdout)
            timings["agent back on host 4"] = time.monotonic() - started
            assert (three.root / AGENT_STATE.lstrip("/") / "tls" / "node.crt").read_bytes() == certificate
            keys = json.loads(_here(four, one.address, ["keys", "list", "--json"]))
            assert [k["project"] for k in keys] == ["demo"] and key.startswith(keys[0]["prefix"])
            usage = json.loads(_here(four, one.address, ["usage", "--by", "project", "--json"]))
            assert [(row["group"], row["prompt_tokens"], row["completion_tokens"]) for row in usage["rows"]] == [
                ("demo", 5, 7)], usage
            assert "agents' CA  valid until " in _here(four, one.address, ["status"])
            models = f"http://{one.address}:8080/v1/models"
            assert httpx.get(models, headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code == 200
    finally:
        print("; ".join(f"{what} {seconds:.1f} s" for what, seconds in timings.items()))
