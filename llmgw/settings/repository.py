"""Creating a settings repository: `init_repository(path, seed_dir, notify_url=None, branch="main")`.

The repository is bare, its settings branch (`main`, recorded in the config key `llmgw.branch`) holds one commit
seeded from `seed_dir`, and two hooks guard it: pre-receive lets a push move the settings branch forward to
settings that validate and refuses everything else with a sentence (see llmgw.settings.hook); post-receive POSTs
to the URL in the config key `llmgw.notifyurl` (a running control plane) and never fails a push. Both run
`<this interpreter> -m llmgw.cli.hook_cmds <hook>`, with this llmgw on PYTHONPATH, so they work from any shell and
any virtual environment state; `install_hooks` rewrites them (a repository made by an older llmgw).
Git's hook protocol: https://git-scm.com/docs/githooks.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

import pygit2

from llmgw.errors import Issue, SettingsError
from llmgw.settings.editors import editor_files
from llmgw.settings.loading import load_directory
from llmgw.settings.post_receive import HOOK_TOKEN_FILE, NOTIFY_CA_KEY, NOTIFY_URL_KEY
from llmgw.settings.refs import BRANCH_KEY, DEFAULT_BRANCH, branch_ref

LLMGW_SIGNATURE = ("llmgw", "llmgw@localhost")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def write_tree(repo: pygit2.Repository, files: dict[str, bytes | None], base: pygit2.Tree | None = None) -> pygit2.Oid:
    """Write a tree holding `base`'s entries with `files` ("dir/name" -> content; None deletes) laid over it.

    Returns the new tree's id. Directories emptied by deletions disappear.
    """
    here: dict[str, bytes | None] = {}
    below: dict[str, dict[str, bytes | None]] = {}
    for path, data in files.items():
        head, _, rest = path.strip("/").partition("/")
        if rest:
            below.setdefault(head, {})[rest] = data
        else:
            here[head] = data
    builder = repo.TreeBuilder(base) if base is not None else repo.TreeBuilder()
    for name, data in here.items():
        if data is None:
            if base is not None and name in base:
                builder.remove(name)
        else:
            builder.insert(name, repo.create_blob(data), pygit2.enums.FileMode.BLOB)
    for name, sub in below.items():
        sub_base = None
        if base is not None and name in base and base[name].filemode == pygit2.enums.FileMode.TREE:
            sub_base = repo[base[name].id]
        tree_id = write_tree(repo, sub, sub_base)
        if len(repo[tree_id]) == 0:
            if base is not None and name in base:
                builder.remove(name)
        else:
            builder.insert(name, tree_id, pygit2.enums.FileMode.TREE)
    return builder.write()


def _seed_files(seed_dir: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(seed_dir):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in filenames:
            full = Path(dirpath) / name
            if full.is_symlink():
                continue
            files[full.relative_to(seed_dir).as_posix()] = full.read_bytes()
    return files


def _hook_script(stage: str) -> str:
    python = shlex.quote(sys.executable)
    root = shlex.quote(str(_PACKAGE_ROOT))
    return ("#!/bin/sh\n"
            f"# Installed by llmgw repo init: {'validate pushed settings' if stage == 'pre-receive' else 'notify the control plane'}.\n"
            f"PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}} exec {python} -P -m llmgw.cli.hook_cmds {stage}\n")


def hook_token(repo_path: str | os.PathLike[str]) -> str:
    """The token the post-receive hook of the repository at `repo_path` sends: the one in its git directory's
    `llmgw-hook-token`, else a new one written there (mode 0600, readable by the repository's owner only, whom the
    hook runs as). Blocking. Raises: SettingsError when `repo_path` is not a repository or the file cannot be
    written."""
    import secrets

    from llmgw.settings.reading import open_repository

    path = Path(open_repository(repo_path).path) / HOOK_TOKEN_FILE
    try:
        text = path.read_text().strip() if path.is_file() else ""
        if text:
            return text
        token = "llmgw-hook-" + secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        return token
    except OSError as exc:
        raise SettingsError([Issue(str(path), 0, 0, HOOK_TOKEN_FILE, f"cannot be written ({exc})")]) from exc


def install_hooks(repo_path: str | os.PathLike[str]) -> None:
    """(Re)write the pre-receive and post-receive hooks of the bare repository at `repo_path`."""
    hooks = Path(repo_path) / "hooks"
    hooks.mkdir(exist_ok=True)
    for stage in ("pre-receive", "post-receive"):
        path = hooks / stage
        path.write_text(_hook_script(stage))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def init_repository(path: str | os.PathLike[str], seed_dir: str | os.PathLike[str], notify_url: str | None = None,
                    branch: str = DEFAULT_BRANCH) -> str:
    """Create a bare settings repository at `path`, its settings branch `branch` seeded from the files of `seed_dir`.

    The seed must validate (`load_directory`). `notify_url`, when given, is stored as `llmgw.notifyurl` for
    the post-receive hook; `branch` as `llmgw.branch` for the pre-receive hook. Returns the seed commit's id
    (40 hex).
    Raises: SettingsError when the seed does not validate, `branch` is no branch name, or `path` exists and is
    not empty.
    """
    target = Path(path)
    if target.exists() and any(target.iterdir()):
        raise SettingsError([Issue(str(target), 0, 0, "", "exists and is not empty; choose a new path")])
    if not pygit2.reference_is_valid_name(branch_ref(branch)):
        raise SettingsError([Issue(branch, 0, 0, "", "is not a valid branch name; use e.g. main")])
    load_directory(seed_dir)
    repo = pygit2.init_repository(str(target), bare=True, initial_head=branch)
    tree = write_tree(repo, editor_files(_seed_files(Path(seed_dir))))
    signature = pygit2.Signature(*LLMGW_SIGNATURE)
    commit = repo.create_commit(branch_ref(branch), signature, signature,
                                f"Seed settings from {Path(seed_dir).name}\n", tree, [])
    repo.set_head(branch_ref(branch))
    repo.config[BRANCH_KEY] = branch
    if notify_url:
        repo.config[NOTIFY_URL_KEY] = notify_url
    install_hooks(target)
    return str(commit)
