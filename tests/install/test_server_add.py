"""`llmgw server add HOST`: what it would run on the host (--dry-run: the release's checks and install, the shared
settings, CA and store secret copied over ssh, `server init` with them, the start) and the settings commit of
`control_planes:`; a first control plane on SQLite is refused with what to do; and all the way on a host of its own
over real ssh from a real signed release: the added control plane shares the PostgreSQL store and the CA, an agent
joined to the first connects to it with mutual TLS, and after SIGKILL of the first it leads and serves the same API
key (about 75 s here: the release's build with its dependency wheels, 24-44 s of `server add`, 3-4 s to lead).

The first control plane runs in the test's root namespace on the lab's root address (not on an ssh host: `server
init` on a host is tests/install/test_server_init.py), as does the agent."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from llmgw.settings import init_repository, load_directory
from llmgw.settings.packaged import example_dir
from llmgw.store import StoreRecord
from llmgw.store.opening import write_store_record
from llmgw.wire import CertificateAuthority

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release(bare_release):
    return bare_release  # the run's one (tests/conftest.py)


def _state(tmp_path: Path, url: str) -> Path:
    state = tmp_path / "state"
    CertificateAuthority.load_or_create(state / "ca")
    (state / "secrets").mkdir(mode=0o700)
    (state / "secrets" / "store-password").write_text("s3cret\n")
    write_store_record(state, StoreRecord(url, "store-password" if url.startswith("postgresql") else None))
    init_repository(state / "settings.git", example_dir())
    return state


def run_llmgw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmgw.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(CHECKOUT)}, cwd=CHECKOUT)


def test_server_add_dry_run_shows_the_install_the_shared_ca_and_server_init(release, tmp_path) -> None:
    state = _state(tmp_path, "postgresql://llmgw@10.0.0.1/llmgw")
    done = run_llmgw("server", "add", "cp2.invalid", "--release", str(release.directory), "--trusted-key",
                     release.trusted_key, "--state", str(state), "--repo-url", "ssh://cp1/var/lib/llmgw/server/settings.git",
                     "--address", "10.0.0.2", "--dry-run")
    assert done.returncode == 0, done.stderr
    whats = [line[2:] for line in done.stdout.splitlines() if line.startswith("# ")]
    assert whats[0].startswith("check that the host has Python 3.11")
    assert not any("doctor" in what for what in whats)  # a control plane needs no accelerator
    assert "make /opt/llmgw" in whats and not any("/var/lib/llmgw/agent" in what for what in whats)
    assert whats[-5] == "copy the settings, the agents' CA and the store's secret into /var/tmp/llmgw-add/standby"
    assert ("/opt/llmgw/current/bin/llmgw server init --from /var/tmp/llmgw-add/standby/settings --store "
            "postgresql://llmgw@10.0.0.1/llmgw --listen 0.0.0.0 --repo ssh://cp1/var/lib/llmgw/server/settings.git "
            "--tls-hostname 10.0.0.2 --ca-from /var/tmp/llmgw-add/standby/ca --secrets-from /var/tmp/llmgw-add/standby/secrets") in done.stdout
    assert whats[-1] == "then: llmgw.yaml control_planes: += 10.0.0.2:8082 (a settings commit to " \
        f"{state / 'settings.git'})"


def test_the_shared_tar_holds_the_settings_the_ca_and_the_store_secret_and_control_planes_is_committed(tmp_path):
    from llmgw.cli.server_add import add_control_plane, shared_tar

    state = _state(tmp_path, "postgresql://llmgw@10.0.0.1/llmgw")
    for name in ("ca.next.key", "ca.next.crt"):  # as `llmgw ca rotate` leaves them during a rotation (copied as they are)
        (state / "ca" / name).write_bytes(f"{name} of the rotation\n".encode())
    (state / "ca" / "join-tokens.json").write_text("{}")  # one-time tokens stay with the control plane that made them
    shared, url = shared_tar(state, state / "settings.git", "main")
    assert url == "postgresql://llmgw@10.0.0.1/llmgw"
    with tarfile.open(fileobj=io.BytesIO(shared)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert files["ca/ca.key"] == (state / "ca" / "ca.key").read_bytes()
    assert files["ca/ca.crt"] == (state / "ca" / "ca.crt").read_bytes()
    assert files["ca/ca.next.key"] == b"ca.next.key of the rotation\n"
    assert files["ca/ca.next.crt"] == b"ca.next.crt of the rotation\n"
    assert "ca/join-tokens.json" not in files
    assert files["secrets/store-password"] == b"s3cret\n"
    assert "settings/llmgw.yaml" in files

    repo = state / "settings.git"
    assert add_control_plane(repo, "main", "10.0.0.2:8082", ("Ops", "ops@example.com")).startswith("commit ")
    assert add_control_plane(repo, "main", "10.0.0.2:8082", ("Ops", "ops@example.com")) == "already there"
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(f"git --git-dir {repo} archive main | tar -x -C {out}", shell=True, check=True)
    assert "10.0.0.2:8082" in load_directory(out).cluster.control_planes


def test_server_add_refuses_a_first_control_plane_on_sqlite_with_what_to_do(release, tmp_path) -> None:
    state = _state(tmp_path, str(tmp_path / "state" / "llmgw.sqlite3"))
    done = run_llmgw("server", "add", "cp2.invalid", "--release", str(release.directory), "--trusted-key",
                     release.trusted_key, "--state", str(state), "--repo-url", "file:///x", "--dry-run")
    assert done.returncode == 1
    assert "several control planes share a PostgreSQL store: move to one first (`llmgw store copy`" in done.stderr


def test_a_control_plane_added_over_ssh_leads_when_the_first_is_killed_with_the_same_key_and_agents_on_tls(
        ssh_hosts, netns_lab, full_release, tmp_path) -> None:
    """The first control plane runs here on the lab's root address (PostgreSQL reached by both through a socat
    forwarder there, a schema of the test's own), an agent joined to it with mutual TLS; `server add` makes host 2
    a control plane from the release; the agent connects to host 2 too (control_planes:); after SIGKILL of the
    first, host 2 leads, its gateway takes the API key made on the first, and the agent is still there on TLS."""
    import getpass
    import signal
    import socket
    import ssl
    import time

    import httpx

    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin
    from llmgw.store import open_store
    from support.llmgw_processes import LlmgwProcesses
    from support.postgres import postgres_schema, schema_url
    from support.waiting import wait_for

    root = netns_lab.join_root()
    repo, state = tmp_path / "settings" / "settings.git", tmp_path / "state"
    init_repository(repo, example_dir())
    host, = ssh_hosts(1, share=[str(repo.parent)])
    host.ssh("git config --system --add safe.directory '*'")  # the shared repository is root's, read by user llmgw
    with socket.socket() as probe:
        probe.bind((root, 0))
        pg_port = probe.getsockname()[1]
    processes = LlmgwProcesses(tmp_path)
    forwarder = subprocess.Popen(["socat", f"TCP-LISTEN:{pg_port},bind={root},fork,reuseaddr", "TCP:127.0.0.1:5432"])
    try:
        with postgres_schema() as schema:
            store_url = schema_url(schema, f"postgresql://{getpass.getuser()}@{root}:{pg_port}/test")
            store = open_store(schema_url(schema))
            try:
                _record, key = store.create_api_key("demo")
            finally:
                store.close()
            first = processes.spawn("server", "server", "--repo", str(repo), "--state", str(state), "--tls",
                                    "--store", store_url, "--gateway", f"{root}:0", "--admin", f"{root}:0",
                                    "--agents", f"{root}:0", "--lease", "3s")
            wait_for(lambda: (state / "admin-url").is_file() and (state / "admin-token").is_file(), 60, "the server",
                     lambda: (tmp_path / "server.log").read_text())
            url, token = resolve_admin(None, None, state)
            with AdminClient(url, token, ca_file=admin_ca_file(state)) as admin:
                agents_port = wait_for(lambda: admin.get("/api/v1/status")["control_plane"]["agents_port"], 30,
                                       "the admin API")
                join = admin.post("/api/v1/join-tokens", {"ttl_seconds": 900})
            agent_dir = tmp_path / "agent"
            joined = run_llmgw("node", "join", "--control-plane", f"{root}:{join['join_port']}", "--token",
                               join["token"], "--ca-file", str(state / "ca" / "ca.crt"), "--node-id", "n1",
                               "--state-dir", str(agent_dir))
            assert joined.returncode == 0, joined.stderr
            processes.spawn("agent", "agent", "--state-dir", str(agent_dir), "--control-plane", f"{root}:{agents_port}",
                            "--node-id", "n1")

            started = time.monotonic()
            added = run_llmgw("server", "add", host.name, "--ssh-config", str(host.ssh_config), "--release",
                              str(full_release.directory), "--trusted-key", full_release.trusted_key, "--state",
                              str(state), "--repo", str(repo), "--repo-url", f"file://{repo}", "--address", host.address)
            print(f"server add took {time.monotonic() - started:.1f} s")
            log = host.ssh("cat /var/log/llmgw/server.log", check=False).stdout
            assert added.returncode == 0, added.stdout + added.stderr + log
            assert added.stdout.splitlines()[-1].startswith(
                f"control plane {host.name} added: llmgw 0.1.0 (stands by), agents at {host.address}:8082 in control_planes: (commit ")
            assert (host.root / "var/lib/llmgw/server/ca/ca.key").read_bytes() == (state / "ca" / "ca.key").read_bytes()

            ca = ssl.create_default_context(cafile=str(state / "ca" / "ca.crt"))
            health = f"https://{host.address}:8081/api/v1/health"

            def second_health() -> dict | None:
                try:
                    return httpx.get(health, verify=ca, timeout=2).json()
                except httpx.HTTPError:
                    return None

            def second_sees_the_agent() -> bool:
                token2 = host.ssh("cat /var/lib/llmgw/server/admin-token").stdout.strip()
                with AdminClient(f"https://{host.address}:8081", token2, ca_file=str(state / "ca" / "ca.crt")) as admin2:
                    node = admin2.get("/api/v1/status").get("nodes", {}).get("n1")
                    return bool(node) and node.get("state") not in ("lost", "")

            wait_for(second_health, 90, "host 2's admin API", lambda: host.ssh("cat /var/log/llmgw/server.log").stdout)
            wait_for(second_sees_the_agent, 60, "the agent at host 2 (control_planes:, mutual TLS)",
                     lambda: (tmp_path / "agent.log").read_text())
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            killed = time.monotonic()
            wait_for(lambda: (second_health() or {}).get("leader") is True, 60, "host 2 to lead",
                     lambda: host.ssh("cat /var/log/llmgw/server.log").stdout)
            print(f"host 2 led {time.monotonic() - killed:.1f} s after the first control plane was killed")
            models = f"http://{host.address}:8080/v1/models"
            assert httpx.get(models, headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code == 200
            assert httpx.get(models, headers={"Authorization": f"Bearer {key}x"}, timeout=5).status_code == 401
            assert second_sees_the_agent()
    finally:
        processes.stop()
        forwarder.kill()
        forwarder.wait()


def test_control_planes_is_committed_as_the_owner_of_server_inits_repository(ssh_hosts) -> None:
    """Run by root (as `server add` is) on the repository `server init` made, which is the user llmgw's: the commit
    is made as that user (git refuses root a repository of another user), and every file of it stays llmgw's."""
    from support.ssh_hosts import SOURCE, push_llmgw_source

    host, = ssh_hosts(1, share=[sys.prefix, sys.base_prefix])
    push_llmgw_source(host)
    host.ssh("chmod o+x /root")  # the user llmgw reaches the shared venv's Python under /root (a release is in /opt)
    host.ssh(f"PYTHONPATH={SOURCE} {sys.prefix}/bin/llmgw server init")
    code = ("from pathlib import Path; from llmgw.cli.server_add import add_control_plane as add; "
            "print(add(Path('/var/lib/llmgw/server/settings.git'), 'main', '10.0.0.9:8082', ('Ops', 'ops@example.com')))")
    done = host.ssh(f"cd / && PYTHONPATH={SOURCE} {sys.executable} -c \"{code}\"", check=False)
    assert done.returncode == 0 and done.stdout.startswith("commit "), done.stdout + done.stderr
    assert host.ssh("find /var/lib/llmgw/server/settings.git ! -user llmgw").stdout == ""
    shown = host.ssh("runuser -u llmgw -- git --git-dir /var/lib/llmgw/server/settings.git show main:llmgw.yaml").stdout
    assert "10.0.0.9:8082" in shown
