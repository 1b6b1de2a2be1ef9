"""A settings repository reached over ssh with a deploy key (`llmgw server --repo ssh://... --repo-ssh-key FILE`,
`llmgw.settings.fetch_mirror(..., ssh_key=)`), against a real sshd serving a bare git repository on a host of its
own (tests/support/ssh_hosts.py). libgit2 (pygit2's libssh2 transport) checks the server's host key itself against
`$HOME/.ssh/known_hosts` (pygit2's default certificate_check, Passthrough, lets a host that file does not list through:
fetch_mirror accepts only what libgit2 found valid). Each fetch runs in a process whose HOME is a temporary directory
holding only that file.

Shown here: the control plane loads the settings commit from the ssh URL with the deploy key, and later fetches move
the mirror; an unknown host key (with the deploy key or, over a plain ssh URL, without one), a host key that differs
from known_hosts, and a key the server does not accept each refuse the fetch with a sentence naming the URL; a hashed
known_hosts entry is accepted; the pod the Helm chart renders runs its command line here against that sshd (`make
helm`). About 20-60 s here for the three (the control plane's start, the hosts and the pushes).
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pygit2
import pytest
import yaml
from support.llmgw_processes import read_server_banner

CHECKOUT = Path(__file__).resolve().parents[2]
_HOMES: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_homes():
    yield
    while _HOMES:
        shutil.rmtree(_HOMES.pop(), ignore_errors=True)
FETCH = """
import sys
from llmgw.settings import fetch_mirror
try:
    fetch_mirror(sys.argv[1], sys.argv[2], ssh_key=sys.argv[3] or None)
except OSError as exc:
    sys.exit(str(exc))
