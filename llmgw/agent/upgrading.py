"""The agent's side of `llmgw upgrade`: a release received over the stream, installed beside the running one, then
the agent re-executes itself from it; a new agent that does not confirm in time is rolled back.

The layout is `llmgw node add`'s (llmgw.install.onboarding): /opt/llmgw/<version> venvs and /opt/llmgw/current
linked to the one that runs. `running_layout()` finds it from the interpreter's venv (None: this agent runs from a
checkout or a pip install, and refuses UpgradeAgent saying so).

UpgradeAgent pieces (`receive_piece`) are appended to <state>/upgrade/release.tar in order. The last one starts
`install_release` (blocking): the tar's size and sha256, then, extracted beside the install root, the release's
signature against the trusted keys (the control plane's releases.trusted_keys and the key of the release this agent
runs) and every file's digest (`llmgw.release.verify_release`), a venv <root>/<version> with the release's wheels
installed offline (pip, as `node add` does; listed in the install journal first where `node add` keeps one, so
`llmgw wipe` removes it), the release's record kept in it, the pending marker
(<state>/upgrade-pending.json: from, to, deadline, argv) written, and `current` flipped atomically.

Then `llmgw agent` (llmgw.cli.agent_cmds) starts the watcher (`llmgw.agent.upgrade_watch`, from the previous
version's venv, in a session of its own) and re-executes itself from the new venv: same pid, so its engines stay
its children and are adopted (llmgw.agent.supervisor). The new agent confirms once the control plane answered its
Register (`confirm`: the marker is removed). Unconfirmed by the deadline, or the agent gone, the watcher restores
`current`, records why in <state>/upgrade-rolled-back.json (the next agent lists it in Register's warnings, once)
and starts the previous version's agent (under systemd, where INVOCATION_ID is set, systemd starts it again).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from llmgw.archives import extract_tar
from llmgw.errors import ReleaseError
from llmgw.install.journal import JOURNAL_PATH, CreatedDirectory, record_on_installed_host, sha256_of
from llmgw.install.venvs import make_venv
from llmgw.release import (
    MANIFEST, PUBLIC_KEY_FILE, RECORD_DIR, SIGNATURE, read_public_key, trusted_public_keys, verify_release,
)

CURRENT = "current"
TRANSFER_DIR = "upgrade"
TRANSFER_FILE = "release.tar"
PENDING = "upgrade-pending.json"
ROLLED_BACK = "upgrade-rolled-back.json"
PIP_TIMEOUT = 1800.0
"""Seconds the offline pip install of a release may take."""


@dataclass(frozen=True)
class InstallLayout:
    """Where releases are installed (`root`, /opt/llmgw) and the version whose venv runs now (`version`)."""

    root: Path
    version: str

    @property
    def current(self) -> Path:
        return self.root / CURRENT

    def python(self, version: str) -> Path:
        return self.root / version / "bin" / "python"


def running_layout(prefix: Path | str | None = None) -> InstallLayout | None:
    """The install layout of the venv `prefix` (default: this interpreter's, sys.prefix): its parent holds a
    `current` link to it. None when it is not laid out so (a checkout, a pip install elsewhere)."""
    venv = Path(sys.prefix if prefix is None else prefix).resolve()
    current = venv.parent / CURRENT
    if current.is_symlink() and current.resolve() == venv:
        return InstallLayout(venv.parent, venv.name)
    return None


@dataclass
class Transfer:
    """A release being received: `version`, the tar's `path`, bytes received so far (`size`)."""

    version: str
    path: Path
    size: int = 0


def receive_piece(transfer: Transfer | None, state_dir: Path, version: str, offset: int, data: bytes) -> Transfer:
    """Append one piece at `offset` of the release `version`'s tar (offset 0 starts a new transfer, dropping any
    other). Returns the transfer. Blocking (writes up to 1 MiB). Raises ReleaseError when the piece does not follow
    the last one received (a piece lost or sent twice: the control plane starts again from offset 0)."""
    if offset == 0:
        directory = Path(state_dir) / TRANSFER_DIR
        directory.mkdir(parents=True, exist_ok=True)
        transfer = Transfer(version, directory / TRANSFER_FILE)
        transfer.path.write_bytes(b"")
    elif transfer is None or transfer.version != version or transfer.size != offset:
        have = f"{transfer.size} bytes of {transfer.version}" if transfer else "nothing"
        raise ReleaseError(f"a piece of release {version} at offset {offset} does not follow what this agent holds "
                           f"({have}): send the release again from its start")
    with transfer.path.open("ab") as stream:
        stream.write(data)
    transfer.size += len(data)
    return transfer


def _trusted(keys: list[str], layout: InstallLayout) -> list:
    """The control plane's trusted key lines and the key that signed the release this agent runs (if recorded)."""
    trusted = trusted_public_keys(keys)
    own = layout.current / RECORD_DIR / PUBLIC_KEY_FILE
    if own.is_file():
        trusted.append(read_public_key(own))
    return trusted


def install_venv(venv: Path, wheels: Path, version: str) -> None:
    """Make the venv `venv` (llmgw.install.venvs) and install llmgw `version` into it from the wheels directory
    `wheels`, offline (as `llmgw node add` does, without compiling bytecode: the agent runs as root and writes it on
    first import, in the venv, for the modules it imports, where pip compiles every module of every wheel).
    Blocking (seconds to a minute). Raises ReleaseError in pip's words."""
    try:
        done = make_venv(venv)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseError(f"making the venv {venv} failed: {exc}") from exc
    _check(done, f"making the venv {venv}")
    argv = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index", "--no-compile",
            "--disable-pip-version-check", "--find-links", str(wheels), f"llmgw=={version}"]
    what = f"installing llmgw {version} from the release's wheels"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseError(f"{what} failed: {exc}") from exc
    _check(done, what)


