"""llmgw.settings and llmgw.control import each name of their interface when first read (`_EXPORTS`, PEP 562,
llmgw.lazy_exports), and list the same imports under TYPE_CHECKING for type checkers and import-linter: the two
lists must agree, every name must resolve to its submodule's object, and a light submodule must not bring the rest
of its package with it (the post-receive hook, `llmgw status` and the other admin API commands start in a fraction
of the time)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ["llmgw.settings", "llmgw.control"]


def _type_checking_imports(package) -> dict[str, set[str]]:
    tree = ast.parse(Path(package.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    found: dict[str, set[str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module.startswith(f"{package.__name__}.")
        found.setdefault(node.module.rsplit(".", 1)[1], set()).update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("name", PACKAGES)
def test_the_lazy_exports_and_the_type_checking_imports_are_the_same_names(name) -> None:
    package = importlib.import_module(name)
    assert _type_checking_imports(package) == {module: set(names) for module, names in package._EXPORTS.items()}


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_is_its_submodules_object(name) -> None:
    package = importlib.import_module(name)
    for module, names in package._EXPORTS.items():
        source = importlib.import_module(f"{name}.{module}")
        for exported in names:
            assert getattr(package, exported) is getattr(source, exported), exported
    assert sorted(package.__all__) == sorted(n for names in package._EXPORTS.values() for n in names)
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'not_exported'"):
        package.not_exported  # noqa: B018


def _imported_after(code: str, modules: tuple[str, ...]) -> list[str]:
    code = f"import sys; {code}; print(sorted(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(done.stdout)  # a list of str printed by the child  # noqa: S307


def test_the_post_receive_module_does_not_import_the_settings_model() -> None:
    assert _imported_after("import llmgw.settings.post_receive",
                           ("llmgw.settings.model", "jsonschema", "ruamel.yaml")) == []


def test_the_admin_api_commands_do_not_import_the_control_plane() -> None:
    """`llmgw status` (and apply, plan, nodes, ...: llmgw.cli.server_cmds) talks to the admin API over HTTP: it loads
    neither the deciding, the loop, the gateway, the store nor the wire."""
    found = _imported_after(
        "from llmgw.cli.main import cli; import click; cli.get_command(click.Context(cli), 'status')",
        ("llmgw.control.deciding", "llmgw.control.looping", "llmgw.gateway", "llmgw.store", "llmgw.wire",
         "llmgw.control.plane"))
    assert found == []
