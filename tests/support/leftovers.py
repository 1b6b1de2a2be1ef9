"""Processes a test left behind: engines outlive their agent by design (an agent that exits leaves its shards to be
adopted by the next one), so a test that fails before its own teardown stops them leaves relays and engines running
on the machine for the rest of the run. `kill_processes_naming(tmp_path)` in a `finally` ends them."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def kill_processes_naming(text: str | Path) -> list[int]:
    """SIGKILL every process of this machine whose command line contains `text` (a test's own `tmp_path`: its
    engines' command lines name their weights there), except this process; the pids signalled. Processes that end
    meanwhile or cannot be read are skipped. Reads /proc (Linux)."""
    needle, mine, killed = os.fsencode(str(text)), os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    return killed