"""


def _keypair(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "deploy", "-f", str(path)], check=True)
    return path


def _home(tmp_path: Path, name: str, known_hosts: str) -> Path:
    """A HOME holding only .ssh/known_hosts. Outside tmp_path: its path holds the user's name (pytest-of-root), and
    fetch_mirror's messages replace the URL's user (root here) wherever it appears."""
    home = Path(tempfile.mkdtemp(prefix=f"llmgw-{name}-"))
    _HOMES.append(home)
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(known_hosts)
    return home


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "PYTHONPATH": str(CHECKOUT), "SSH_AUTH_SOCK": ""}


def _fetch(url: str, mirror: Path, key: Path | str, home: Path) -> subprocess.CompletedProcess:
    """fetch_mirror in a process of its own with HOME `home`; `key` "" fetches without a deploy key."""
    return subprocess.run([sys.executable, "-c", FETCH, url, str(mirror), str(key)], env=_env(home),
                          capture_output=True, text=True, timeout=60)


def _serve_settings(host, tmp_path: Path) -> tuple[str, Path]:
    """A bare repository /srv/settings.git on `host` holding examples/cluster-repo on main, pushed with real git
    over ssh; returns the commit and the local work tree (for more commits)."""
    host.ssh("git init -q --bare /srv/settings.git")
    work = tmp_path / "work"
    subprocess.run(["cp", "-r", str(CHECKOUT / "examples" / "cluster-repo"), str(work)], check=True)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "settings"], check=True)
    _push(host, work)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip(), work


def _push(host, work: Path) -> None:
    subprocess.run(["git", "-C", str(work), "push", "-q", f"{host.name}:/srv/settings.git", "main"], check=True,
                   env={**os.environ, "GIT_SSH_COMMAND": f"ssh -F {host.ssh_config}"})


def _known_hosts_line(host) -> str:
    """The host's line of the hosts' known_hosts, for its address."""
    line = next(line for line in (host.ssh_config.parent / "known_hosts").read_text().splitlines()
                if line.split()[0].split(",")[0] == host.name)
    return f"{host.address} {' '.join(line.split()[1:3])}\n"


def test_the_control_plane_reads_its_settings_over_ssh_with_a_deploy_key(ssh_hosts, tmp_path) -> None:
    host, = ssh_hosts(1)
    commit, work = _serve_settings(host, tmp_path)
    key = _keypair(tmp_path / "deploy_key")
    host.ssh(f"echo '{(tmp_path / 'deploy_key.pub').read_text().strip()}' >> /root/.ssh/authorized_keys")
    url = f"ssh://root@{host.address}/srv/settings.git"
    home = _home(tmp_path, "home", _known_hosts_line(host))

    server = subprocess.Popen(
        [sys.executable, "-m", "llmgw.cli", "server", "--repo", url, "--repo-ssh-key", str(key),
         "--state", str(tmp_path / "state"), "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0",
         "--agents", "127.0.0.1:0"],
        env=_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        found = read_server_banner(server)
        deadline = time.monotonic() + 60
        assert found["settings"][2:] == ["from", url], found
        admin = found["admin"][2]
        token = (tmp_path / "state" / "admin-token").read_text().strip()
        status: dict = {}
        while time.monotonic() < deadline and status.get("commit") != commit:  # the watcher's first fetch
            status = httpx.get(f"{admin}/api/v1/status", headers={"Authorization": f"Bearer {token}"}).json()["settings"]
            time.sleep(0.2)
        assert status.get("commit") == commit, status
    finally:
        server.terminate()
        server.wait(timeout=30)
        server.stderr.close()
    mirror = tmp_path / "state" / "settings-mirror.git"
    assert str(pygit2.Repository(str(mirror)).references["refs/heads/main"].target) == commit

    # a later fetch with the same key moves the mirror to the branch's new head
    (work / "README.md").write_text("moved\n")
    subprocess.run(["git", "-C", str(work), "add", "README.md"], check=True)
    subprocess.run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q",
                    "-m", "moved"], check=True)
    _push(host, work)
    assert _fetch(url, mirror, key, home).returncode == 0
    head = subprocess.run(["git", "-C", str(work), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert str(pygit2.Repository(str(mirror)).references["refs/heads/main"].target) == head


def test_an_unknown_or_changed_host_key_or_a_refused_key_refuses_the_fetch(ssh_hosts, tmp_path) -> None:
    host, = ssh_hosts(1)
    _serve_settings(host, tmp_path)
    key = _keypair(tmp_path / "deploy_key")
    host.ssh(f"echo '{(tmp_path / 'deploy_key.pub').read_text().strip()}' >> /root/.ssh/authorized_keys")
    url = f"ssh://root@{host.address}/srv/settings.git"

    shown = f"cannot fetch ssh://***@{host.address}/srv/settings.git: "
    not_known = (f"the host key of {host.address} is not in {{home}}/.ssh/known_hosts or differs from it: add the key "
                 f"the host really has (`ssh-keyscan {host.address}`, compared with the host's own "
                 "/etc/ssh/ssh_host_*_key.pub)\n")
    empty = _home(tmp_path, "empty", "")
    unknown = _fetch(url, tmp_path / "m1", key, empty)
    assert (unknown.returncode, unknown.stderr) == (1, shown + not_known.format(home=empty))
    assert not (tmp_path / "m1" / "HEAD").exists()
    without_key = _fetch(url, tmp_path / "m0", "", empty)  # a plain ssh URL: the host is checked all the same
    assert (without_key.returncode, without_key.stderr) == (1, shown + not_known.format(home=empty))

    other = _keypair(tmp_path / "other_host_key").with_suffix(".pub").read_text().split()[:2]
    changed_home = _home(tmp_path, "changed", f"{host.address} {' '.join(other)}\n")
    changed = _fetch(url, tmp_path / "m2", key, changed_home)
    assert (changed.returncode, changed.stderr) == (1, shown + not_known.format(home=changed_home))

    known = _home(tmp_path, "known", _known_hosts_line(host))
    refused = _fetch(url, tmp_path / "m3", _keypair(tmp_path / "not_authorised"), known)
    assert refused.returncode == 1
    assert refused.stderr == shown + "remote rejected authentication: Failed getting response\n"

    accepted = _fetch(url, tmp_path / "m4", key, known)
    assert accepted.returncode == 0, accepted.stderr

    hashed = _home(tmp_path, "hashed", _known_hosts_line(host))  # `ssh-keygen -H`: names hashed, as HashKnownHosts
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed / ".ssh" / "known_hosts")], check=True,
                   capture_output=True)
    assert host.address not in (hashed / ".ssh" / "known_hosts").read_text()
    accepted = _fetch(url, tmp_path / "m5", key, hashed)
    assert accepted.returncode == 0, accepted.stderr


def test_the_helm_charts_command_line_runs_and_reads_the_settings_with_its_deploy_key(ssh_hosts, tmp_path) -> None:
    """The command, arguments, environment and files of the pod deploy/helm/llmgw renders (SQLite values, this host's
    URL and known_hosts line), run here with the pod's paths moved under tmp_path and its ports made free ones: it
    starts with --tls and its --tls-hostname names on 0.0.0.0, fetches the settings with the deploy key from
    $HOME/.ssh/known_hosts's host, keeps the store where $LLMGW_STORE says, and its readiness probe answers 200."""
    from support.helm_tools import helm_binary

    host, = ssh_hosts(1)
    commit, _ = _serve_settings(host, tmp_path)
    key = _keypair(tmp_path / "deploy_key")
    host.ssh(f"echo '{(tmp_path / 'deploy_key.pub').read_text().strip()}' >> /root/.ssh/authorized_keys")
    url = f"ssh://root@{host.address}/srv/settings.git"
    rendered = subprocess.run(
        [helm_binary(), "template", "llmgw", str(CHECKOUT / "deploy" / "helm" / "llmgw"), "-n", "llmgw", "-f",
         str(CHECKOUT / "deploy" / "helm" / "llmgw" / "ci" / "sqlite-values.yaml"), "--set", f"settings.repo={url}",
         "--set-string", f"settings.knownHosts={_known_hosts_line(host)}"],
        check=True, capture_output=True, text=True).stdout
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(rendered) if doc}
    container, = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    pod = tmp_path / "pod"  # the pod's file system: each mount's path under it
    moved = {mounts[name]["mountPath"]: str(pod / name) for name in ("state", "home", "deploy-key")}
    (pod / "state").mkdir(parents=True)
    (pod / "deploy-key").mkdir()
    (pod / "deploy-key" / "ssh-privatekey").write_bytes(key.read_bytes())
    (pod / "home" / ".ssh").mkdir(parents=True)
    assert mounts["config"]["mountPath"] == "/home/llmgw/.ssh/known_hosts"
    (pod / "home" / ".ssh" / "known_hosts").write_text(docs["ConfigMap"]["data"]["known_hosts"])

    def here(text: str) -> str:
        for path, local in moved.items():
            text = text.replace(path, local)
        return re.sub(r"0\.0\.0\.0:80\d\d", "0.0.0.0:0", text).replace("--join-port=8083", "--join-port=0")

    env = {item["name"]: here(item["value"]) for item in container["env"]}
    command = [here(part) for part in [*container["command"], *container["args"]]]
    assert command[:2] == ["llmgw", "server"] and env["LLMGW_STORE"] == f"sqlite:///{pod}/state/llmgw.sqlite3"
    server = subprocess.Popen([sys.executable, "-m", "llmgw.cli", *command[1:]],
                              env={**os.environ, "PYTHONPATH": str(CHECKOUT), "SSH_AUTH_SOCK": "", **env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        found = read_server_banner(server)
        deadline = time.monotonic() + 60
        gateway = int(found["gateway"][1].rsplit(":", 1)[1].split("/")[0])
        admin = f"https://127.0.0.1:{found['admin'][2].rsplit(':', 1)[1]}"
        assert "(mutual TLS; join port" in " ".join(found["agents"])
        token = (pod / "state" / "admin-token").read_text().strip()
        status: dict = {}
        ca = ssl.create_default_context(cafile=str(pod / "state" / "ca" / "ca.crt"))
        while time.monotonic() < deadline and status.get("commit") != commit:
            status = httpx.get(f"{admin}/api/v1/status", headers={"Authorization": f"Bearer {token}"},
                               verify=ca).json()["settings"]
            time.sleep(0.2)
        assert status.get("commit") == commit, status
        probe = container["readinessProbe"]["httpGet"]
        assert httpx.get(f"http://127.0.0.1:{gateway}{probe['path']}").status_code == 200
        assert (pod / "state" / "llmgw.sqlite3").stat().st_size > 0
    finally:
        server.terminate()
        stopped = server.wait(timeout=30)
        server.stderr.close()
        assert stopped == 0
