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

# Which module registers each top-level command (each module defines `register(group)`). Modules are imported
# only when their command runs (or `--help` lists them), so `llmgw agent` loads none of the control plane and a
# quick `llmgw status` none of the agent. This index cannot be derived from the modules without importing them all
# (0.5 to 4 s each): tests/core/test_command_index.py checks it against what each module registers.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "validate": ("llmgw.cli.settings_cmds",),
    "diff": ("llmgw.cli.settings_cmds",),
    "repo": ("llmgw.cli.settings_cmds",),
    "up": ("llmgw.cli.up_cmd",),
    "server": ("llmgw.cli.server_cmds", "llmgw.cli.server_add", "llmgw.cli.server_upgrade"),
    **{name: ("llmgw.cli.server_cmds",) for name in (
        "apply", "plan", "status", "history", "stop", "start", "nodes", "replicas", "logs", "join-token", "restart",
        "fabric-test",
    )},
    "bench": ("llmgw.cli.bench_cmds",),
    "review": ("llmgw.cli.review_cmds",),
    "forecast-check": ("llmgw.cli.forecast_cmds",),
    "canaries": ("llmgw.cli.canary_cmds",),
    "fleet": ("llmgw.cli.review_cmds",),
    "keys": ("llmgw.cli.keys_cmds",),
    "usage": ("llmgw.cli.keys_cmds",),
    "token": ("llmgw.cli.token_cmds",),
    "users": ("llmgw.cli.users_cmds",),
    "store": ("llmgw.cli.store_cmds",),
    "purge": ("llmgw.cli.store_cmds",),
    "agent": ("llmgw.cli.agent_cmds",),
    # node join (agent), node doctor (discovery), node cordon|uncordon|drain (settings commits), node add (ssh)
    "node": ("llmgw.cli.agent_cmds", "llmgw.cli.node_cmds", "llmgw.cli.slurm_cmds", "llmgw.cli.node_add",
             "llmgw.cli.node_remove"),
    "slurm": ("llmgw.cli.slurm_cmds",),
    "model": ("llmgw.cli.model_cmds",),
    "train": ("llmgw.cli.train_cmds",),
    "firewall": ("llmgw.cli.firewall_cmds",),
    "wipe": ("llmgw.cli.wipe_cmd",),
    "release": ("llmgw.cli.release_cmds",),
    "bundle": ("llmgw.cli.bundle_cmds",),
    "upgrade": ("llmgw.cli.upgrade_cmds",),
    "backup": ("llmgw.cli.backup_cmds",),
    "ca": ("llmgw.cli.ca_cmds",),
    "restore": ("llmgw.cli.backup_cmds",),
}


class LazyGroup(click.Group):
    """A click group whose commands are imported from COMMAND_MODULES on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMAND_MODULES) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            scratch = click.Group()
            for module in COMMAND_MODULES[cmd_name]:
                importlib.import_module(module).register(scratch)
            self.commands[cmd_name] = scratch.commands[cmd_name]
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmgw")
def cli() -> None:
    """Run LLM engines on your machines behind one OpenAI-compatible API, configured from a git repository."""


def main(argv: list[str] | None = None) -> None:
    """Run the command line; exit 1 with a readable message on any LlmgwError."""
    try:
        code = cli.main(args=argv, prog_name="llmgw", standalone_mode=False)
        if isinstance(code, int) and code:  # not standalone, click returns an explicit Exit's code (click 8.x)
            sys.exit(code)
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
    except BaseExceptionGroup as group:
        # Errors raised inside trio nurseries arrive grouped; when every one is ours, each is a sentence.
        from llmgw.groups import expect_leaves  # imports trio: only on this path, not at every start

        for exc in expect_leaves(group, LlmgwError):
            click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":  # `python -m llmgw.cli.main`, as `llmgw server` re-executes itself after `llmgw restart`
    main()
