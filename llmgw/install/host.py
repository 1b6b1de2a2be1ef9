"""The install journal's verbs on a host, for `llmgw node add` over ssh: `python3 -m llmgw.install.host VERB ...`.

Runs with nothing but the host's Python 3.11+ and llmgw's own wheel on PYTHONPATH (llmgw.install needs only the
standard library), before any virtual environment exists there:

    mkdir PATH [--mode 0755] [--weights]     make PATH and its missing parents, each recorded
    write PATH [--mode 0644]                 write stdin to PATH atomically (a file replaced is kept for undo)
    link PATH TARGET                         point the link PATH at TARGET
    venv DIR                                 record DIR, then make the venv DIR with pip (llmgw.install.venvs: without
                                             ensurepip's setuptools; a failure leaves it recorded)
    unit NAME                                record the unit, then `systemctl enable --now NAME` where systemd runs
    undo                                     undo the whole journal, newest first (`llmgw wipe --yes`, no weights kept)

Each verb records before it acts (llmgw.install.journal), so an ssh connection cut at any point leaves a journal of
what was done. Exit status 0, or 1 with one line on stderr (InstallError, or the failed command's own words).
`--journal PATH` (before the verb) overrides /var/lib/llmgw-install/journal.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from llmgw.errors import InstallError
from llmgw.install.commands import check_command, run_command
from llmgw.install.journal import JOURNAL_PATH, CreatedDirectory, InstalledUnit, Journal
from llmgw.install.undoing import undo
from llmgw.install.venvs import make_venv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m llmgw.install.host", description=__doc__.split("\n\n")[0])
    parser.add_argument("--journal", type=Path, default=JOURNAL_PATH)
    verbs = parser.add_subparsers(dest="verb", required=True)
    mkdir = verbs.add_parser("mkdir")
    mkdir.add_argument("path", type=Path)
    mkdir.add_argument("--mode", type=lambda text: int(text, 8), default=0o755)
    mkdir.add_argument("--weights", action="store_true")
    write = verbs.add_parser("write")
    write.add_argument("path", type=Path)
    write.add_argument("--mode", type=lambda text: int(text, 8), default=0o644)
    link = verbs.add_parser("link")
    link.add_argument("path", type=Path)
    link.add_argument("target")
    verbs.add_parser("venv").add_argument("path", type=Path)
    verbs.add_parser("unit").add_argument("name")
    verbs.add_parser("undo")
    return parser


def run(argv: list[str]) -> None:
    """Carry out one verb (module docstring). Raises InstallError saying what failed."""
    args = _parser().parse_args(argv)
    if args.verb == "undo":
        if args.journal.exists():
            undo(Journal.read(args.journal))
        return
    journal = Journal.open(args.journal)
    if args.verb == "mkdir":
        journal.make_dirs(args.path, mode=args.mode, weights=args.weights)
    elif args.verb == "write":
        journal.write_file(args.path, sys.stdin.buffer.read(), mode=args.mode)
    elif args.verb == "link":
        journal.symlink(args.path, args.target)
    elif args.verb == "venv":
        if args.path.exists():
            raise InstallError(f"{args.path} exists already: llmgw installs each release once (`llmgw wipe` first)")
        journal.record(CreatedDirectory(str(args.path)))
        check_command(make_venv(args.path), f"venv {args.path}")
    elif args.verb == "unit":
        if Path("/run/systemd/system").is_dir():
            journal.record(InstalledUnit(args.name, enabled=True, started=True))
            check_command(run_command(["systemctl", "daemon-reload"]), f"unit {args.name}")
            check_command(run_command(["systemctl", "enable", "--now", args.name]), f"unit {args.name}")


def main() -> None:
    try:
        run(sys.argv[1:])
    except (InstallError, OSError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
