"""`llmgw node add HOST` over real ssh to a host of its own, from real signed releases (llmgw.release): a node added
all the way (a release with its dependency wheels, a control plane with mutual TLS, the agent connected, `llmgw
nodes` and the host's doctor naming the key that signed its release; `llmgw node remove` then drains it, leaves the
host's root as it was and forgets it), what it refuses (a changed byte, no Python 3.11, a host that fails its doctor,
run from the release before anything is installed), that a failure halfway leaves the host as it was (a release
without dependency wheels: pip fails halfway, on purpose; an ssh connection cut while pip installs), and that the
added node serves: a settings commit places a replica of SmolLM2 135M on it, llama-server b11434 and the GGUF
installed by its agent from mirrors (this machine's cached build and weights mirror, shown read-only on the host as
a shared directory would be), and the openai SDK's request through the gateway is answered by the engine running
on the host."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.releases import build_signed_release
from support.ssh_hosts import _children

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A signed release of this checkout without dependency wheels, with the key that signed it."""
    return build_signed_release(tmp_path_factory.mktemp("release"), dependencies=False)


def run_llmgw(*args: str) -> subprocess.CompletedProcess:
    """`llmgw ...` from this checkout, as the operator runs it."""
    return subprocess.run([sys.executable, "-m", "llmgw.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(CHECKOUT)}, cwd=CHECKOUT)


def node_add(*args: str) -> subprocess.CompletedProcess:
    """`llmgw node add ...` from this checkout, as the operator runs it."""
    return run_llmgw("node", "add", *args)


def test_dry_run_prints_every_command_it_would_run_on_the_host_and_connects_to_nothing(release) -> None:
    done = node_add("nowhere.invalid", "--release", str(release.directory), "--trusted-key", release.trusted_key,
                    "--control-plane", "10.0.0.1:8082", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("release llmgw 0.1.0 verified: ") and release.key_id in lines[0]
    whats = [line[2:] for line in lines if line.startswith("# ")]
    commands = [line for line in lines[1:] if not line.startswith("# ")]
    assert len(whats) == len(commands) == 17
    assert all(c.startswith("ssh -o BatchMode=yes nowhere.invalid ") for c in commands)
    assert whats[0].startswith("check that the host has Python 3.11 or newer")
    assert commands[1].endswith("tar -x -C /var/tmp/llmgw-add\" < the release (tar)")
    assert whats[3].startswith("check the host with `llmgw node doctor`, run from the release in /var/tmp/llmgw-add "
                               "before anything is installed")
    assert "PYTHONPATH=/var/tmp/llmgw-add/doctor python3 -m llmgw.cli node doctor " in commands[3]
    assert "--min-free 20Gi" in commands[3]
    assert whats[4] == "make /opt/llmgw"  # the first change, after every check
    assert "pip install --quiet --no-index --find-links /var/tmp/llmgw-add/wheels llmgw==0.1.0" in commands[6]
    assert whats[7] == "keep the release's signed manifest and the key that signed it in /opt/llmgw/0.1.0/release"
    assert "node join --control-plane CONTROL-PLANE:JOIN-PORT --token ONE-TIME-TOKEN" in done.stdout
    assert 'write /etc/llmgw/agent.env --mode 0640" < ' in done.stdout
    assert whats[-1] == "remove /var/tmp/llmgw-add"


def test_a_release_with_one_byte_changed_is_refused_and_nothing_reaches_the_host(ssh_hosts, release, tmp_path) -> None:
    host, = ssh_hosts(1)
    changed = shutil.copytree(release.directory, tmp_path / "release")
    wheel = next((changed / "wheels").glob("llmgw-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 1
    wheel.write_bytes(bytes(data))
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(changed),
                    "--trusted-key", release.trusted_key, "--control-plane", "10.0.0.1:8082")
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and wheel.name in done.stderr
    assert f"[{host.name}]" not in done.stdout  # not one step ran on the host
    assert host.snapshot() == before


def test_a_host_without_python_3_11_is_refused_in_its_own_words_and_left_as_it_was(ssh_hosts, release) -> None:
    host, = ssh_hosts(1)
    host.ssh("rm /usr/bin/python3 /usr/bin/python3.11")  # on the host's overlay only
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(release.directory),
                    "--trusted-key", release.trusted_key, "--control-plane", "10.0.0.1:8082")
    assert done.returncode == 1
    assert done.stderr.strip() == (f"error: {host.name} cannot take llmgw: check that the host has Python 3.11 or "
                                   "newer, with venv (Debian: python3-venv): bash: line 1: python3: command not found; "
                                   "nothing was installed")
    assert host.snapshot() == before


def test_a_failure_halfway_undoes_the_host_from_its_journal(ssh_hosts, release) -> None:
    """The release has no dependency wheels: pip fails after the journal recorded /opt/llmgw and the venv (--force:
    no doctor first, whose own install of the release would fail before anything is installed)."""
    host, = ssh_hosts(1)
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(release.directory),
                    "--trusted-key", release.trusted_key, "--control-plane", "10.0.0.1:8082", "--force")
    assert done.returncode == 1
    assert f"[{host.name}] install llmgw 0.1.0 into it from the release's wheels (no registry)" in done.stdout
    message = done.stderr.strip()
    assert message.startswith(f"error: {host.name}: install llmgw 0.1.0 into it from the release's wheels (no "
                              "registry) failed: ERROR: ")
    assert message.endswith("; the host was undone from its install journal, as it was before")
    assert host.snapshot() == before


@pytest.fixture(scope="module")
def full_release(tmp_path_factory):
    """A signed release of this checkout with every dependency wheel for this machine (support.releases' on-disk
    cache: seconds once they are there)."""
    return build_signed_release(tmp_path_factory.mktemp("full-release"))


def test_a_host_that_fails_doctor_is_stopped_in_its_own_words_before_anything_is_installed(
        ssh_hosts, full_release) -> None:
    """The host's doctor runs from the release in the scratch directory: less disk than --min-disk fails it."""
    host, = ssh_hosts(1)
    before = host.snapshot()
    done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(full_release.directory),
                    "--trusted-key", full_release.trusted_key, "--control-plane", "10.0.0.1:8082", "--min-disk", "1Ti")
    assert done.returncode == 1, done.stdout + done.stderr
    message = done.stderr.strip()
    assert message.startswith(f"error: {host.name} cannot take llmgw: check the host with `llmgw node doctor`, run "
                              "from the release in /var/tmp/llmgw-add before anything is installed: weights: only ")
    assert message.endswith(" free under /var/lib/llmgw/weights, less than the 1024.0 GiB asked for (--min-free): "
                            "free space or point weights_dir at a larger disk; nothing was installed"), message
    assert "make /opt/llmgw" not in done.stdout
    assert host.snapshot() == before


def _session_processes(host) -> list[int]:
    """The processes of every ssh session on `host` now (sshd's children but its keeper, and theirs), from /proc."""
    found, todo = [], [pid for pid in _children(host.pid) if pid != host.keeper]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += _children(pid)
    return found


def test_an_ssh_connection_cut_halfway_leaves_the_host_as_it_was(ssh_hosts, full_release) -> None:
    """The session is killed on the host (sshd's child and everything it ran: pip halfway through the venv) while
    the release installs: node add undoes the host from its journal over a new connection."""
    host, = ssh_hosts(1)
    before = host.snapshot()
    add = subprocess.Popen(
        [sys.executable, "-m", "llmgw.cli", "node", "add", host.name, "--ssh-config", str(host.ssh_config),
         "--release", str(full_release.directory), "--trusted-key", full_release.trusted_key,
         "--control-plane", "10.0.0.1:8082", "--force"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)})
    try:
        lines = []
        for line in add.stdout:
            lines.append(line)
            if line.startswith(f"[{host.name}] install llmgw 0.1.0 into it"):
                break
        deadline = time.monotonic() + 60  # until pip has installed a first wheel into the venv, then cut
        probe = ("ls /opt/llmgw/0.1.0/lib/python3.11/site-packages 2>/dev/null | "
                 "grep -v -E '^(pip|setuptools|_distutils_hack|distutils-precedence|pkg_resources|__pycache__)'")
        while not host.ssh(probe, check=False).stdout.strip():
            assert time.monotonic() < deadline and add.poll() is None, "pip wrote nothing into the venv"
        cut = _session_processes(host)
        for pid in cut:
            os.kill(pid, signal.SIGKILL)
        out, err = add.communicate(timeout=120)
    finally:
        add.kill()
    assert add.returncode == 1, "".join(lines) + out + err
    assert err.strip().startswith(f"error: ssh to {host.name} was cut during install llmgw 0.1.0 into it from the "
                                  "release's wheels (no registry) ("), err
    assert err.strip().endswith("; the host was undone from its install journal, as it was before"), err
    assert host.snapshot() == before


