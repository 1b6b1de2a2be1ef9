"""`llmgw ARGS` run in the test's own process, as its console script runs it (`llmgw.cli.main.main`: its error
handling included), for tests about what a command says rather than about the process boundary: a process start
costs about a second of imports (several on a loaded machine)."""

from __future__ import annotations

import os
import subprocess
import traceback
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner


def run_llmgw(args: list[str], env: Mapping[str, str | None] | None = None,
              cwd: Path | None = None) -> tuple[int, str, str]:
    """Run `llmgw ARGS` with `env` set over the environment (a None value unsets that variable) and in `cwd` (both
    restored after): (exit status, stdout, stderr). An exception that escapes `main` is written to stderr as the interpreter would print it, with
    exit status 1. Blocking; sys.stdout, sys.stderr, the environment and the working directory are this process's,
    so only one command runs at a time (a test's trio loop may run meanwhile: its logging keeps its own streams)."""
    from llmgw.cli.main import main

    code = 0
    before = os.getcwd()
    with CliRunner().isolation(env=dict(env or {})) as (out, err, _both):
        try:
            if cwd is not None:
                os.chdir(cwd)
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:  # noqa: BLE001 -- as an uncaught exception ends a real process: its traceback, exit 1
            traceback.print_exc()
            code = 1
        finally:
            os.chdir(before)
        return code, out.getvalue().decode(), err.getvalue().decode()


def completed(args: list[str], env: Mapping[str, str | None] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`run_llmgw(args, env, cwd)` as a `subprocess.CompletedProcess` (args ["llmgw", *args], returncode, stdout and
    stderr as text), for tests that read what `subprocess.run` returns."""
    code, out, err = run_llmgw(args, env, cwd)
    return subprocess.CompletedProcess(["llmgw", *args], code, out, err)
