"""`llmgw wipe`: take llmgw off this machine, exactly what its install journal lists.

    llmgw wipe [--yes] [--keep-weights] [--stop-agent] [--journal PATH]

Lists every entry of the journal (llmgw.install: units, directories, files, links, users, firewall tables), newest
first, with the bytes each holds on disk, asks, then undoes them (llmgw.install.undoing). Nothing that the journal
does not list is touched. Refused while an llmgw agent runs on this machine: the agent keeps no local record of
whether it is connected or drained, so a running agent (its systemd unit active, or an `llmgw agent` process) is
taken to be serving. Drain the node (`llmgw node drain NODE` on the control plane), stop the agent, then wipe;
`--stop-agent` stops it here first (what `llmgw node remove` runs over ssh once the control plane drained the node).
Exit status: 0 wiped (or nothing to wipe), 1 refused or failed (the journal then lists what is left), 130 declined.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from llmgw.errors import UsageError

AGENT_UNIT = "llmgw-agent.service"
_PROGRAMS = {"llmgw", "llmgw.cli", "llmgw.cli.main"}


def running_agents(proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """The `llmgw agent` processes on this machine (`llmgw agent ...`, `python -m llmgw.cli agent ...`), as
    (pid, command line), this process left out. Reads /proc; a process that ends meanwhile is skipped."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for index, word in enumerate(argv[:-1]):
            if os.path.basename(word) in _PROGRAMS and argv[index + 1] == "agent":
                found.append((int(entry.name), " ".join(argv).strip()))
                break
    return sorted(found)


def _unit_active(name: str) -> bool:
    """True when systemd is PID 1 here and says the unit is active."""
    if not Path("/run/systemd/system").is_dir():
        return False
    from llmgw.install import run_command

    return run_command(["systemctl", "is-active", "--quiet", name]).returncode == 0


AGENT_STOP_SECONDS = 30.0
"""Seconds `llmgw wipe --stop-agent` waits for an agent process to end after SIGTERM before it sends SIGKILL."""


def stop_agents() -> list[str]:
    """Stop the llmgw agent here (`--stop-agent`): `systemctl stop` its unit where it is active, and SIGTERM each
    `llmgw agent` process (SIGKILL after AGENT_STOP_SECONDS); what was stopped, one phrase each. Blocking."""
    import signal
    import time

    stopped = []
    if _unit_active(AGENT_UNIT):
        from llmgw.install import run_command

        run_command(["systemctl", "stop", AGENT_UNIT])
        stopped.append(AGENT_UNIT)
    for pid, _command in running_agents():
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + AGENT_STOP_SECONDS
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stopped.append(f"the agent process {pid}")
    return stopped


def refuse_while_an_agent_runs() -> None:
    """Raise UsageError naming the agent process (or unit) when one runs here (module docstring)."""
    agents = running_agents()
    if agents or _unit_active(AGENT_UNIT):
        what = (f"{AGENT_UNIT} is active" if not agents
                else "an llmgw agent runs here: " + "; ".join(f"pid {pid}: {cmd}" for pid, cmd in agents))
        raise UsageError(
            f"{what}. It may be connected and serving, and llmgw cannot tell from this machine whether the node is "
            "drained: drain it first (`llmgw node drain NODE` on the control plane), stop the agent (`systemctl "
            f"stop {AGENT_UNIT}`, or end that process), then run `llmgw wipe` again. Nothing was removed.")


@click.command("wipe")
@click.option("--yes", is_flag=True, help="Do not ask: remove what the journal lists.")
@click.option("--keep-weights", is_flag=True,
              help="Keep the weights directories (and the journal, which still lists them for a later wipe).")
@click.option("--stop-agent", is_flag=True,
              help="Stop the llmgw agent here first instead of refusing (`llmgw node remove` does so once the "
                   "control plane has drained the node).")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The install journal [default: /var/lib/llmgw-install/journal.json].")
def wipe_cmd(yes: bool, keep_weights: bool, stop_agent: bool, journal_path: Path | None) -> None:
    """Remove from this machine exactly what llmgw installed on it (its install journal), after listing it."""
    from llmgw.install import JOURNAL_PATH, Journal, undo
    from llmgw.install.wiping import listing, summary

    journal = Journal.read(journal_path or JOURNAL_PATH)
    if stop_agent:
        for what in stop_agents():
            click.echo(f"stopped {what}")
    refuse_while_an_agent_runs()
    lines, _ = listing(journal, keep_weights)
    click.echo("\n".join(lines))
    if not yes:
        click.confirm("Remove all of this?", abort=True)
    outcomes = undo(journal, keep_weights=keep_weights)
    click.echo("\n".join(summary(outcomes, journal)))


def register(group: click.Group) -> None:
    group.add_command(wipe_cmd)
