"""llmgw.install.venvs: the venv a release goes into, made `--without-pip` with pip from ensurepip's own wheel, and
plain `python3 -m venv` wherever that wheel is not found or a step fails. The real venvs on hosts are those of
tests/install/test_fleet.py, test_node_add.py and test_upgrade_control_planes.py (their pip installs the release)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

from llmgw.install.venvs import make_venv, pip_wheel, venv_commands

Package = namedtuple("Package", ("version", "wheel_name", "wheel_path"))


def _runner(fail: set[int] = frozenset()):
    calls: list[tuple[list[str], dict[str, str]]] = []

    def run(argv, env):
        calls.append((list(argv), env))
        return subprocess.CompletedProcess(list(argv), 1 if len(calls) in fail else 0, "", "")
    return run, calls


def test_the_venv_is_made_without_pip_then_pip_installed_from_its_own_wheel_uncompiled_without_pip_settings(
        tmp_path, monkeypatch) -> None:
    wheel = tmp_path / "pip-23.0.1-py3-none-any.whl"
    venv = tmp_path / "venv"
    monkeypatch.setenv("PIP_INDEX_URL", "http://nowhere.invalid/simple")
    run, calls = _runner()
    done = make_venv(venv, run, wheel)
    assert done.returncode == 0
    assert [argv for argv, _ in calls] == venv_commands(venv, wheel=wheel) == [
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        [str(venv / "bin" / "python"), f"{wheel}/pip", "install", "--no-compile", "--no-index", "--no-cache-dir",
         "--disable-pip-version-check", "--quiet", str(wheel)]]
    env = calls[1][1]
    assert not any(name.startswith("PIP_") for name in env if name != "PIP_CONFIG_FILE")
    assert env["PIP_CONFIG_FILE"] == os.devnull


def test_a_failed_step_removes_the_venv_and_plain_python3_m_venv_decides(tmp_path) -> None:
    wheel = tmp_path / "pip-23.0.1-py3-none-any.whl"
    for failing in (1, 2):
        venv = tmp_path / f"venv{failing}"
        venv.mkdir()  # what the failed step left
        run, calls = _runner(fail={failing, failing + 1})
        done = make_venv(venv, run, wheel)
        assert not venv.exists()
        assert calls[-1][0] == [sys.executable, "-m", "venv", str(venv)] == done.args
        assert len(calls) == failing + 1 and done.returncode == 1  # the plain venv's own failure is the answer


def test_without_a_wheel_the_venv_is_plain_python3_m_venv(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("llmgw.install.venvs.pip_wheel", lambda: None)
    run, calls = _runner()
    make_venv(tmp_path / "venv", run)
    assert [argv for argv, _ in calls] == [[sys.executable, "-m", "venv", str(tmp_path / "venv")]]


def test_ensurepips_wheel_found_in_each_layout_none_where_it_is_not(tmp_path) -> None:
    shared = tmp_path / "python-wheels" / "pip-23.0.1-py3-none-any.whl"  # Debian's WHEEL_PKG_DIR
    shared.parent.mkdir()
    shared.write_bytes(b"wheel")
    package = tmp_path / "ensurepip"
    (package / "_bundled").mkdir(parents=True)
    (package / "_bundled" / "pip-24.0-py3-none-any.whl").write_bytes(b"wheel")
    module = str(package / "__init__.py")
    debian = SimpleNamespace(__file__=module, _get_packages=lambda: {"pip": Package("23.0.1", None, str(shared))})
    bundled = SimpleNamespace(__file__=module,
                              _get_packages=lambda: {"pip": Package("24.0", "pip-24.0-py3-none-any.whl", None)})
    newer = SimpleNamespace(__file__=module, _get_pip_whl_path_ctx=lambda: contextlib.nullcontext(shared))
    assert pip_wheel(debian) == shared and pip_wheel(newer) == shared
    assert pip_wheel(bundled) == package / "_bundled" / "pip-24.0-py3-none-any.whl"
    gone = SimpleNamespace(__file__=module, _get_packages=lambda: {"pip": Package("9", None, str(tmp_path / "x"))})
    changed = SimpleNamespace(__file__=module, _get_packages=lambda: {"setuptools": Package("1", None, None)})
    assert pip_wheel(gone) is None and pip_wheel(changed) is None
    assert pip_wheel(SimpleNamespace(__file__=module)) is None
    assert pip_wheel() is None or pip_wheel().name.startswith("pip-")  # this Python's, where it has one


def test_the_venv_verb_records_the_directory_before_making_it(tmp_path, monkeypatch) -> None:
    from llmgw.install import host

    made = []
    monkeypatch.setattr(host, "make_venv", lambda path: made.append(path) or subprocess.CompletedProcess([], 0))
    journal = tmp_path / "journal.json"
    host.run(["--journal", str(journal), "venv", str(tmp_path / "opt" / "0.1.0")])
    assert made == [tmp_path / "opt" / "0.1.0"]
    assert str(tmp_path / "opt" / "0.1.0") in Path(journal).read_text()
