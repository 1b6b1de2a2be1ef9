"""The settings watcher: local and fetched repositories, bad commits kept out, an unreachable remote."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmgw.control.watching import SettingsWatcher, is_url
from llmgw.settings import set_ref

from .test_in_process_fleet import commit_directly


@pytest.mark.parametrize(
    "location, url",
    [
        ("/srv/settings.git", False), ("settings", False), ("./a:b", False),
        ("https://forge.example/ops/settings.git", True), ("ssh://git@forge.example/ops/settings.git", True),
        ("file:///srv/settings.git", True), ("git@forge.example:ops/settings.git", True),
    ],
)
def test_locations_are_told_apart_as_paths_or_urls(location, url):
    assert is_url(location) is url


def bad_catalog(repo: Path) -> str:
    return commit_directly(repo, "catalog/tiny.yaml", b"name: tiny\nengine: llama.cpp\nreplicas: many\n", "bad")


async def test_a_bad_head_is_reported_with_file_and_line_while_the_last_good_commit_stays(settings_repo):
    published = []
    watcher = SettingsWatcher(str(settings_repo), "main", settings_repo.parent / "unused", publish=published.append)
    state = await watcher.poll()
    good = state.settings.commit
    assert state.bad is None and published == [state]
    bad = bad_catalog(settings_repo)
    state = await watcher.poll()
    assert state.settings.commit == good and state.head == bad
    assert published[-1] is state and published[-1].settings is published[0].settings  # same settings, now a bad head
    (issue,) = [i for i in state.bad.issues if i.severity == "error"]
    assert (issue.file, issue.line, issue.key_path) == ("catalog/tiny.yaml", 3, "replicas")
    assert bad[:12] in state.bad.describe()


async def test_at_start_a_bad_head_falls_back_to_the_applied_commit(settings_repo):
    first = await SettingsWatcher(str(settings_repo), "main", settings_repo.parent / "m").poll()
    set_ref(settings_repo, "refs/llmgw/applied", first.settings.commit)
    bad_catalog(settings_repo)
    published = []
    watcher = SettingsWatcher(str(settings_repo), "main", settings_repo.parent / "m", publish=published.append)
    state = await watcher.poll()
    assert state.settings.commit == first.settings.commit and state.bad is not None
    # what the control plane is told is the applied commit's settings, after the watcher holds them itself
    assert [p.settings.commit for p in published] == [first.settings.commit] and published[0] is watcher.state


async def test_at_start_a_good_head_ahead_of_the_applied_commit_keeps_the_applied_settings_beside_it(settings_repo):
    first = await SettingsWatcher(str(settings_repo), "main", settings_repo.parent / "m").poll()
    assert first.applied is None  # no applied ref yet
    set_ref(settings_repo, "refs/llmgw/applied", first.settings.commit)
    assert (await SettingsWatcher(str(settings_repo), "main", settings_repo.parent / "m").poll()).applied is None
    text = (settings_repo.parent / "seed" / "catalog" / "tiny.yaml").read_bytes().replace(b"context_size: 512",
                                                                                          b"context_size: 1024")
    head = commit_directly(settings_repo, "catalog/tiny.yaml", text, "bigger context")
    state = await SettingsWatcher(str(settings_repo), "main", settings_repo.parent / "m").poll()
    assert state.settings.commit == head and state.applied.commit == first.settings.commit  # what a canary compares


async def test_a_remote_is_fetched_into_a_mirror_and_an_unreachable_one_keeps_the_last_good_commit(
    tmp_path, settings_repo,
):
    mirror = tmp_path / "state" / "settings-mirror.git"
    watcher = SettingsWatcher(f"file://{settings_repo}", "main", mirror)
    state = await watcher.poll()
    assert state.settings is not None and state.remote_error is None and (mirror / "HEAD").is_file()
    good = state.settings.commit
    shutil.move(settings_repo, tmp_path / "gone.git")
    state = await watcher.poll()
    assert state.settings.commit == good
    assert "cannot fetch" in state.remote_error and good[:12] in state.remote_error
    shutil.move(tmp_path / "gone.git", settings_repo)
    newer = commit_directly(settings_repo, "README.md", b"notes\n", "a note")
    state = await watcher.poll()
    assert state.remote_error is None and state.settings.commit == newer
