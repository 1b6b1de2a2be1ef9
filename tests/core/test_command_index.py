"""`llmgw`'s command index (`llmgw.cli.main.COMMAND_MODULES`: which module registers each top-level command, so a
command imports only its own module) agrees with what the modules register, and every command is listed by
`llmgw --help` and found."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from llmgw.cli.main import COMMAND_MODULES, cli

MODULES = sorted({module for modules in COMMAND_MODULES.values() for module in modules})


@pytest.mark.parametrize("module", MODULES)
def test_each_module_registers_exactly_the_commands_the_index_gives_it(module):
    scratch = click.Group()
    importlib.import_module(module).register(scratch)
    assert set(scratch.commands) == {name for name, modules in COMMAND_MODULES.items() if module in modules}


def test_help_lists_every_command_and_each_one_is_found():
    listed = CliRunner().invoke(cli, ["--help"]).output
    for name in COMMAND_MODULES:
        assert f"  {name} " in listed
        assert CliRunner().invoke(cli, [name, "--help"]).exit_code == 0, name
