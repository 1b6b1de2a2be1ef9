"""The agent's side of `llmgw upgrade` without pip: UpgradeAgent over an in-process link to a real `run_agent`
(refused where the agent does not run from a release install, a piece out of order, a tar changed on the way, a
release signed by a key nobody trusts: each answered with its sentence, nothing installed, `current` unchanged), and
the rollback watcher (`llmgw.agent.upgrade_watch`) against real processes: a new agent that exits, or does not
register by the deadline, is rolled back to the previous version, which is started with the agent's arguments.
The whole install, re-exec and rollback run in tests/control/test_upgrade_fleet.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from llmgw.agent import AgentConfig, run_agent, upgrade_watch, upgrading
from llmgw.agent.upgrade_command import NOT_LAID_OUT
from llmgw.release import MANIFEST, SIGNATURE, Manifest, keygen, read_public_key, read_secret_key
from llmgw.release.manifest import describe, write_signed_manifest
from llmgw.wire import control_message, pb

from agent_support import ControlSide


def _release(root: Path, version: str, key_dir: Path) -> tuple[bytes, str]:
    """(a tar of a tiny signed release of `version`, the signer's key line)."""
    secret, public = keygen(key_dir)
    directory = root / f"release-{version}"
    (directory / "wheels").mkdir(parents=True)
    (directory / "wheels" / f"llmgw-{version}-py3-none-any.whl").write_bytes(b"not really a wheel")
    manifest = Manifest("llmgw", version, "2026-01-01T00:00:00Z", "3.11", "manylinux_2_36_x86_64",
                        describe(directory, [f"wheels/llmgw-{version}-py3-none-any.whl"]))
    write_signed_manifest(directory, manifest, read_secret_key(secret), "test release")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in (MANIFEST, SIGNATURE, f"wheels/llmgw-{version}-py3-none-any.whl"):
            tar.add(directory / name, arcname=name)
    return buffer.getvalue(), read_public_key(public).line


@asynccontextmanager
async def _agent(tmp_path, layout: upgrading.InstallLayout | None):
    control = ControlSide()
    config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=60.0,
                         bandwidth_probe_seconds=0.0)
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(run_agent, config, control.connect)
        if layout is not None:
            agent.upgrade_layout = lambda: layout
        link = await control.links.receive()
        assert (await link.receive()).WhichOneof("body") == "register"
        yield agent, link
        nursery.cancel_scope.cancel()


async def _result(link, command_id: str) -> pb.CommandResult:
    with trio.fail_after(30):
        while True:
            message = await link.receive()
            if message.WhichOneof("body") == "command_result" and message.command_result.command_id == command_id:
                return message.command_result


async def _send(link, tar: bytes, version: str, keys: list[str], sha: str | None = None, piece: int = 100):
    """Send `tar` in pieces of `piece` bytes; the last answer."""
    sha = sha or hashlib.sha256(tar).hexdigest()
    offsets = list(range(0, len(tar), piece))
    for index, offset in enumerate(offsets):
        last = index == len(offsets) - 1
        await link.send(control_message(command_id=f"p{offset}", upgrade_agent=pb.UpgradeAgent(
            version=version, offset=offset, data=tar[offset:offset + piece], total_bytes=len(tar), sha256=sha,
            last=last, trusted_keys=keys, confirm_seconds=30)))
        result = await _result(link, f"p{offset}")
        if last or not result.ok:
            return result


def _layout(tmp_path: Path) -> upgrading.InstallLayout:
    root = tmp_path / "opt"
    (root / "0.1.0").mkdir(parents=True)
    upgrading.switch_current(root, "0.1.0")
    return upgrading.InstallLayout(root, "0.1.0")


async def test_an_agent_not_run_from_a_release_install_refuses_to_upgrade(tmp_path):
    async with _agent(tmp_path, None) as (agent, link):
        result = await _send(link, b"x" * 10, "0.2.0", [])
    assert not result.ok and result.error == NOT_LAID_OUT
    assert NOT_LAID_OUT.startswith("this agent does not run from a release installed as `llmgw node add` installs")


async def test_a_release_changed_on_the_way_or_signed_by_an_untrusted_key_is_refused_and_nothing_installed(tmp_path):
    layout = _layout(tmp_path)
    tar, key = _release(tmp_path, "0.2.0", tmp_path / "keys")
    _other, stranger = _release(tmp_path / "other", "0.2.0", tmp_path / "other-keys")
    async with _agent(tmp_path, layout) as (agent, link):
        await link.send(control_message(command_id="gap", upgrade_agent=pb.UpgradeAgent(
            version="0.2.0", offset=500, data=b"x", total_bytes=len(tar))))
        gap = await _result(link, "gap")
        assert not gap.ok and "a piece of release 0.2.0 at offset 500 does not follow what this agent holds " \
                              "(nothing): send the release again from its start" == gap.error
        changed = await _send(link, tar, "0.2.0", [key], sha="0" * 64)
        assert not changed.ok and changed.error.startswith(
            f"the upgrade to llmgw 0.2.0 failed: the release tar has sha256 {hashlib.sha256(tar).hexdigest()}, "
            f"{'0' * 64} was announced")
        untrusted = await _send(link, tar, "0.2.0", [stranger])
        assert not untrusted.ok and "which is not trusted" in untrusted.error, untrusted.error
        assert not agent.restart_requested.is_set()
    assert os.readlink(layout.current) == "0.1.0"
    assert sorted(p.name for p in layout.root.iterdir()) == ["0.1.0", "current"]  # no venv, no scratch left
    assert not (tmp_path / "state" / upgrading.PENDING).exists()


