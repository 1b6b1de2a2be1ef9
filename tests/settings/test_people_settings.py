"""projects.yaml `people` (issue 36): who is an operator or a viewer, read with project membership into one
`Access` per e-mail; a person listed twice or a word that is not an e-mail fails `llmgw validate` at file:line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.settings import load_directory
from settings_trees import copy_example

PEOPLE = "people:\n  operators: [Ops@Lab.example]\n  viewers: [audit@lab.example]\n"


def _tree(tmp_path: Path, people: str, member: str = "ada@lab.example") -> Path:
    tree = copy_example(tmp_path / "settings")
    projects = tree / "projects.yaml"
    text = projects.read_text().replace("          demo:                  # `llmgw up` issues its first API key to this project\n",
                                        f"          demo:\n            members: [{member}]\n")
    assert f"members: [{member}]" in text
    projects.write_text(people + text)
    return tree


def test_roles_follow_people_and_project_members(tmp_path: Path) -> None:
    settings = load_directory(_tree(tmp_path, PEOPLE))
    assert settings.people.operators == ("ops@lab.example",)
    cases = {"ops@lab.example": ("operator", ()), "OPS@lab.example": ("operator", ()),
             "audit@lab.example": ("viewer", ()), "Ada@lab.example": ("member", ("demo",)),
             "nobody@lab.example": (None, ())}
    for email, (role, projects) in cases.items():
        access = settings.access_of(email)
        assert (access.role, access.projects) == (role, projects), email
    assert settings.access_of("ops@lab.example").may_change and not settings.access_of("audit@lab.example").may_change


@pytest.mark.parametrize("people,where,reason", [
    ("people:\n  operators: [ops@lab.example]\n  viewers: [OPS@lab.example]\n", "projects.yaml:3:13",
     "OPS@lab.example is already listed in people.operators: a person has one role"),
    ("people:\n  operators: [ops]\n", "projects.yaml:2:15", "'ops' is not an e-mail address"),
    ("people:\n  admins: [ops@lab.example]\n", "projects.yaml:2:3", "admins"),
])
def test_a_bad_people_entry_fails_validation_at_file_and_line(tmp_path: Path, people, where, reason) -> None:
    result = CliRunner().invoke(cli, ["validate", str(_tree(tmp_path, people))])
    assert result.exit_code == 1, result.output
    line = next((line for line in result.output.splitlines() if line.lstrip().startswith(where)), None)
    assert line is not None and reason in line, result.output
