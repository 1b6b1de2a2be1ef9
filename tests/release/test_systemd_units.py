"""Every unit in deploy/systemd/ passes the real `systemd-analyze verify` with nothing on stderr (it only warns on an
unknown key and still exits 0, so any stderr fails), and docs/install.md states the exposure score that
`systemd-analyze security --offline=true` gives each one today. Offline: PID 1 need not be systemd.

verify looks for the binary of ExecStart=, which lives in /opt/llmgw/current once a release is installed: the units
are checked under `--root` of a scratch tree holding the machine's own unit directory (for the targets they name),
the unit, and an executable at /opt/llmgw/current/bin/llmgw. Fails, never skips, without systemd-analyze (`make
system-packages`: Debian systemd). About 1 s."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
INSTALL_DOC = ROOT / "docs" / "install.md"


@pytest.fixture(scope="module")
def analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing: run `make system-packages` (Debian package systemd)"
    return found


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A file system root for `--root`: the machine's units, /opt/llmgw/current/bin/llmgw, /etc/systemd/system."""
    shutil.copytree("/usr/lib/systemd/system", tmp_path / "usr/lib/systemd/system", symlinks=True)
    binary = tmp_path / "opt/llmgw/current/bin/llmgw"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    return tmp_path


def verify(analyze: str, root: Path, name: str, text: str) -> subprocess.CompletedProcess:
    (root / "etc/systemd/system" / name).write_text(text)
    return subprocess.run([analyze, "verify", f"--root={root}", name], capture_output=True, text=True, timeout=60)


def test_the_units_are_there() -> None:
    assert [unit.name for unit in UNITS] == ["llmgw-agent.service", "llmgw-server.service"]


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_each_unit_passes_systemd_analyze_verify_with_empty_stderr(analyze: str, root: Path, unit: Path) -> None:
    checked = verify(analyze, root, unit.name, unit.read_text())
    assert (checked.returncode, checked.stderr) == (0, "")


def test_the_check_fails_on_a_misspelt_key_and_a_missing_binary(analyze: str, root: Path) -> None:
    unit = UNITS[0]
    misspelt = verify(analyze, root, unit.name, unit.read_text().replace("RestartSec=", "RestartSecs="))
    assert "Unknown key 'RestartSecs' in section [Service]" in misspelt.stderr
    (root / "opt/llmgw/current/bin/llmgw").unlink()
    missing = verify(analyze, root, unit.name, unit.read_text())
    assert "/opt/llmgw/current/bin/llmgw is not executable" in missing.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_docs_state_the_exposure_systemd_analyze_security_gives_each_unit(analyze: str, root: Path,
                                                                          unit: Path) -> None:
    (root / "etc/systemd/system" / unit.name).write_text(unit.read_text())
    scored = subprocess.run([analyze, "security", "--offline=true", f"--root={root}", "--no-pager", unit.name],
                            capture_output=True, text=True, timeout=60)
    match = re.search(rf"Overall exposure level for {re.escape(unit.name)}: (\d+\.\d) (\w+)", scored.stdout)
    assert match, scored.stdout + scored.stderr
    row = f"| `{unit.name}` | {match.group(1)} {match.group(2)} |"
    assert row in INSTALL_DOC.read_text(), f"docs/install.md should hold the row {row!r} (Units: scores)"
