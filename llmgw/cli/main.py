"""Entry point of the `llmgw` command.

Each verb group lives in its own module exposing `register(group: click.Group) -> None`; `main` turns every
LlmgwError into a one-paragraph message on stderr and exit status 1 (never a traceback).
"""

from __future__ import annotations

import importlib
import sys

import click

from llmgw import __version__
from llmgw.errors import LlmgwError

# Verb modules, in help order. Each defines register(group).
VERB_MODULES = (
    "llmgw.cli.settings_cmds",   # validate, diff, repo init
    "llmgw.cli.up_cmd",          # up
    "llmgw.cli.server_cmds",     # server, apply, status, history, stop, start, nodes, replicas, logs
    "llmgw.cli.keys_cmds",       # keys, usage
    "llmgw.cli.agent_cmds",      # agent, node join
    "llmgw.cli.node_cmds",       # node doctor
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmgw")
def cli() -> None:
    """Run LLM engines on your machines behind one OpenAI-compatible API, configured from a git repository."""


for _name in VERB_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as _exc:
        if _exc.name != _name:
            raise
        continue
    _module.register(cli)


def main(argv: list[str] | None = None) -> None:
    """Run the command line; exit 1 with a readable message on any LlmgwError."""
    try:
        cli.main(args=argv, prog_name="llmgw", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except LlmgwError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