def _check(done: subprocess.CompletedProcess, what: str) -> None:
    if done.returncode:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ReleaseError(f"{what} failed (exit {done.returncode}): {said[-1] if said else ''}")


def install_release(tar_path: Path, size: int, sha256: str, version: str, trusted_keys: list[str],
                    layout: InstallLayout, journal: Path | None = JOURNAL_PATH) -> Path:
    """Check the received tar (`size` bytes, `sha256`), verify the release in it and install it into
    <root>/<version> (the venv, llmgw from the release's wheels, the record of `llmgw.release.installed`). Returns
    the new venv. Does not flip `current` (`switch_current`). On a host `llmgw node add` installed (the install
    `journal` exists; None: none) the venv is recorded there before it is made, so `llmgw wipe` removes it too.
    Blocking: seconds to a minute (pip).
    Raises: ReleaseError saying what failed (a tar cut short or changed, a signature or digest that does not check,
    another version than announced, the version that runs already, pip's own words); nothing is left behind."""
    if version == layout.version:
        raise ReleaseError(f"this node runs llmgw {version} already")
    if not version or "/" in version or version.startswith("."):
        raise ReleaseError(f"{version!r} is not a release version")
    got = tar_path.stat().st_size
    if got != size:
        raise ReleaseError(f"the release tar holds {got} bytes, {size} were announced: send it again")
    if (digest := sha256_of(tar_path)) != sha256:
        raise ReleaseError(f"the release tar has sha256 {digest}, {sha256} was announced: send it again")
    scratch = layout.root / f".incoming-{version}"
    venv = layout.root / version
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        scratch.mkdir(parents=True)
        try:
            with tarfile.open(tar_path) as tar:
                extract_tar(tar, scratch)
        except tarfile.TarError as exc:
            raise ReleaseError(f"the release tar cannot be unpacked: {exc}") from exc
        for extra in ("SHA256SUMS", PUBLIC_KEY_FILE):  # beside the release, not in its manifest (release_tar)
            (scratch / extra).unlink(missing_ok=True)
        trusted = _trusted(trusted_keys, layout)
        manifest = verify_release(scratch, trusted)
        if manifest.version != version:
            raise ReleaseError(f"the release sent as {version} is llmgw {manifest.version}")
        shutil.rmtree(venv, ignore_errors=True)  # a try that failed before
        if journal is not None:
            record_on_installed_host(CreatedDirectory(str(venv)), journal)
        install_venv(venv, scratch / "wheels", version)
        record = venv / RECORD_DIR
        record.mkdir()
        for name in (MANIFEST, SIGNATURE):
            shutil.copy2(scratch / name, record / name)
        signer = next(key for key in trusted if key.id_text == manifest.key_id)
        (record / PUBLIC_KEY_FILE).write_text(signer.file_text())
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        tar_path.unlink(missing_ok=True)
    return venv