def _fake_python(root: Path, version: str, out: Path) -> None:
    """<root>/<version>/bin/python: writes its arguments to `out` (what the watcher starts after a rollback), whole:
    through a rename, so a test that sees `out` reads them all (a whole run once read it created and still empty)."""
    python = root / version / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f"#!/bin/sh\necho \"$@\" > {out}.part && mv {out}.part {out}\n")
    python.chmod(0o755)


def _pending(state: Path, root: Path, pid: int, deadline_in: float) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / upgrading.PENDING).write_text(json.dumps({
        "from": "0.1.0", "to": "0.2.0", "root": str(root), "deadline_unix": time.time() + deadline_in,
        "confirm_seconds": deadline_in, "argv": ["agent", "--node-id", "n"], "started": True, "agent_pid": pid}))


def _rolled_back(tmp_path: Path, pid: int, deadline_in: float, monkeypatch) -> dict:
    root, state, out = tmp_path / "opt", tmp_path / "state", tmp_path / "started.txt"
    _fake_python(root, "0.1.0", out)
    (root / "0.2.0").mkdir()
    upgrading.switch_current(root, "0.2.0")
    _pending(state, root, pid, deadline_in)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    assert upgrade_watch.watch(state) == 1
    deadline = time.monotonic() + 20
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.read_text().split() == ["-P", "-m", "llmgw.cli", "agent", "--node-id", "n"]
    assert os.readlink(root / "current") == "0.1.0"
    assert not (state / upgrading.PENDING).exists()
    return json.loads((state / upgrading.ROLLED_BACK).read_text())


def test_a_new_agent_that_exits_is_rolled_back_and_the_previous_one_started(tmp_path, monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = _rolled_back(tmp_path, gone.pid, 60, monkeypatch)
    assert record["reason"] == "the agent of llmgw 0.2.0 exited before it registered"
    assert upgrading.rolled_back_warning(tmp_path / "state") == (
        "the upgrade to llmgw 0.2.0 was rolled back to 0.1.0: the agent of llmgw 0.2.0 exited before it registered")
    assert upgrading.confirm(tmp_path / "state", "0.1.0") is False  # reported once, then forgotten
    assert upgrading.rolled_back_warning(tmp_path / "state") is None


def test_a_new_agent_that_does_not_register_in_time_is_stopped_and_rolled_back(tmp_path, monkeypatch):
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = _rolled_back(tmp_path, stuck.pid, 0.5, monkeypatch)
        assert stuck.wait(15) != 0  # stopped by the watcher
    finally:
        stuck.kill()
    assert record["reason"] == "the agent of llmgw 0.2.0 did not register within 0.5 s"


def test_a_confirmed_upgrade_ends_the_watcher_and_stays(tmp_path):
    root, state = tmp_path / "opt", tmp_path / "state"
    (root / "0.2.0").mkdir(parents=True)
    upgrading.switch_current(root, "0.2.0")
    _pending(state, root, os.getpid(), 60)
    assert upgrading.confirm(state, "0.2.0") is True
    assert upgrade_watch.watch(state) == 0
    assert os.readlink(root / "current") == "0.2.0" and not (state / upgrading.ROLLED_BACK).exists()


def test_a_release_pip_cannot_install_is_refused_in_its_words_after_the_journal_listed_its_venv(tmp_path):
    from llmgw.errors import ReleaseError
    from llmgw.install.journal import CreatedDirectory, Journal

    layout = _layout(tmp_path)
    tar, key = _release(tmp_path, "0.2.0", tmp_path / "keys")
    path = tmp_path / "release.tar"
    path.write_bytes(tar)
    journal = Journal.open(tmp_path / "journal" / "journal.json")
    try:
        upgrading.install_release(path, len(tar), hashlib.sha256(tar).hexdigest(), "0.2.0", [key], layout,
                                  journal.path)
    except ReleaseError as exc:
        assert str(exc).startswith("installing llmgw 0.2.0 from the release's wheels failed (exit 1): "), exc
    else:
        raise AssertionError("a wheel that is not one was installed")
    assert CreatedDirectory(str(layout.root / "0.2.0")) in Journal.read(journal.path).entries
    assert sorted(p.name for p in layout.root.iterdir()) == ["0.1.0", "current"]
