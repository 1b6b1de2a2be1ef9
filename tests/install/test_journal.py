"""The install journal (llmgw.install): what llmgw made is recorded as it goes and undone exactly, on real files.

About 0.5 s in all here (one subprocess killed halfway).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.errors import InstallError
from llmgw.install import CreatedDirectory, InstalledUnit, Journal, describe, sizes, undo


def tree(root: Path) -> dict[str, tuple]:
    """Every path below `root` with its kind, mode and content digest: two trees compared are a file-system diff."""
    out: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
        out[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), content,
                                            os.readlink(path) if path.is_symlink() else "")
    return out


def machine(tmp_path: Path) -> Path:
    """A small root with what a machine has before llmgw: /etc with a file, /opt, /var/lib."""
    root = tmp_path / "root"
    for directory in ("etc/systemd/system", "opt", "var/lib"):
        (root / directory).mkdir(parents=True)
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    return root


def install(root: Path) -> Journal:
    """What `node add` does, in miniature: directories, files, a `current` link, weights, a replaced file."""
    journal = Journal.open(root / "var/lib/llmgw/install-journal.json")
    journal.make_dirs(root / "opt/llmgw/0.9.0/bin")
    journal.write_file(root / "opt/llmgw/0.9.0/bin/llmgw", b"#!/bin/sh\n", mode=0o755)
    journal.symlink(root / "opt/llmgw/current", "0.9.0")
    journal.write_file(root / "etc/llmgw/agent.yaml", b"control_plane: 10.0.0.1:8082\n", mode=0o600)
    journal.write_file(root / "etc/systemd/system/llmgw-agent.service", b"[Service]\nExecStart=/bin/true\n")
    journal.record(InstalledUnit("llmgw-agent.service"))
    journal.make_dirs(root / "var/lib/llmgw/weights", weights=True)
    (root / "var/lib/llmgw/weights/model.gguf").write_bytes(b"w" * 1000)
    (root / "var/lib/llmgw/engines").mkdir()
    journal.write_file(root / "etc/hosts", b"127.0.0.1 localhost\n10.0.0.1 control-plane\n")
    return journal


def test_undo_leaves_the_machine_as_it_was_and_no_journal(tmp_path) -> None:
    root = machine(tmp_path)
    before = tree(root)
    install(root)
    assert (root / "opt/llmgw/current/bin/llmgw").read_bytes() == b"#!/bin/sh\n"
    journal = Journal.read(root / "var/lib/llmgw/install-journal.json")
    listed = [describe(entry) for entry, _ in sizes(journal)]
    assert listed[0] == f"file {root}/etc/hosts (replaced one that is restored)"
    assert f"directory {root}/var/lib/llmgw/weights (weights)" in listed
    assert dict((describe(e), size) for e, size in sizes(journal))[f"directory {root}/var/lib/llmgw"] >= 1000
    outcomes = undo(journal)
    assert {o.action for o in outcomes} == {"removed", "restored", "absent"}  # the unit: no systemd here
    assert tree(root) == before
    assert (root / "etc/hosts").read_text() == "127.0.0.1 localhost\n"


def test_keep_weights_leaves_only_the_weights_and_the_journal_that_lists_them(tmp_path) -> None:
    root = machine(tmp_path)
    before = tree(root)
    undo(install(root), keep_weights=True)
    left = set(tree(root)) - set(before)
    assert left == {"var/lib/llmgw", "var/lib/llmgw/install-journal.json", "var/lib/llmgw/weights",
                    "var/lib/llmgw/weights/model.gguf"}
    journal = Journal.read(root / "var/lib/llmgw/install-journal.json")
    assert [e for e in journal if isinstance(e, CreatedDirectory)] == [
        CreatedDirectory(f"{root}/var/lib/llmgw"), CreatedDirectory(f"{root}/var/lib/llmgw/weights", weights=True)]
    undo(journal)  # a later full wipe takes them too
    assert tree(root) == before


def test_a_file_edited_since_outside_llmgws_directories_is_kept_and_named(tmp_path) -> None:
    root = machine(tmp_path)
    journal = install(root)
    (root / "etc/systemd/system/llmgw-agent.service").write_text("[Service]\nExecStart=/bin/false\n")
    outcomes = undo(journal)
    changed = [o.entry.path for o in outcomes if o.action == "changed"]
    assert changed == [f"{root}/etc/systemd/system/llmgw-agent.service"]
    assert (root / "etc/systemd/system/llmgw-agent.service").exists()
    # still listed, for the operator to decide, with the journal's directory, which holds the journal still
    assert [e.path for e in Journal.read(journal.path)] == [f"{root}/var/lib/llmgw", *changed]


def test_a_crash_halfway_leaves_a_journal_of_what_was_done_and_undo_cleans_it(tmp_path) -> None:
    """A process installing is SIGKILLed after its fourth step: the journal reads, lists every step done, and
    undoing it leaves the machine as before."""
    root = machine(tmp_path)
    before = tree(root)
    script = ("import os, signal, sys\nfrom pathlib import Path\nfrom llmgw.install import Journal\n"
              "root = Path(sys.argv[1])\nj = Journal.open(root / 'var/lib/llmgw/install-journal.json')\n"
              "j.make_dirs(root / 'opt/llmgw/0.9.0')\n"
              "j.write_file(root / 'opt/llmgw/0.9.0/a', b'a' * 100000)\n"
              "j.symlink(root / 'opt/llmgw/current', '0.9.0')\n"
              "j.write_file(root / 'etc/llmgw.yaml', b'x')\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n"
              "j.write_file(root / 'opt/llmgw/never', b'never')\n")
    done = subprocess.run([sys.executable, "-c", script, str(root)], env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == -9
    journal = Journal.read(root / "var/lib/llmgw/install-journal.json")
    assert [Path(getattr(e, "path", "")).name for e in journal] == [
        "llmgw", "llmgw", "0.9.0", "a", "current", "llmgw.yaml"]
    assert not (root / "opt/llmgw/never").exists()
    undo(journal)
    assert tree(root) == before


@pytest.mark.parametrize("content, says", [
    ("{\"format\": 1, \"entr", "not a readable install journal"),
    ("{\"format\": 7, \"entries\": []}", "not an install journal of format 1"),
    ("{\"format\": 1, \"entries\": [{\"kind\": \"volcano\"}]}", "entry 1 is not one llmgw writes"),
])
def test_a_journal_that_does_not_read_is_refused_naming_the_file_and_nothing_changes(tmp_path, content, says) -> None:
    path = tmp_path / "install-journal.json"
    path.write_text(content)
    with pytest.raises(InstallError, match=says) as raised:
        Journal.read(path)
    assert str(path) in str(raised.value) and path.read_text() == content


def test_a_path_llmgw_did_not_make_is_not_replaced_by_a_link(tmp_path) -> None:
    root = machine(tmp_path)
    journal = Journal.open(root / "var/lib/llmgw/install-journal.json")
    (root / "opt" / "current").mkdir()
    with pytest.raises(InstallError, match="exists and llmgw did not make it"):
        journal.symlink(root / "opt" / "current", "0.9.0")
    assert (root / "opt" / "current").is_dir()


def test_programs_that_record_while_the_host_runs_lose_no_entry_and_record_each_once(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from llmgw.install.journal import FirewallTable, record_on_installed_host

    root = machine(tmp_path)
    journal = install(root)
    tables = [FirewallTable("inet", f"t{n}") for n in range(16)]
    with ThreadPoolExecutor(8) as pool:  # each thread reads, adds and rewrites the whole journal
        assert all(pool.map(lambda entry: record_on_installed_host(entry, journal.path), tables + tables))
    entries = Journal.read(journal.path).entries
    assert entries[:len(journal.entries)] == journal.entries
    assert sorted(entries[len(journal.entries):], key=str) == sorted(tables, key=str)  # each once, none lost
    assert not record_on_installed_host(tables[0], tmp_path / "elsewhere" / "journal.json")  # not installed here
    assert not (tmp_path / "elsewhere").exists()
