"""`llmgw server add HOST` without hosts: what it would run on the host (--dry-run: the release's checks and install,
the shared settings, CA and store secret copied over ssh, `server init` with them, the start), the shared tar and the
settings commit of `control_planes:`, and a first control plane on SQLite refused with what to do. All the way over
real ssh (server init on host 1, server add of host 2 run there, failover, backup and restore on a fresh host) is
tests/install/test_control_planes_on_hosts.py."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from llmgw.settings import init_repository, load_directory
from llmgw.settings.packaged import example_dir
from llmgw.store import StoreRecord
from llmgw.store.opening import write_store_record
from llmgw.wire import CertificateAuthority
from support.in_process_cli import completed

CHECKOUT = Path(__file__).resolve().parents[2]


def _state(tmp_path: Path, url: str) -> Path:
    state = tmp_path / "state"
    CertificateAuthority.load_or_create(state / "ca")
    (state / "secrets").mkdir(mode=0o700)
    (state / "secrets" / "store-password").write_text("s3cret\n")
    write_store_record(state, StoreRecord(url, "store-password" if url.startswith("postgresql") else None))
    init_repository(state / "settings.git", example_dir())
    return state


def run_llmgw(*args: str) -> subprocess.CompletedProcess:
    """`llmgw ...` from this checkout, in this process (support.in_process_cli)."""
    return completed(list(args), cwd=CHECKOUT)


def test_server_add_dry_run_shows_the_install_the_shared_ca_and_server_init(full_release, tmp_path) -> None:
    state = _state(tmp_path, "postgresql://llmgw@10.0.0.1/llmgw")
    done = run_llmgw("server", "add", "cp2.invalid", "--release", str(full_release.directory), "--trusted-key",
                     full_release.trusted_key, "--state", str(state), "--repo-url", "ssh://cp1/var/lib/llmgw/server/settings.git",
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


def test_server_add_refuses_a_first_control_plane_on_sqlite_with_what_to_do(full_release, tmp_path) -> None:
    state = _state(tmp_path, str(tmp_path / "state" / "llmgw.sqlite3"))
    done = run_llmgw("server", "add", "cp2.invalid", "--release", str(full_release.directory), "--trusted-key",
                     full_release.trusted_key, "--state", str(state), "--repo-url", "file:///x", "--dry-run")
    assert done.returncode == 1
    assert "several control planes share a PostgreSQL store: move to one first (`llmgw store copy`" in done.stderr
