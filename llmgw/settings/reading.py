"""Reading a settings tree's files, from a directory or from a git commit (pygit2, no git CLI).

Both sources give the same thing: the text of every YAML file by its path relative to the tree's root
("catalog/gemma.yaml"), plus an Issue for every file that cannot be read safely. Refused, with a sentence
saying why: symbolic links, files over MAX_FILE_BYTES, bytes that are not UTF-8, submodules.
Non-YAML files (README.md, .gitignore, ...) are not read. Hidden entries (a name starting with ".", at any depth)
are not settings either and are skipped: `.git`, a forge's CI files (`.github/workflows/`, `.gitea/`,
`.gitlab-ci.yml`; see examples/ci) and `.llmgw/schema/` live beside the settings.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pygit2

from llmgw.errors import Issue, SettingsError

MAX_FILE_BYTES = 1024 * 1024
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass
class TreeFiles:
    """The YAML texts of one settings tree by relative path ("/"-separated), and the issues met reading it."""

    texts: dict[str, str] = field(default_factory=dict)
    issues: list[Issue] = field(default_factory=list)

    def add(self, path: str, data: bytes) -> None:
        """Decode `data` as UTF-8 (refusing other bytes with the line and column of the first bad one)."""
        try:
            self.texts[path] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            head = data[: exc.start]
            line = head.count(b"\n") + 1
            column = exc.start - (head.rfind(b"\n") + 1) + 1
            self.issues.append(Issue(path, line, column, "",
                                     f"byte 0x{data[exc.start]:02x} is not UTF-8; save the file as UTF-8"))


def _is_yaml(name: str) -> bool:
    return name.endswith(YAML_SUFFIXES)


def _too_big(path: str, size: int) -> Issue:
    return Issue(path, 0, 0, "", f"file is {size} bytes, over the limit of {MAX_FILE_BYTES} bytes (1 MiB); "
                                 "split it or remove what it does not need")


def read_directory(root: str | os.PathLike[str]) -> TreeFiles:
    """Read every YAML file under `root` (a settings working tree).

    Returns TreeFiles; unreadable files become issues rather than exceptions.
    Raises: SettingsError when `root` is not a directory.
    """
    base = Path(root)
    if not base.is_dir():
        raise SettingsError([Issue(str(root), 0, 0, "", "is not a directory; give the root of a settings tree")])
    files = TreeFiles()
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        rel_dir = Path(dirpath).relative_to(base)
        kept = []
        for name in sorted(dirnames):
            rel = (rel_dir / name).as_posix()
            if name.startswith("."):
                continue  # hidden: .git, .github, .gitea, .llmgw (not settings)
            if os.path.islink(os.path.join(dirpath, name)):
                files.issues.append(Issue(rel, 0, 0, "", "is a symbolic link; settings trees hold plain files only"))
                continue
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = (rel_dir / name).as_posix()
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                files.issues.append(Issue(rel, 0, 0, "", "is a symbolic link; settings trees hold plain files only"))
                continue
            if not _is_yaml(name) or name.startswith(".") or not stat.S_ISREG(info.st_mode):
                continue
            if info.st_size > MAX_FILE_BYTES:
                files.issues.append(_too_big(rel, info.st_size))
                continue
            with open(full, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                files.issues.append(_too_big(rel, len(data)))
                continue
            files.add(rel, data)
    return files


def open_repository(repo_path: str | os.PathLike[str], *, from_env: bool = False) -> pygit2.Repository:
    """Open the git repository at `repo_path` (bare or not).

    `from_env` honours GIT_DIR, GIT_OBJECT_DIRECTORY and GIT_ALTERNATE_OBJECT_DIRECTORIES, which a
    pre-receive hook needs to see quarantined objects. Raises: SettingsError when there is no repository.
    """
    try:
        if from_env:
            return pygit2.Repository(str(repo_path), pygit2.enums.RepositoryOpenFlag.FROM_ENV)
        return pygit2.Repository(str(repo_path))
    except pygit2.GitError as exc:
        raise SettingsError([Issue(str(repo_path), 0, 0, "", f"is not a git repository ({exc})")]) from exc


def resolve_commit(repo: pygit2.Repository, rev: str) -> pygit2.Commit:
    """The commit `rev` names (a branch, tag, ref or commit id). Raises: SettingsError when it names none."""
    try:
        obj = repo.revparse_single(rev)
        commit = obj.peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError) as exc:
        raise SettingsError([Issue(rev, 0, 0, "", f"names no commit in {repo.path} ({exc})")]) from exc
    return commit


def read_commit(repo: pygit2.Repository, commit: pygit2.Commit) -> TreeFiles:
    """Read every YAML file of `commit`'s tree, with the same refusals as `read_directory`."""
    files = TreeFiles()
    stack: list[tuple[str, pygit2.Tree]] = [("", commit.tree)]
    while stack:
        prefix, tree = stack.pop()
        for entry in tree:
            if entry.name.startswith("."):
                continue  # hidden: a forge's CI files, .llmgw/ (not settings)
            rel = prefix + entry.name
            mode = entry.filemode
            if mode == pygit2.enums.FileMode.LINK:
                files.issues.append(Issue(rel, 0, 0, "", "is a symbolic link; settings trees hold plain files only"))
            elif mode == pygit2.enums.FileMode.TREE:
                stack.append((rel + "/", repo[entry.id]))
            elif mode == pygit2.enums.FileMode.COMMIT:
                files.issues.append(Issue(rel, 0, 0, "", "is a submodule; settings trees hold plain files only"))
            elif _is_yaml(entry.name):
                blob = repo[entry.id]
                if blob.size > MAX_FILE_BYTES:
                    files.issues.append(_too_big(rel, blob.size))
                    continue
                files.add(rel, blob.data)
    return files
