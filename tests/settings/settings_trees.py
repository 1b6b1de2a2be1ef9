"""Helpers of the settings tests: copies of the example repository, with files laid over or removed, and commits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pygit2
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "cluster-repo"
BAD = Path(__file__).resolve().parent / "bad"


def copy_example(target: Path) -> Path:
    """A copy of examples/cluster-repo at `target`."""
    shutil.copytree(EXAMPLE, target)
    return target


def with_node_line(tmp_path: Path, line: str) -> Path:
    """A copy of examples/cluster-repo under `tmp_path/settings` with `line` added at the end (line 11) of
    agents/nodes/gpu-node-01.yaml."""
    tree = copy_example(tmp_path / "settings")
    node = tree / "agents" / "nodes" / "gpu-node-01.yaml"
    node.write_text(node.read_text() + line)
    return tree


def overlay(tree: Path, case_dir: Path) -> Path:
    """Lay the files of `case_dir` over `tree`; paths listed in its DELETE file are removed from `tree`."""
    for path in sorted(case_dir.rglob("*")):
        rel = path.relative_to(case_dir)
        if path.is_dir() or rel.as_posix() in ("DELETE", ".keep"):
            continue
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, tree / rel)
    delete = case_dir / "DELETE"
    if delete.exists():
        for rel in delete.read_text().split():
            (tree / rel).unlink()
    return tree


def commit_tree(repo: pygit2.Repository, tree_dir: Path, message: str, ref: str = "refs/heads/main") -> str:
    """Commit every file of `tree_dir` (symlinks as links) on `ref` of `repo`; return the commit id."""
    from llmgw.settings.repository import write_tree

    files = {}
    links = {}
    for path in sorted(tree_dir.rglob("*")):
        rel = path.relative_to(tree_dir).as_posix()
        if rel.startswith(".git"):
            continue
        if path.is_symlink():
            links[rel] = str(path.readlink())
        elif path.is_file():
            files[rel] = path.read_bytes()
    tree_id = write_tree(repo, files)
    if links:
        for rel, target in links.items():
            head, _, name = rel.rpartition("/")
            sub = repo[tree_id]
            if head:
                sub_builder = repo.TreeBuilder(repo[sub[head].id])
                sub_builder.insert(name, repo.create_blob(target.encode()), pygit2.enums.FileMode.LINK)
                top = repo.TreeBuilder(sub)
                top.insert(head, sub_builder.write(), pygit2.enums.FileMode.TREE)
                tree_id = top.write()
            else:
                top = repo.TreeBuilder(sub)
                top.insert(name, repo.create_blob(target.encode()), pygit2.enums.FileMode.LINK)
                tree_id = top.write()
    signature = pygit2.Signature("Test", "test@example.com")
    try:
        parents = [repo.references[ref].peel(pygit2.Commit).id]
    except KeyError:
        parents = []
    return str(repo.create_commit(ref, signature, signature, message, tree_id, parents))
