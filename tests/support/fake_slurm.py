"""Stand-ins for Slurm's programs, for an agent's Slurm keeper (llmgw.agent.slurm) in tests that need the part of a
Slurm node that is not Slurm (its Linux users, their homes and SSH keys) and no Slurm: `fake_slurm(directory)` writes
munged, slurmd, scontrol and squeue there and returns them by name (AgentConfig.slurm_programs).

munged makes its socket's file and waits; slurmd waits (and prints a version for `-V`); `scontrol show node N` shows
N idle and drained by llmgw, `scontrol update` succeeds; squeue lists no job. Each waiting one ends on SIGTERM."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

PROGRAMS = ("munged", "slurmd", "scontrol", "squeue")


def fake_slurm(directory: Path) -> dict[str, str]:
    """The stand-ins written under `directory` (created), by program name: each a shell wrapper running this file
    with this interpreter and its own name first."""
    directory.mkdir(parents=True, exist_ok=True)
    programs = {}
    for name in PROGRAMS:
        path = directory / name
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(__file__)} {name} \"$@\"\n")
        path.chmod(0o755)
        programs[name] = str(path)
    return programs


def main(name: str, args: list[str]) -> int:
    if name == "munged":
        socket = next(a.split("=", 1)[1] for a in args if a.startswith("--socket="))
        Path(socket).touch()
    elif name == "slurmd" and "-V" in args:
        print("slurm 22.05.8 (stand-in)")
        return 0
    elif name == "scontrol":
        if args[:2] == ["show", "node"]:
            print(f"NodeName={args[2]} State=IDLE+DRAIN CPUTot=1 RealMemory=1024 Reason=llmgw: not lent")
        return 0
    elif name == "squeue":
        return 0
    while True:  # a daemon: until SIGTERM
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
