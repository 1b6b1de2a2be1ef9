"""Loading from any commit of a git repository, bare or not, with the same refusals as a directory."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pygit2
import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.errors import SettingsError
from llmgw.settings import load_commit, load_directory
from settings_trees import commit_tree, copy_example


@pytest.fixture
def bare(tmp_path: Path) -> tuple[Path, Path]:
    tree = copy_example(tmp_path / "tree")
    repo = pygit2.init_repository(str(tmp_path / "repo.git"), bare=True, initial_head="main")
    commit_tree(repo, tree, "seed")
    return tmp_path / "repo.git", tree


def test_a_commit_loads_the_same_settings_as_its_directory(bare: tuple[Path, Path]) -> None:
    repo_path, tree = bare
    from_git = load_commit(repo_path)
    assert from_git == load_directory(tree)
    assert from_git.commit == str(pygit2.Repository(str(repo_path)).references["refs/heads/main"].target)
    assert load_directory(tree).commit is None


def test_any_revision_loads_by_branch_tag_or_id(bare: tuple[Path, Path]) -> None:
    repo_path, tree = bare
    repo = pygit2.Repository(str(repo_path))
    first = str(repo.references["refs/heads/main"].target)
    repo.references.create("refs/tags/v1", repo.references["refs/heads/main"].target)
    (tree / "catalog" / "gemma-3-270m.yaml").write_text((tree / "catalog" / "gemma-3-270m.yaml").read_text().replace("replicas: 1\n", "replicas: 4\n"))
    second = commit_tree(repo, tree, "scale")
    assert load_commit(repo_path, "main").models["gemma-3-270m"].replicas == 4
    assert load_commit(repo_path, "v1").models["gemma-3-270m"].replicas == 1
    assert load_commit(repo_path, first[:10]).commit == first
    assert load_commit(repo_path, "main~1").commit == first
    assert load_commit(repo_path, second).commit == second


def test_a_working_clone_loads_without_its_git_directory(bare: tuple[Path, Path], tmp_path: Path) -> None:
    repo_path, _ = bare
    subprocess.run(["git", "clone", "-q", str(repo_path), str(tmp_path / "clone")], check=True)
    assert load_commit(tmp_path / "clone", "HEAD") == load_directory(tmp_path / "clone")
    result = CliRunner().invoke(cli, ["validate", "--repo", str(tmp_path / "clone"), "main"])
    assert result.exit_code == 0 and "valid: 4 models" in result.output


def test_symlinks_and_big_blobs_in_a_commit_are_refused(bare: tuple[Path, Path]) -> None:
    repo_path, tree = bare
    os.symlink("gemma-3-270m.yaml", tree / "catalog" / "alias.yaml")
    (tree / "catalog" / "huge.yaml").write_text("engine: llama.cpp\n" + "#" * (1024 * 1024 + 1) + "\n")
    commit_tree(pygit2.Repository(str(repo_path)), tree, "bad")
    with pytest.raises(SettingsError) as caught:
        load_commit(repo_path)
    messages = sorted(str(i) for i in caught.value.issues if i.severity == "error")
    assert messages[0].startswith("catalog/alias.yaml: is a symbolic link")
    assert messages[1].startswith("catalog/huge.yaml: file is 1048596 bytes, over the limit")
    assert len(messages) == 2


def test_an_unknown_revision_or_repository_is_a_settings_error(bare: tuple[Path, Path], tmp_path: Path) -> None:
    repo_path, _ = bare
    with pytest.raises(SettingsError, match="names no commit"):
        load_commit(repo_path, "no-such-branch")
    with pytest.raises(SettingsError, match="is not a git repository"):
        load_commit(tmp_path / "nowhere")


def test_validate_lists_every_error_of_every_file_in_order(example_tree: Path) -> None:
    gemma = example_tree / "catalog" / "gemma-3-270m.yaml"
    gemma.write_text(gemma.read_text().replace("replicas: 1\n", "replicas: -1\n").replace("memory: 1Gi", "memory: lots"))
    (example_tree / "slurm.yaml").write_text("enabled: false\ncontroller: 7\n")
    result = CliRunner().invoke(cli, ["validate", str(example_tree)])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines == [
        "catalog/gemma-3-270m.yaml:13:11: replicas: -1 is less than the minimum of 0",
        "catalog/gemma-3-270m.yaml:18:11: resources.memory: 'lots' is not a size: write e.g. 512Mi, 16Gi or 1.5T",
        "slurm.yaml:2:13: controller: 7 is not a string: YAML read the value as a number; put it in quotes",
        "3 errors",
    ]


def test_validate_takes_a_revision_of_the_repository_around_the_current_directory(
        bare: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo_path, _ = bare
    subprocess.run(["git", "clone", "-q", str(repo_path), str(tmp_path / "clone")], check=True)
    monkeypatch.chdir(tmp_path / "clone" / "catalog")
    result = CliRunner().invoke(cli, ["validate", "origin/main"])
    assert result.exit_code == 0, result.output
    assert "origin/main (" in result.output and "): valid: 4 models" in result.output


def test_validate_json_lists_every_issue_with_its_place(example_tree: Path) -> None:
    gemma = example_tree / "catalog" / "gemma-3-270m.yaml"
    gemma.write_text(gemma.read_text().replace("replicas: 1\n", "replicas: -1\n"))
    result = CliRunner().invoke(cli, ["validate", str(example_tree), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["valid"] is False
    assert [(i["file"], i["line"], i["column"], i["key"]) for i in doc["issues"]] == [
        ("catalog/gemma-3-270m.yaml", 13, 11, "replicas")]


def test_validate_json_of_a_valid_tree_names_its_models_and_warnings(example_tree: Path) -> None:
    result = CliRunner().invoke(cli, ["validate", str(example_tree), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["valid"] is True and "gemma-3-270m" in doc["models"]
    assert [i["severity"] for i in doc["issues"]] == ["warning"]


@pytest.mark.parametrize(("written", "where"), [
    ("9" * 4000, "catalog/gemma-3-270m.yaml:13:11: '9999999999999999'... (4000 characters) is out of range"),
    ("0x" + "f" * 4000, "catalog/gemma-3-270m.yaml:13:11: '0xffffffffffffff'... (4002 characters) is out of range"),
])
def test_a_commit_with_a_4000_digit_integer_is_refused_with_file_and_line(
        bare: tuple[Path, Path], written: str, where: str) -> None:
    repo_path, tree = bare
    gemma = tree / "catalog" / "gemma-3-270m.yaml"
    gemma.write_text(gemma.read_text().replace("replicas: 1\n", f"replicas: {written}\n"))
    commit_tree(pygit2.Repository(str(repo_path)), tree, "a very large number")
    with pytest.raises(SettingsError) as caught:
        load_commit(repo_path, "main")
    assert [str(i) for i in caught.value.issues] == [where + ": settings take integers from -9223372036854775808 "
                                                             "to 9223372036854775807"]
    result = CliRunner().invoke(cli, ["validate", "--repo", str(repo_path), "main", "--json"])
    assert result.exit_code == 1, result.output
    issue = json.loads(result.stdout)["issues"][0]
    assert (issue["file"], issue["line"], issue["column"]) == ("catalog/gemma-3-270m.yaml", 13, 11)


def test_a_failure_no_check_foresaw_is_a_settings_error_naming_the_file_not_a_traceback(
        bare: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    repo_path, _ = bare

    def broken(*args: object) -> None:  # a bug of llmgw's own, as the watcher would meet it
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("llmgw.settings.loading.build_agent", broken)
    with pytest.raises(SettingsError) as caught:
        load_commit(repo_path, "main")
    assert [str(i) for i in caught.value.issues] == [
        "agents/default.yaml: cannot be loaded: ZeroDivisionError: division by zero; this is a bug of llmgw: "
        "please report it with this file"]


def test_a_commit_whose_tree_lost_an_object_is_a_settings_error_naming_the_commit(bare: tuple[Path, Path]) -> None:
    repo_path, _ = bare
    repo = pygit2.Repository(str(repo_path))
    head = repo.references["refs/heads/main"].peel(pygit2.Commit)
    blob = str(head.tree["projects.yaml"].id)
    (repo_path / "objects" / blob[:2] / blob[2:]).unlink()  # a damaged repository: one loose object gone
    with pytest.raises(SettingsError) as caught:
        load_commit(repo_path, "main")
    [issue] = caught.value.issues
    assert issue.file == str(head.id) and "an object of its tree is missing or damaged" in issue.message
