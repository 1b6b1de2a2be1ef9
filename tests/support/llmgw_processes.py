"""`llmgw` commands run as real processes for one test or benchmark, all stopped at the end (process groups too)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


class LlmgwProcesses:
    """Processes of `python -m llmgw.cli ARGS`, each logging to `<root>/<name>.log` (appended to, so a process
    restarted under the same name keeps its earlier log). `engine_pids`: engines started behind the processes'
    backs (their process groups are killed by `stop`)."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: dict[str, subprocess.Popen] = {}
        self.engine_pids: set[int] = set()

    def spawn(self, name: str, *args: str, tree: Path | None = None) -> subprocess.Popen:
        """Start `llmgw ARGS` as `name` in a session of its own; with `tree`, the llmgw package of that directory
        (tree/llmgw: another release's code, `support.previous_release`) instead of this checkout's."""
        log = open(self.root / f"{name}.log", "ab")
        where = {} if tree is None else {"cwd": tree, "env": {**os.environ, "PYTHONPATH": str(tree)}}
        proc = subprocess.Popen([sys.executable, "-m", "llmgw.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, **where)
        self.procs[name] = proc
        return proc

    def stop(self) -> None:
        """SIGTERM every process, SIGKILL the groups of those still there after 15 s, then the engines' groups."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in self.engine_pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def read_server_banner(server: subprocess.Popen, timeout: float = 90) -> dict[str, list[str]]:
    """The lines `llmgw server` prints on stderr (a text pipe) once it serves, up to its "settings ..." line, by
    first word: {"admin": ["admin", "API", "http://127.0.0.1:PORT", ...], "agents": [...], "settings": [...]}.
    Raises AssertionError with what it printed when it ends first or takes longer than `timeout` seconds."""
    import time

    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while not (lines and lines[-1].startswith("settings ")):
        line = server.stderr.readline()
        assert line and time.monotonic() < deadline, f"llmgw server did not come up: {''.join(lines)}"
        lines.append(line)
    return {line.split()[0]: line.split() for line in lines if line.split()}
