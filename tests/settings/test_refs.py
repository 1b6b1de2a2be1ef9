"""The refs, config and mirror helpers the control plane reads a settings repository through (real git repos)."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest

from llmgw.errors import SettingsError
from llmgw.settings import (
    APPLIED_REF, NOTIFY_URL_KEY, branch_head, discover_repository, fetch_mirror, init_repository, redact_url,
    ref_commit, set_config_value, set_ref,
)
from llmgw.settings.node_commits import commit_serving_stopped
from settings_trees import EXAMPLE


def test_branch_head_and_ref_commit_name_commits_or_none(tmp_path: Path) -> None:
    bare = tmp_path / "settings.git"
    seed = init_repository(bare, EXAMPLE)
    assert branch_head(bare) == seed and branch_head(bare, "main") == seed
    assert branch_head(bare, "production") is None
    assert ref_commit(bare, APPLIED_REF) is None
    set_ref(bare, APPLIED_REF, seed)
    assert ref_commit(bare, APPLIED_REF) == seed
    assert ref_commit(bare, "refs/heads/main") == seed


def test_reading_refs_of_a_directory_that_is_no_repository_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="is not a git repository"):
        branch_head(tmp_path, "main")
    with pytest.raises(SettingsError, match="is not a git repository"):
        ref_commit(tmp_path / "missing", APPLIED_REF)
    with pytest.raises(SettingsError, match="is not a git repository"):
        set_config_value(tmp_path, NOTIFY_URL_KEY, "http://127.0.0.1:1/")


def test_set_config_value_writes_the_repositorys_own_config(tmp_path: Path) -> None:
    bare = tmp_path / "settings.git"
    init_repository(bare, EXAMPLE)
    set_config_value(bare, NOTIFY_URL_KEY, "http://127.0.0.1:8081/api/v1/hooks/git")
    assert pygit2.Repository(str(bare)).config[NOTIFY_URL_KEY] == "http://127.0.0.1:8081/api/v1/hooks/git"


def test_discover_repository_finds_the_git_directory_above_a_path_or_none(tmp_path: Path) -> None:
    work = tmp_path / "work"
    pygit2.init_repository(str(work))
    (work / "catalog").mkdir()
    assert Path(discover_repository(work / "catalog")).resolve() == (work / ".git").resolve()
    assert discover_repository(tmp_path / "elsewhere") is None


def test_fetch_mirror_clones_then_follows_the_branch_even_when_it_is_rewritten(tmp_path: Path) -> None:
    source = tmp_path / "source.git"
    seed = init_repository(source, EXAMPLE)
    mirror = tmp_path / "state" / "settings-mirror.git"
    fetch_mirror(f"file://{source}", mirror, "main")
    assert pygit2.Repository(str(mirror)).is_bare and branch_head(mirror, "main") == seed
    stopped = commit_serving_stopped(source, True, "Operator", "operator@acme.example").commit
    fetch_mirror(f"file://{source}", mirror, "main")
    assert branch_head(mirror, "main") == stopped
    pygit2.Repository(str(source)).references["refs/heads/main"].set_target(seed)
    fetch_mirror(f"file://{source}", mirror, "main")
    assert branch_head(mirror, "main") == seed


@pytest.mark.parametrize("url", [
    "https://llmgw:s3cret-token@127.0.0.1:1/settings.git",
    "http://s3cret-token@127.0.0.1:1/settings.git",
])
def test_an_unreachable_remote_is_an_os_error_naming_the_url_without_its_secret(tmp_path: Path, url: str) -> None:
    with pytest.raises(OSError) as caught:
        fetch_mirror(url, tmp_path / "mirror.git", "main")
    message = str(caught.value)
    assert message.startswith(f"cannot fetch {url.split('//')[0]}//***@127.0.0.1:1/settings.git: ")
    assert "s3cret" not in message


def test_a_mirror_path_that_is_no_repository_is_an_os_error_with_a_sentence(tmp_path: Path) -> None:
    source = tmp_path / "source.git"
    init_repository(source, EXAMPLE)
    mirror = tmp_path / "mirror.git"
    mirror.mkdir()
    (mirror / "HEAD").write_text("not a repository\n")
    with pytest.raises(OSError, match=f"cannot fetch file://{source}: "):
        fetch_mirror(f"file://{source}", mirror, "main")


@pytest.mark.parametrize(("text", "expected"), [
    ("https://u:pw@forge.example/x.git", "https://***@forge.example/x.git"),
    ("cannot reach ssh://git@forge.example:22/x and https://tok@h/y", "cannot reach ssh://***@forge.example:22/x and https://***@h/y"),
    ("https://forge.example/x.git", "https://forge.example/x.git"),
    ("git@forge.example:team/settings.git", "git@forge.example:team/settings.git"),
    ("postgresql://llmgw:pw@db/llmgw", "postgresql://***@db/llmgw"),
])
def test_redact_url_hides_the_user_information_of_every_url(text: str, expected: str) -> None:
    assert redact_url(text) == expected