SMOLLM2 = "smollm2-135m-instruct"


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


def _push(checkout: Path, message: str) -> None:
    """Commit everything changed in `checkout` as an operator and push it to the settings repository (its hooks)."""
    from support.settings_seed import git

    git("add", "-A", cwd=checkout)
    git("commit", "-qm", message, cwd=checkout)
    git("push", "-q", "origin", "HEAD:main", cwd=checkout)


def test_a_node_added_over_ssh_joins_with_mutual_tls_serves_a_replica_and_node_remove_then_leaves_the_host_as_it_was(
        ssh_hosts, netns_lab, full_release, llama_server_binary, smollm2_gguf, tmp_path) -> None:
    """`node add` all the way; a settings commit then places a replica of SmolLM2 on the new node, its engine and
    weights installed by the node's agent from mirrors (engines.yaml `mirror:`, agents/nodes/host1.yaml `mirrors:`,
    both directories of this machine shown read-only on the host), and the openai SDK's request through the gateway
    is answered by llama-server running on the host (in its PID namespace, from its /var/lib/llmgw; the usage row
    names the node). `llmgw wipe` on the host refuses while the agent runs; once the model is scaled to 0, `llmgw
    node remove` drains it, wipes the host over ssh (its root as before) and forgets it: no record, its certificate
    revoked."""
    from openai import OpenAI

    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin
    from llmgw.settings import init_repository
    from llmgw.store import open_store
    from llmgw.wire import CertificateAuthority
    from support.llmgw_processes import LlmgwProcesses
    from support.settings_seed import git, write_seed
    from support.waiting import wait_for

    engines_mirror = llama_server_binary.parents[3]  # <cache>/engines, holding llama.cpp/b11434/bin/llama-server
    assert llama_server_binary == engines_mirror / "llama.cpp" / "b11434" / "bin" / "llama-server", llama_server_binary
    weights_mirror = smollm2_gguf.parents[1]  # <cache>/mirror, holding sha256/<digest>
    host, = ssh_hosts(1, share=[str(engines_mirror), str(weights_mirror)])
    root = netns_lab.join_root()
    before = host.snapshot()
    model = (CHECKOUT / "examples" / "cluster-repo" / "catalog" / f"{SMOLLM2}.yaml").read_text()
    assert "\nreplicas: 1\n" in model
    seed = write_seed(tmp_path / "seed", SMOLLM2, model.replace("\nreplicas: 1\n", "\nreplicas: 0\n"), poll="1s",
                      lost="15s", action_timeout="120s", heartbeat="1s")
    repo, state = tmp_path / "settings.git", tmp_path / "state"
    init_repository(repo, seed)
    processes = LlmgwProcesses(tmp_path)
    try:
        processes.spawn("server", "server", "--repo", str(repo), "--state", str(state), "--tls",
                        "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", f"{root}:0")
        wait_for(lambda: (state / "admin-url").is_file() and (state / "admin-token").is_file(), 60, "the server",
                 lambda: (tmp_path / "server.log").read_text())
        url, token = resolve_admin(None, None, state)
        with AdminClient(url, token, ca_file=admin_ca_file(state)) as admin:
            status = lambda: admin.get("/api/v1/status")  # noqa: E731
            agents_port = wait_for(lambda: status()["control_plane"]["agents_port"], 30, "the admin API")
            started = time.monotonic()
            done = node_add(host.name, "--ssh-config", str(host.ssh_config), "--release", str(full_release.directory),
                            "--trusted-key", full_release.trusted_key, "--control-plane", f"{root}:{agents_port}",
                            "--state", str(state), "--min-disk", "1Gi")  # the host's root is a tmpfs
            log = lambda: host.ssh("cat /var/log/llmgw/agent.log", check=False).stdout  # noqa: E731
            assert done.returncode == 0, done.stdout + done.stderr + log()
            print(f"node add took {time.monotonic() - started:.1f} s")
            assert done.stdout.splitlines()[-1].startswith(f"node {host.name} connected (")
            assert status()["nodes"][host.name]["state"] not in ("lost", "")

            # one settings commit: the engine's mirror, the node's weights mirror, a replica of SmolLM2
            started = time.monotonic()
            checkout = tmp_path / "checkout"
            git("clone", "-q", str(repo), str(checkout), cwd=tmp_path)
            engines = checkout / "engines.yaml"
            assert "    mirror: /srv/llmgw/mirror/engines" in engines.read_text()
            engines.write_text(engines.read_text().replace("/srv/llmgw/mirror/engines", str(engines_mirror)))
            (checkout / "agents" / "nodes").mkdir()
            (checkout / "agents" / "nodes" / f"{host.name}.yaml").write_text(f"mirrors: [{weights_mirror}]\n")
            (checkout / "catalog" / f"{SMOLLM2}.yaml").write_text(model)
            _push(checkout, f"serve {SMOLLM2} from the mirrors")
            show = lambda: f"{status()}\n{log()}"  # noqa: E731
            replica = wait_for(lambda: (r := status()["replicas"].get(f"{SMOLLM2}-0", {})).get("state") == "ready"
                               and r, 120, f"{SMOLLM2}-0 ready", show)
            print(f"the commit to {SMOLLM2} ready on {host.name} took {time.monotonic() - started:.1f} s")
            assert replica["node"] == host.name
            shard, = [s for s in status()["nodes"][host.name]["shards"].values() if s["replica"] == f"{SMOLLM2}-0"]

            _record, key = open_store(state / "llmgw.sqlite3").create_api_key("demo")
            gateway = status()["control_plane"]["gateway_url"]
            raw = OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0, timeout=60).chat.completions \
                .with_raw_response.create(model=SMOLLM2, max_tokens=8, temperature=0, seed=1,
                                          messages=[{"role": "user", "content": "What is the capital of France?"}])
            answer = raw.parse()
            assert answer.choices[0].message.content and answer.usage.completion_tokens > 0, answer
            assert raw.headers["x-llmgw-replica"] == f"{SMOLLM2}-0"
            usage = wait_for(lambda: open_store(state / "llmgw.sqlite3").usage_of_request(
                raw.headers["x-request-id"]), 30, "the request's usage row")
            assert (usage.node, usage.replica, usage.model) == (host.name, f"{SMOLLM2}-0", SMOLLM2), usage
            print(f"from the commit to the answer's usage row: {time.monotonic() - started:.1f} s")
        # the engine that answered is the host's: in its PID namespace, the child of the shard's process (its relay)
        # that the agent reported, run from the host's own disk: where the unit's --engines-dir and --weights-dir put
        # them (they win over the settings' engines_dir and weights_dir), the weights directory the journal marks
        (engine_pid, _), = _host_pids(host, "llama-server").items()
        engine = host.ssh(f"awk '/^PPid:/ {{print $2}}' /proc/{engine_pid}/status && readlink /proc/{engine_pid}/exe "
                          f"&& tr '\\0' ' ' < /proc/{engine_pid}/cmdline").stdout.splitlines()
        assert engine[:2] == [str(shard["pid"]), "/var/lib/llmgw/engines/llama.cpp/b11434/bin/llama-server"], engine
        assert " /var/lib/llmgw/weights/" in engine[2], engine
        assert host.ssh("readlink /opt/llmgw/current").stdout.strip() == "0.1.0"
        nodes = run_llmgw("nodes", "--state", str(state))
        assert f"  llmgw 0.1.0, from a release signed by key {full_release.key_id}" in nodes.stdout, nodes.stdout
        doctor = host.ssh("/opt/llmgw/current/bin/llmgw node doctor --state-dir /var/lib/llmgw/agent", check=False)
        assert re.search(rf"^ok +release +llmgw 0\.1\.0, from a release signed by key {full_release.key_id}$",
                         doctor.stdout, re.MULTILINE), doctor.stdout
        assert host.ssh("test -e /var/lib/llmgw/agent/tls/node.crt && test ! -e /var/tmp/llmgw-add").returncode == 0

        refused = host.ssh("/opt/llmgw/current/bin/llmgw wipe --yes", check=False)
        assert refused.returncode == 1 and "an llmgw agent runs here" in refused.stderr
        certificate = host.ssh("cat /var/lib/llmgw/agent/tls/node.crt").stdout.encode()

        # its only replica has nowhere else to go: the operator stops the model first (serving nothing, meant)
        (checkout / "catalog" / f"{SMOLLM2}.yaml").write_text(model.replace("\nreplicas: 1\n", "\nreplicas: 0\n"))
        settings = checkout / "llmgw.yaml"
        settings.write_text(settings.read_text().replace("allow_empty: false", "allow_empty: true"))
        started = time.monotonic()
        _push(checkout, f"stop {SMOLLM2}")
        removed = run_llmgw("node", "remove", host.name, "--ssh-config", str(host.ssh_config), "--state", str(state),
                            "--author-name", "Ops", "--author-email", "ops@example.com")
        print(f"the stop commit and node remove took {time.monotonic() - started:.1f} s")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        lines = removed.stdout.splitlines()
        assert lines[0].startswith(f"[{host.name}] drained (settings at ")
        assert any(line.startswith(f"[{host.name}] stopped the agent process ") for line in lines), lines
        assert any(line.startswith(f"[{host.name}] wiped: ") and line.endswith("no journal left") for line in lines)
        assert lines[-1].startswith(f"node {host.name} removed: 1 certificate revoked, node secret forgotten; ")
        assert not _host_pids(host, "llama-server")
        assert host.snapshot() == before
        with AdminClient(url, token, ca_file=admin_ca_file(state)) as admin:
            assert host.name not in admin.get("/api/v1/status")["nodes"]
        assert CertificateAuthority.load_or_create(state / "ca").is_certificate_revoked(certificate)
    finally:
        processes.stop()
