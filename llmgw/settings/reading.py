"""Reading a settings tree's files, from a directory or from a git commit (pygit2, no git CLI).

Both sources give the same thing: the text of every YAML file by its path relative to the tree's root
("catalog/gemma.yaml"), plus an Issue for every file that cannot be read safely. Refused, with a sentence
saying why: symbolic links, files over MAX_FILE_BYTES, bytes that are not UTF-8, submodules.
A whole tree is read within caps (`TreeCaps`: entries, depth, YAML files, total bytes): past one, reading stops and
SettingsError names the cap. Git stores a tree once however many entries point at it, so a "git bomb" commit of a
few kilobytes (10 entries per level naming one subtree, 9 levels: 10^9 paths) made every reader of the commit (the
pre-receive hook, `llmgw review`, the watcher) walk for hours; capped, it is refused at once.
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
MAX_TREE_ENTRIES = 100_000
"""Entries (files and directories, hidden ones excluded) one settings tree may hold, counted as they are read."""
MAX_TREE_DEPTH = 16
"""Directories one inside another at most (catalog/, agents/nodes/ need 2)."""
MAX_YAML_FILES = 20_000
"""YAML files one settings tree may hold (a fleet of 2,000 nodes with a file each needs a tenth of it)."""
MAX_TREE_BYTES = 256 * 1024 * 1024
"""Bytes of YAML one settings tree may hold in all."""


class TreeCaps:
    """What has been read of one tree so far, against the caps; `entry`, `directory` and `yaml` count one more and
    raise SettingsError naming the cap passed (MAX_TREE_ENTRIES, MAX_TREE_DEPTH, MAX_YAML_FILES, MAX_TREE_BYTES)."""

    def __init__(self) -> None:
        self.entries = self.files = self.bytes = 0

    @staticmethod
    def _refuse(path: str, what: str, cap: str, limit: int) -> None:
        raise SettingsError([Issue(path, 0, 0, "", f"{what}: over llmgw's cap {cap} ({limit}); a settings tree "
                                   "this large is refused without reading further (a commit whose directories "
                                   "name one subtree many times, a \"git bomb\", looks like this)")])

    def entry(self, path: str) -> None:
        self.entries += 1
        if self.entries > MAX_TREE_ENTRIES:
            self._refuse(path, f"the tree holds more than {MAX_TREE_ENTRIES} entries", "MAX_TREE_ENTRIES",
                         MAX_TREE_ENTRIES)

    def directory(self, path: str) -> None:
        depth = path.rstrip("/").count("/") + 1
        if depth > MAX_TREE_DEPTH:
            self._refuse(path, f"directories nest {depth} deep", "MAX_TREE_DEPTH", MAX_TREE_DEPTH)

    def yaml(self, path: str, size: int) -> None:
        self.files += 1
        self.bytes += size
        if self.files > MAX_YAML_FILES:
            self._refuse(path, f"the tree holds more than {MAX_YAML_FILES} YAML files", "MAX_YAML_FILES",
                         MAX_YAML_FILES)
        if self.bytes > MAX_TREE_BYTES:
            self._refuse(path, f"the tree's YAML files hold more than {MAX_TREE_BYTES} bytes", "MAX_TREE_BYTES",
                         MAX_TREE_BYTES)


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
    files, caps = TreeFiles(), TreeCaps()
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        rel_dir = Path(dirpath).relative_to(base)
        kept = []
        for name in sorted(dirnames):
            rel = (rel_dir / name).as_posix()
            if name.startswith("."):
                continue  # hidden: .git, .github, .gitea, .llmgw (not settings)
            caps.entry(rel)
            caps.directory(rel)
            if os.path.islink(os.path.join(dirpath, name)):
                files.issues.append(Issue(rel, 0, 0, "", "is a symbolic link; settings trees hold plain files only"))
                continue
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = (rel_dir / name).as_posix()
            if not name.startswith("."):
                caps.entry(rel)
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                files.issues.append(Issue(rel, 0, 0, "", "is a symbolic link; settings trees hold plain files only"))
                continue
            if not _is_yaml(name) or name.startswith(".") or not stat.S_ISREG(info.st_mode):
                continue
            if info.st_size > MAX_FILE_BYTES:
                files.issues.append(_too_big(rel, info.st_size))
                continue
            caps.yaml(rel, info.st_size)
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
    """Read every YAML file of `commit`'s tree, with the same refusals and caps as `read_directory`.

    Raises: SettingsError naming the cap (`TreeCaps`) as soon as the tree passes one."""
    files, caps = TreeFiles(), TreeCaps()
    stack: list[tuple[str, pygit2.Tree]] = [("", commit.tree)]
    while stack:
        prefix, tree = stack.pop()
        for entry in tree:
            if entry.name.startswith("."):
                continue  # hidden: a forge's CI files, .llmgw/ (not settings)
            rel = prefix + entry.name
            caps.entry(rel)
            mode = entry.filemode
            if mode == pygit2.enums.FileMode.LINK:
                files.issues.append(Issue(rel, 0, 0, "", "is a symbolic link; settings trees hold plain files only"))
            elif mode == pygit2.enums.FileMode.TREE:
                caps.directory(rel)
                stack.append((rel + "/", repo[entry.id]))
            elif mode == pygit2.enums.FileMode.COMMIT:
                files.issues.append(Issue(rel, 0, 0, "", "is a submodule; settings trees hold plain files only"))
            elif _is_yaml(entry.name):
                blob = repo[entry.id]
                if blob.size > MAX_FILE_BYTES:
                    files.issues.append(_too_big(rel, blob.size))
                    continue
                caps.yaml(rel, blob.size)
                files.add(rel, blob.data)
    return files
