"""`python -m llmgw.agent.upgrade_watch STATE_DIR`: roll an upgrade back when the new agent does not confirm in time.

Started by `llmgw agent` from the previous version's venv just before it re-executes itself from the new one
(`llmgw.agent.upgrading.reexec_argv`), in a session of its own, so it outlives whatever the new version does. Every
`POLL` seconds it reads <state>/upgrade-pending.json: gone means the new agent confirmed (it registered), and the
watcher exits. The agent's pid gone (it exited at start), or the deadline passed, it rolls back: `current` points
at the previous version again, <state>/upgrade-rolled-back.json says why, the new agent (if it still runs) gets
SIGTERM (its engines keep running), and the previous version's agent is started with the same arguments, its output
where the watcher's goes (the agent's log). Under systemd (INVOCATION_ID set) the unit starts it again instead.
Exit status 0 confirmed, 1 rolled back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from llmgw.agent.upgrading import PENDING, ROLLED_BACK, read_marker, switch_current

POLL = 0.2
STOP_GRACE = 10.0


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def watch(state_dir: Path) -> int:
    """Wait for the confirmation or roll back (module docstring). Returns the exit status."""
    while True:
        marker = read_marker(state_dir)
        if marker is None:
            return 0
        pid = int(marker.get("agent_pid") or 0)
        gone = pid and not _alive(pid)
        late = time.time() > float(marker["deadline_unix"])
        if gone or late:
            break
        time.sleep(POLL)
    reason = (f"the agent of llmgw {marker['to']} exited before it registered" if gone else
              f"the agent of llmgw {marker['to']} did not register within {marker['confirm_seconds']:g} s")
    root = Path(marker["root"])
    switch_current(root, marker["from"])
    (state_dir / ROLLED_BACK).write_text(json.dumps({**marker, "reason": reason}, indent=2) + "\n")
    (state_dir / PENDING).unlink(missing_ok=True)
    print(f"llmgw upgrade watcher: {reason}; rolled back to {marker['from']}", file=sys.stderr, flush=True)
    if pid and not gone:
        _stop(pid)
    if not os.environ.get("INVOCATION_ID"):  # systemd starts the unit again itself (Restart=always)
        python = str(root / marker["from"] / "bin" / "python")
        subprocess.Popen([python, "-P", "-m", "llmgw.cli", *marker["argv"]], stdin=subprocess.DEVNULL,
                         start_new_session=True)
    return 1


if __name__ == "__main__":
    sys.exit(watch(Path(sys.argv[1])))
