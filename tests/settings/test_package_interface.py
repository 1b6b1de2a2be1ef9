"""llmgw.settings imports each name of its interface when first read (`_EXPORTS`, PEP 562), and lists the same
imports under TYPE_CHECKING for type checkers and import-linter: the two lists must agree, every name must resolve
to its submodule's object, and a light submodule must not bring the settings model with it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import llmgw.settings as settings


def _type_checking_imports() -> dict[str, set[str]]:
    tree = ast.parse(Path(settings.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    found: dict[str, set[str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module.startswith("llmgw.settings.")
        found.setdefault(node.module.rsplit(".", 1)[1], set()).update(alias.name for alias in node.names)
    return found


def test_the_lazy_exports_and_the_type_checking_imports_are_the_same_names() -> None:
    assert _type_checking_imports() == {module: set(names) for module, names in settings._EXPORTS.items()}


def test_every_exported_name_is_its_submodules_object() -> None:
    for module, names in settings._EXPORTS.items():
        source = importlib.import_module(f"llmgw.settings.{module}")
        for name in names:
            assert getattr(settings, name) is getattr(source, name), name
    assert sorted(dir(settings)) == sorted(set(dir(settings)) | set(settings.__all__))


def test_the_post_receive_module_does_not_import_the_settings_model() -> None:
    code = ("import sys, llmgw.settings.post_receive; "
            "print(sorted(m for m in ('llmgw.settings.model', 'jsonschema', 'ruamel.yaml') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
