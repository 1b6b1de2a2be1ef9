"""`llmgw server add HOST`: what it would run on the host (--dry-run: the release's checks and install, the shared
settings, CA and store secret copied over ssh, `server init` with them, the start) and the settings commit of
`control_planes:`; a first control plane on SQLite is refused with what to do.

Not here yet (issue 28, item 1): the full scenario on the ssh_hosts fixture's hosts (server add of host 2, SIGKILL of
host 1's control plane, host 2 leads and serves the same API key, agents on TLS across hosts)."""

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
from support.releases import build_signed_release

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return build_signed_release(tmp_path_factory.mktemp("release"), dependencies=False)


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
            "--ca-from /var/tmp/llmgw-add/standby/ca --secrets-from /var/tmp/llmgw-add/standby/secrets") in done.stdout
    assert whats[-1] == "then: llmgw.yaml control_planes: += 10.0.0.2:8082 (a settings commit to " \
        f"{state / 'settings.git'})"


def test_the_shared_tar_holds_the_settings_the_ca_and_the_store_secret_and_control_planes_is_committed(tmp_path):
    from llmgw.cli.server_add import add_control_plane, shared_tar

    state = _state(tmp_path, "postgresql://llmgw@10.0.0.1/llmgw")
    shared, url = shared_tar(state, state / "settings.git", "main")
    assert url == "postgresql://llmgw@10.0.0.1/llmgw"
    with tarfile.open(fileobj=io.BytesIO(shared)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert files["ca/ca.key"] == (state / "ca" / "ca.key").read_bytes()
    assert files["ca/ca.crt"] == (state / "ca" / "ca.crt").read_bytes()
    assert files["secrets/store-password"] == b"s3cret\n"
    assert "settings/llmgw.yaml" in files

    assert add_control_plane(state / "settings.git", "main", "10.0.0.2:8082", ("Ops", "ops@example.com")).startswith(
        "commit ")
    assert add_control_plane(state / "settings.git", "main", "10.0.0.2:8082", ("Ops", "ops@example.com")) == \
        "already there"
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(f"git --git-dir {state / 'settings.git'} archive main | tar -x -C {out}", shell=True, check=True)
    assert "10.0.0.2:8082" in load_directory(out).cluster.control_planes


def test_server_add_refuses_a_first_control_plane_on_sqlite_with_what_to_do(release, tmp_path) -> None:
    state = _state(tmp_path, str(tmp_path / "state" / "llmgw.sqlite3"))
    done = run_llmgw("server", "add", "cp2.invalid", "--release", str(release.directory), "--trusted-key",
                     release.trusted_key, "--state", str(state), "--repo-url", "file:///x", "--dry-run")
    assert done.returncode == 1
    assert "several control planes share a PostgreSQL store: move to one first (`llmgw store copy`" in done.stderr