def switch_current(root: Path, version: str) -> None:
    """Point <root>/current at `version` atomically (a new link renamed over the old one)."""
    new = root / f".{CURRENT}.new"
    new.unlink(missing_ok=True)
    new.symlink_to(version)
    os.replace(new, root / CURRENT)


def mark_pending(state_dir: Path, layout: InstallLayout, version: str, confirm_seconds: float,
                 argv: list[str]) -> None:
    """Write <state>/upgrade-pending.json: the agent of `version` must confirm within `confirm_seconds` (unix
    deadline), else `layout.version` comes back, run with `argv` (the agent's arguments after `llmgw`)."""
    marker = {"from": layout.version, "to": version, "root": str(layout.root),
              "deadline_unix": time.time() + confirm_seconds, "confirm_seconds": confirm_seconds, "argv": argv}
    path = Path(state_dir) / PENDING
    path.write_text(json.dumps(marker, indent=2) + "\n")


def read_marker(state_dir: Path, name: str = PENDING) -> dict | None:
    """The pending (or rolled-back) marker's document, None when there is none or it cannot be read."""
    try:
        return json.loads((Path(state_dir) / name).read_text())
    except (OSError, ValueError):
        return None


def confirm(state_dir: Path, version: str) -> bool:
    """The agent of `version` is registered: remove the pending marker naming it (the watcher then exits), and the
    rolled-back record once it was reported. True when an upgrade was confirmed."""
    (Path(state_dir) / ROLLED_BACK).unlink(missing_ok=True)
    marker = read_marker(state_dir)
    if marker is None or marker.get("to") != version:
        return False
    (Path(state_dir) / PENDING).unlink(missing_ok=True)
    return True


def rolled_back_warning(state_dir: Path) -> str | None:
    """The sentence Register carries after a rollback (None: none happened since the last Register answered)."""
    record = read_marker(state_dir, ROLLED_BACK)
    if record is None:
        return None
    return f"the upgrade to llmgw {record.get('to')} was rolled back to {record.get('from')}: {record.get('reason')}"


def reexec_argv(state_dir: Path, argv: list[str]) -> list[str] | None:
    """The command line `llmgw agent` re-executes itself with after a restart: the new version's interpreter when an
    upgrade is pending and not yet started (None: the same interpreter as before). Starts the watcher first."""
    marker = read_marker(state_dir)
    if marker is None or marker.get("started"):
        return None
    marker["started"] = True
    marker["agent_pid"] = os.getpid()
    (Path(state_dir) / PENDING).write_text(json.dumps(marker, indent=2) + "\n")
    previous = Path(marker["root"]) / marker["from"] / "bin" / "python"  # not sys.executable: `current` moved
    watcher = [str(previous), "-P", "-m", "llmgw.agent.upgrade_watch", str(Path(state_dir).resolve())]
    subprocess.run(["setsid", "-f", *watcher], stdin=subprocess.DEVNULL, check=False, timeout=30)
    python = str(Path(marker["root"]) / marker["to"] / "bin" / "python")
    return [python, "-P", "-m", "llmgw.cli", *argv]
