"""The record of valid trees: its format round-trips, stays bounded, survives concurrent hooks, and a tree it
holds skips only the schema check (the Settings built are the same as a full validation's)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pygit2
import pytest

from llmgw.cli.hook_cmds import record_valid_trees
from llmgw.settings import VALID_TREES_FILE, init_repository, load_commit, read_valid_trees, validate_data, validation_key
from llmgw.settings.valid_trees import MAX_ENTRIES, MAX_FILE_BYTES, parse_record, read_record, render_record
from settings_trees import EXAMPLE

KEY = validation_key()


def tree(n: int) -> str:
    return f"{n:040x}"


def test_a_record_round_trips_and_an_entry_added_again_moves_to_the_end() -> None:
    first = render_record([], [tree(1), tree(2), tree(1)], KEY)
    assert parse_record(first) == [(KEY, tree(1)), (KEY, tree(2))]
    again = render_record(parse_record(first), [tree(1)], KEY)
    assert parse_record(again) == [(KEY, tree(2)), (KEY, tree(1))]
    other = validation_key("0.0.1")
    both = render_record(parse_record(again), [tree(3)], other)
    assert parse_record(both)[-1] == (other, tree(3)) and len(parse_record(both)) == 3


def test_a_record_keeps_the_newest_entries_only_and_stays_under_its_size_limit() -> None:
    entries: list[tuple[str, str]] = []
    for n in range(MAX_ENTRIES + 40):
        entries = parse_record(render_record(entries, [tree(n)], KEY))
    assert len(entries) == MAX_ENTRIES and entries[0][1] == tree(40) and entries[-1][1] == tree(MAX_ENTRIES + 39)
    assert len(render_record(entries, [tree(10**6)], KEY)) < MAX_FILE_BYTES


@pytest.mark.parametrize("bad", ["not hex", "A" * 40, "a" * 39])
def test_rendering_refuses_what_is_no_tree_id(bad: str) -> None:
    with pytest.raises(ValueError):
        render_record([], [bad], KEY)


def test_the_validation_key_depends_on_llmgws_version_and_is_stable() -> None:
    assert len(KEY) == 64 and KEY == validation_key()
    assert validation_key("0.0.1") != KEY


def test_concurrent_hooks_lose_no_entry_and_leave_an_intact_record(tmp_path: Path) -> None:
    def writer(base: int) -> None:
        for n in range(base, base + 5):
            record_valid_trees(tmp_path, [tree(n)])

    threads = [threading.Thread(target=writer, args=(100 * t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert read_valid_trees(tmp_path) == {tree(100 * t + n) for t in range(8) for n in range(5)}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left behind


def test_the_record_gets_the_mode_of_a_new_file_so_the_repositorys_group_can_read_it(tmp_path: Path) -> None:
    before = os.umask(0o027)
    try:
        record_valid_trees(tmp_path, [tree(1)])
    finally:
        os.umask(before)
    assert (tmp_path / VALID_TREES_FILE).stat().st_mode & 0o777 == 0o640


def test_a_tree_in_the_record_skips_the_schema_check_only(tmp_path: Path) -> None:
    bare = tmp_path / "s.git"
    head = init_repository(bare, EXAMPLE)
    tree_id = str(pygit2.Repository(str(bare))[head].peel(pygit2.Commit).tree_id)
    checked: list[str] = []

    def check(kind: str, file: str, parsed):  # the real check, counted
        checked.append(file)
        return validate_data(kind, file, parsed)

    full = load_commit(bare, head, trust_hook_record=True, check_schema=check)
    assert "llmgw.yaml" in checked  # nothing recorded yet
    record_valid_trees(bare, [tree_id])
    assert read_record(bare) == [(KEY, tree_id)]
    checked.clear()
    fast = load_commit(bare, head, trust_hook_record=True, check_schema=check)
    assert checked == []
    assert fast == full and fast.warnings == full.warnings and fast.commit == head
    load_commit(bare, head, check_schema=check)  # without trust_hook_record the record is not looked at
    assert "llmgw.yaml" in checked
