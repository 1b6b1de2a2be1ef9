"""`llmgw backup` and `llmgw restore` on this machine: a damaged archive is refused by member name; a PostgreSQL store
is dumped and loaded into another schema with pg_dump / pg_restore and a real `llmgw server` on it serves the same
API key; a control plane without a CA, and one during a CA rotation. Across hosts (backup on host 1, restore on a
fresh host 4, the agent reconnecting without joining again, keys and usage there) is
tests/install/test_control_planes_on_hosts.py."""

from __future__ import annotations

import io
import json
import os
import secrets
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import openai
import psycopg
import pytest
import trio

from llmgw.backup import restore_backup, write_backup
from llmgw.errors import BackupError
from llmgw.store import UsageRecord, open_store
from llmgw.wire import CertificateAuthority

from support.llmgw_processes import LlmgwProcesses

from .conftest import write_seed
from .test_failover import PROJECTS, POSTGRES_URL, wait_for

LLMGW = [sys.executable, "-m", "llmgw.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llmgw(*args: str) -> subprocess.CompletedProcess:
    """`llmgw ARGS` (this checkout's) run from / (outside any git repository, as an operator may run it)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([*LLMGW, *args], capture_output=True, text=True, timeout=120, cwd="/",
                          env={**os.environ, "PYTHONPATH": path})


def _small_state(tmp_path: Path, store_url: str) -> tuple[Path, Path, str]:
    """A state directory with a CA, an admin token and a secret, a store holding one API key and one usage row, and
    a settings repository: (state, repo, the key's plaintext)."""
    from llmgw.settings import init_repository

    state = tmp_path / "state"
    CertificateAuthority.load_or_create(state / "ca")
    (state / "admin-token").write_text("llmgw-admin-x\n")
    (state / "secrets").mkdir()
    (state / "secrets" / "hf-token").write_text("hf_secret\n")
    store = open_store(store_url)
    try:
        _, key = store.create_api_key("demo")
        store.record_usage(UsageRecord(project="demo", model="tiny", time=time.time(), prompt_tokens=3,
                                       completion_tokens=4))
    finally:
        store.close()
    seed = write_seed(tmp_path / "seed", "a" * 64)
    (seed / "projects.yaml").write_text(PROJECTS)
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    return state, repo, key


def test_a_damaged_member_is_refused_by_name_and_nothing_is_written(tmp_path):
    state, repo, _ = _small_state(tmp_path, str(tmp_path / "state" / "llmgw.sqlite3"))
    archive = tmp_path / "a.tar.gz"
    write_backup(state, archive, store_url=str(state / "llmgw.sqlite3"), repo=repo)
    with pytest.raises(BackupError, match="exists"):
        write_backup(state, archive, store_url=str(state / "llmgw.sqlite3"), repo=repo)
    damaged = tmp_path / "damaged.tar.gz"
    with tarfile.open(archive) as src, tarfile.open(damaged, "w:gz") as dst:
        for info in src:
            data = src.extractfile(info).read()
            if info.name == "ca/ca.crt":
                data = data.replace(b"A", b"B", 1)
            dst.addfile(info, io.BytesIO(data))
    with pytest.raises(BackupError, match=r"member ca/ca.crt is damaged"):
        restore_backup(damaged, tmp_path / "target")
    assert not (tmp_path / "target").exists()
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    result = llmgw("restore", str(truncated), "--state", str(tmp_path / "target"))
    assert result.returncode == 1 and "damaged or truncated" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "target").exists()


@pytest.fixture
def two_schemas():
    names = ["llmgw_backup_" + secrets.token_hex(5) for _ in range(2)]
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {names[0]}")
    yield [f"{POSTGRES_URL}?options=-csearch_path%3D{name}" for name in names]
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        for name in names:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def test_a_postgresql_store_is_dumped_and_restored_into_another_schema_beside_the_old_one(tmp_path, two_schemas):
    source, target = two_schemas
    state, repo, key = _small_state(tmp_path, source)
    archive = tmp_path / "pg.tar.gz"
    summary = write_backup(state, archive, store_url=source, repo=repo)
    assert summary.manifest.store_kind == "postgresql"
    with pytest.raises(BackupError, match="give --store"):
        restore_backup(archive, tmp_path / "new")
    restored = restore_backup(archive, tmp_path / "new", store_url=target)
    store = open_store(target)
    try:
        assert store.authenticate(key) is not None
        assert [row.completion_tokens for row in store.recent_usage(project="demo")] == [4]
    finally:
        store.close()
    assert json.loads((tmp_path / "new" / "store.json").read_text())["url"] == target
    assert (tmp_path / "new" / "secrets" / "hf-token").read_text() == "hf_secret\n"
    assert (tmp_path / "new" / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert restored.repo.joinpath("hooks", "pre-receive").is_file()
    with pytest.raises(BackupError, match="holds tables already"):
        restore_backup(archive, tmp_path / "again", store_url=source)
    assert not (tmp_path / "again").exists()
    assert os.stat(archive).st_mode & 0o777 == 0o600


async def test_a_real_server_on_the_restored_postgresql_schema_serves_the_same_key(tmp_path, two_schemas):
    source, target = two_schemas
    state, repo, key = _small_state(tmp_path, source)
    write_backup(state, tmp_path / "pg.tar.gz", store_url=source, repo=repo)
    restored = llmgw("restore", str(tmp_path / "pg.tar.gz"), "--state", str(tmp_path / "new"), "--store", target)
    assert restored.returncode == 0 and "--store" in restored.stdout, restored.stderr
    gateway = f"127.0.0.1:{_free_port()}"
    procs = LlmgwProcesses(tmp_path)
    try:
        procs.spawn("new", "server", "--repo", str(tmp_path / "new" / "settings.git"), "--state", str(tmp_path / "new"),
                    "--store", target, "--gateway", gateway, "--admin", f"127.0.0.1:{_free_port()}",
                    "--agents", f"127.0.0.1:{_free_port()}")

        async def models():
            try:
                return await trio.to_thread.run_sync(
                    lambda: openai.OpenAI(base_url=f"http://{gateway}/v1", api_key=key, max_retries=0).models.list())
            except openai.APIConnectionError:
                return None  # not listening yet

        listed = await wait_for(models, 60, "the restored server's gateway")
        assert "tiny" in [model.id for model in listed.data]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://{gateway}/v1", api_key=key[:-2] + "xx", max_retries=0).models.list()
    finally:
        procs.stop()


def test_a_control_plane_without_tls_is_backed_up_without_a_ca_and_says_what_it_holds(tmp_path):
    state, repo, key = _small_state(tmp_path, str(tmp_path / "state" / "llmgw.sqlite3"))
    for name in ("ca.key", "ca.crt"):
        (state / "ca" / name).unlink()
    result = llmgw("backup", "--state", str(state), "--repo", str(repo), "--store", str(state / "llmgw.sqlite3"),
                   str(tmp_path / "plain.tar.gz"))
    assert result.returncode == 0, result.stderr
    assert "no CA" in result.stdout and "private key" not in result.stdout and "1 secret " in result.stdout
    said = llmgw("restore", str(tmp_path / "plain.tar.gz"), "--state", str(tmp_path / "new"))
    assert said.returncode == 0 and "--tls" not in said.stdout and "holds no CA" in said.stdout, said.stdout
    assert not (tmp_path / "new" / "ca" / "ca.key").exists()
    store = open_store(tmp_path / "new" / "llmgw.sqlite3")
    try:
        assert store.authenticate(key) is not None
    finally:
        store.close()


def test_a_backup_during_a_ca_rotation_holds_both_cas_and_the_restored_one_goes_on_rotating(tmp_path):
    from llmgw.wire import CertificateAuthority

    state, repo, _ = _small_state(tmp_path, str(tmp_path / "state" / "llmgw.sqlite3"))
    ca = CertificateAuthority.load_or_create(state / "ca")
    ca.rotate()
    archive = tmp_path / "rotating.tar.gz"
    write_backup(state, archive, store_url=str(state / "llmgw.sqlite3"), repo=repo)
    restore_backup(archive, tmp_path / "target")
    restored = CertificateAuthority.load_or_create(tmp_path / "target" / "ca")
    assert restored.rotating and restored.certificate_pem == ca.certificate_pem
    assert restored.signing_certificate_pem == ca.signing_certificate_pem
    assert oct((tmp_path / "target" / "ca" / "ca.next.key").stat().st_mode & 0o777) == "0o600"


def test_root_backs_up_a_settings_repository_another_user_owns(tmp_path):
    """As `server init` lays it out (settings.git the user llmgw's) and root runs `llmgw backup`: git's safe.directory
    would refuse the repository; the backup names it alone and reads it."""
    if os.geteuid() != 0:
        pytest.fail("needs root (the tests run as root on these machines): chown to another user")
    state, repo, _ = _small_state(tmp_path, str(tmp_path / "state" / "llmgw.sqlite3"))
    for path in [repo, *repo.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    refused = subprocess.run(["git", "-C", str(repo), "for-each-ref"], capture_output=True, text=True)
    assert "dubious ownership" in refused.stderr  # what the backup met before
    write_backup(state, tmp_path / "a.tar.gz", store_url=str(state / "llmgw.sqlite3"), repo=repo)
    restored = restore_backup(tmp_path / "a.tar.gz", tmp_path / "new")
    assert subprocess.run(["git", "-C", str(restored.repo), "rev-parse", "main"], capture_output=True).returncode == 0
