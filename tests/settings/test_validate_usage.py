"""`llmgw validate` given something that is no settings tree: one sentence saying what to give, exit 2 (a usage
error), not one "is not a settings file" per YAML file nor a path read as a git revision."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from settings_trees import commit_tree, copy_example


def test_a_source_checkout_is_named_as_no_settings_tree_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What llmgw's own repository root looks like: YAML files, none of them settings.
    for name in ("docs/admin-api.yaml", "deploy/prometheus/alerts.yaml", "examples/ci/github/review.yml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("a: 1\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["validate"])
    assert result.exit_code == 2, result.output
    assert "is not a settings tree" in result.output and "--repo" in result.output
    assert "is not a settings file" not in result.output


def test_a_missing_directory_is_named_as_such_not_as_a_revision(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    repo = pygit2.init_repository(str(tmp_path / "repo"), initial_head="main")
    commit_tree(repo, copy_example(tmp_path / "tree"), "seed")
    monkeypatch.chdir(tmp_path / "repo")
    for missing in (str(tmp_path / "nonexistent"), "settings/typo", "nonexist"):
        result = CliRunner().invoke(cli, ["validate", missing])
        assert result.exit_code == 2, result.output
        assert f"{missing}: no such directory" in result.output and "names no commit" not in result.output


def test_a_revision_with_a_slash_still_validates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = pygit2.init_repository(str(tmp_path / "repo"), initial_head="main")
    commit_tree(repo, copy_example(tmp_path / "tree"), "seed")
    repo.references.create("refs/heads/team/x", repo.references["refs/heads/main"].target)
    monkeypatch.chdir(tmp_path / "repo")
    result = CliRunner().invoke(cli, ["validate", "team/x"])
    assert result.exit_code == 0 and "valid: 4 models" in result.output, result.output
