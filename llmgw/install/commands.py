"""The processes llmgw.install runs (systemctl, nft, useradd, userdel, getent): one runner, one failure sentence."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from llmgw.errors import InstallError

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]
"""Runs an argv and returns it completed (tests and a remote host may pass their own)."""


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess:
    """Run `argv` (60 s at most), output captured as text. Raises InstallError when it cannot be started."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"`{' '.join(argv)}` could not run: {exc}") from exc


def check_command(done: subprocess.CompletedProcess, what: str) -> None:
    """Raise InstallError naming `what` and the command with its stderr when `done` failed."""
    if done.returncode:
        raise InstallError(f"{what}: `{' '.join(done.args)}` failed ({done.stderr.strip() or done.returncode}); "
                           "fix that and run `llmgw wipe` again")
