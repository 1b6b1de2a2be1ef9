"""Editors find the schemas inside a clone of a settings repository made by `llmgw repo init` (issue 19, item 11):
the first commit carries `.llmgw/schema/<kind>.json` and every settings file's yaml-language-server modeline points
at them by a relative path (the example's own modelines point into the source tree, wrong in a clone)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw.settings import init_repository, load_commit
from llmgw.settings.editors import schema_modeline, with_modeline
from llmgw.settings.packaged import example_dir, schema_dir

MODELINE = re.compile(r"# yaml-language-server: \$schema=(\S+)")


def _clone(bare: Path, target: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(bare), str(target)], check=True, timeout=60)
    return target


def test_every_settings_file_of_a_clone_names_a_schema_inside_the_clone(tmp_path: Path) -> None:
    bare = tmp_path / "cluster.git"
    init_repository(bare, example_dir())
    clone = _clone(bare, tmp_path / "clone")
    files = sorted(p for p in clone.rglob("*.yaml") if ".git" not in p.parts)
    assert len(files) == len(list(example_dir().rglob("*.yaml")))
    for path in files:
        match = MODELINE.fullmatch(path.read_text().splitlines()[0])
        assert match, path
        schema = (path.parent / match.group(1)).resolve()
        assert schema.is_relative_to(clone / ".llmgw" / "schema"), (path, schema)
        assert schema.read_bytes() == (schema_dir() / schema.name).read_bytes()


def test_the_seeded_commit_still_validates_and_keeps_the_seed_text_below_the_modeline(tmp_path: Path) -> None:
    bare = tmp_path / "cluster.git"
    init_repository(bare, example_dir())
    settings = load_commit(bare)
    assert "gemma-3-270m" in settings.models
    clone = _clone(bare, tmp_path / "clone")
    seeded = (clone / "engines.yaml").read_text().splitlines()
    original = (example_dir() / "engines.yaml").read_text().splitlines()
    assert seeded[0] == "# yaml-language-server: $schema=.llmgw/schema/engines.json"
    assert seeded[1:] == original[1:]


def test_a_seed_without_modelines_gets_them_and_other_files_stay_as_they_are(tmp_path: Path) -> None:
    seed = shutil.copytree(example_dir(), tmp_path / "seed")
    for path in seed.rglob("*.yaml"):
        path.write_text("\n".join(path.read_text().splitlines()[1:]) + "\n")
    (seed / "README.md").write_text("# our cluster\n")
    bare = tmp_path / "cluster.git"
    init_repository(bare, seed)
    clone = _clone(bare, tmp_path / "clone")
    assert (clone / "agents" / "nodes" / "gpu-node-01.yaml").read_text().startswith(
        "# yaml-language-server: $schema=../../.llmgw/schema/agent.json\n")
    assert (clone / "README.md").read_text() == "# our cluster\n"


@pytest.mark.parametrize("path,kind,modeline", [
    ("llmgw.yaml", "llmgw", "# yaml-language-server: $schema=.llmgw/schema/llmgw.json"),
    ("catalog/m.yaml", "model", "# yaml-language-server: $schema=../.llmgw/schema/model.json"),
    ("agents/nodes/n1.yaml", "agent", "# yaml-language-server: $schema=../../.llmgw/schema/agent.json"),
])
def test_modelines_are_relative_to_the_file(path: str, kind: str, modeline: str) -> None:
    assert schema_modeline(path, kind) == modeline


@pytest.mark.parametrize("text,expected", [
    ("# yaml-language-server: $schema=../../schema/model.json\nname: m\n", "NEW\nname: m\n"),
    ("# yaml-language-server: $schema=x.json\r\nname: m\r\n", "NEW\r\nname: m\r\n"),
    ("# a comment\nname: m\n", "NEW\n# a comment\nname: m\n"),
    ("", "NEW\n"),
])
def test_an_existing_modeline_is_replaced_and_a_missing_one_added(text: str, expected: str) -> None:
    assert with_modeline(text, "NEW") == expected
