"""The release before this tree, as code to run: for the tests that mixed versions work during an upgrade
(issue 30; docs/operations.md "Mixed versions during an upgrade").

`PREVIOUS_RELEASE` is the commit of this repository's history the previous release was built from. llmgw has no
release tags yet, so it is pinned here and moved forward when a release is made (docs/operations.md says when).
`previous_tree(root)` extracts that commit's `llmgw/` package and the files it reads at run time (`RUNTIME_DATA`:
the settings schemas above all; without them a server of that tree loads no settings) with `git archive`, once, into
$LLMGW_CACHE/previous-release/<commit> (0.2 s here; needs the history: CI's clone of main has it, a shallow clone
does not and the test fails saying so) and `run_previous(tree, code)` runs Python code against it in a process of
its own, with this machine's venv for the dependencies. `raised_tree(root, version)` is this checkout laid out the
same way with its version raised: the code of the next release, told apart from the previous one by its version
(both say 0.1.0 now).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from llmgw.engines.installing import default_cache_dir

PREVIOUS_RELEASE = "a50d446879081b9b39366e46a9da975c13df6068"
"""The commit of the previous release (main at the start of issue 30's work: SQLite schema 13, PostgreSQL 11)."""

REPOSITORY = Path(__file__).resolve().parents[2]
RUNTIME_DATA = ("schema", "examples/cluster-repo", "docs/admin-api.yaml", "deploy/systemd")
"""What a source tree's llmgw reads beside its package at run time (setup.py's RUNTIME_DATA, packaged in a wheel)."""


def previous_tree(root: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """`commit`'s llmgw/ package and `RUNTIME_DATA`, extracted once into `$LLMGW_CACHE/previous-release/<commit>/`
    (default ~/.cache/llmgw) and returned from there; `root` is this test's scratch (the archive passes through it).
    The tree is a commit's content, so it never changes; at one path for every run, the bytecode its processes write
    (`make test`'s PYTHONPYCACHEPREFIX) serves the next runs too (compiling the llmgw a server imports: about 2.7 s of
    CPU a fresh tree). Extracted into a temporary directory and renamed into place, so workers beside each other
    never see half a tree. Do not write into it. Raises AssertionError with what to do when the commit is not in this
    clone's history."""
    cached = default_cache_dir() / "previous-release" / commit
    if (cached / "llmgw").is_dir():
        return cached
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "previous.tar"
    done = subprocess.run(["git", "-C", str(REPOSITORY), "archive", "--format=tar", "-o", str(archive), commit,
                           "llmgw", *RUNTIME_DATA], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (
        f"the previous release's commit {commit[:12]} is not in this clone's history ({done.stderr.strip()}); "
        "fetch it (git fetch --unshallow) or move tests/support/previous_release.py's PREVIOUS_RELEASE")
    cached.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}-", dir=cached.parent))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        archive.unlink()
        try:
            staging.rename(cached)
        except OSError:  # another worker put it there first
            if not (cached / "llmgw").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cached


def raised_tree(root: Path, version: str) -> Path:
    """This checkout's llmgw/ and `RUNTIME_DATA` copied under `root`, `llmgw.__version__` set to `version`; returns
    `root`. Raises AssertionError when llmgw/__init__.py no longer says 0.1.0 (update the bump)."""
    shutil.copytree(REPOSITORY / "llmgw", root / "llmgw", ignore=shutil.ignore_patterns("__pycache__"))
    for name in RUNTIME_DATA:
        source, target = REPOSITORY / name, root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    init = root / "llmgw" / "__init__.py"
    text = init.read_text()
    assert '__version__ = "0.1.0"' in text, "llmgw/__init__.py no longer says 0.1.0: update raised_tree's bump"
    init.write_text(text.replace('__version__ = "0.1.0"', f'__version__ = "{version}"'))
    return root


def run_previous(tree: Path, code: str, *args: str, timeout: float = 120.0) -> str:
    """Run `code` (a Python program, `sys.argv[1:]` = `args`) with the previous release's llmgw from `tree` first on
    the path; returns its stdout. Raises AssertionError with its stderr when it fails."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # its bytecode kept as any process's (the tree is a cache's)
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=tree)
    assert done.returncode == 0, f"the previous release failed:\n{done.stderr[-4000:]}"
    return done.stdout
