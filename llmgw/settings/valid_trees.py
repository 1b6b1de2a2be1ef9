"""The record of settings trees the pre-receive hook found valid, so the control plane checks a pushed tree once.

The hook validates a pushed commit in full; `llmgw.cli.hook_cmds` then adds the commit's tree id to the file
VALID_TREES_FILE in the repository's git directory (beside `config` and `HEAD`). A push writes objects and refs
only, and a ref name always starts with "refs/", so a pusher cannot write that file; only whoever can write the
repository's directory can, and they can rewrite the hooks as well. The watcher looks the head's tree id up there
(`read_valid_trees`) and, when it is recorded, builds the Settings without the schema step the hook already ran
(`llmgw.settings.load_commit(..., trust_hook_record=True)`).

A tree id names exactly the bytes of every file of the tree (git hashes contents), so the hook and the watcher
read the same input; what else validation depended on is the key each entry carries (`validation_key`): llmgw's
version, the versions of jsonschema and ruamel.yaml, and a digest of the schema files and of llmgw.settings'
sources. An entry written under another key (an older or newer llmgw, an edited schema) is not trusted, so an
upgrade validates again.

Format (text, UTF-8), one entry a line, oldest first, and a checksum line last:

    # llmgw: settings trees the pre-receive hook found valid (<key> <tree id>); see llmgw.settings.valid_trees
    <key: 64 hex> <tree id: 40 hex>
    ...
    sha256 <64 hex: the SHA-256 of every byte before this line>

At most MAX_ENTRIES entries are kept (the oldest are dropped). A file that is missing, larger than MAX_FILE_BYTES,
not UTF-8, or whose checksum does not match is read as empty: the tree is then validated in full, which is always
safe. This module only reads the file and renders its new text; the hook's command writes it (atomically, under
a lock).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path

import llmgw
from llmgw.settings.packaged import schema_dir

VALID_TREES_FILE = "llmgw-valid-trees"
MAX_ENTRIES = 256
MAX_FILE_BYTES = 64 * 1024
_HEADER = ("# llmgw: settings trees the pre-receive hook found valid (<key> <tree id>); "
           "see llmgw.settings.valid_trees\n")
_ENTRY = re.compile(r"^([0-9a-f]{64}) ([0-9a-f]{40})$")
_SUM = re.compile(r"^sha256 ([0-9a-f]{64})\n?$")
_HERE = Path(__file__).resolve().parent


def _version_of(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def validation_key(version: str = llmgw.__version__) -> str:
    """The key (64 hex) of what validating a tree depends on besides its bytes, for llmgw `version` (default: this
    one) with the schema files and llmgw.settings sources installed here.

    Computed from `version`, the versions of jsonschema and ruamel.yaml, and the name and bytes of every schema
    file (`schema/*.json`) and every llmgw.settings module (`*.py`). Reads those files once per process and
    `version`. Never raises: a file that cannot be read adds its name and the error's type instead.
    """
    return _key(version)


@cache
def _key(version: str) -> str:
    digest = hashlib.sha256()
    for part in (f"llmgw {version}", f"jsonschema {_version_of('jsonschema')}",
                 f"ruamel.yaml {_version_of('ruamel.yaml')}"):
        digest.update(part.encode() + b"\0")
    for folder, pattern in ((schema_dir(), "*.json"), (_HERE, "*.py")):
        for path in sorted(folder.glob(pattern)):
            digest.update(path.name.encode() + b"\0")
            try:
                digest.update(path.read_bytes())
            except OSError as exc:
                digest.update(type(exc).__name__.encode())
            digest.update(b"\0")
    return digest.hexdigest()


def parse_record(data: bytes) -> list[tuple[str, str]]:
    """The (key, tree id) entries of a record file's bytes, oldest first.

    Returns [] for bytes that are no intact record (over MAX_FILE_BYTES, not UTF-8, no checksum line, or a
    checksum that does not match); lines that are no entry (the header, a comment) are skipped. Never raises.
    """
    if len(data) > MAX_FILE_BYTES:
        return []
    body, _, last = data.rstrip(b"\n").rpartition(b"\n")
    try:
        text = body.decode("utf-8") + "\n"
        match = _SUM.match(last.decode("utf-8"))
    except UnicodeDecodeError:
        return []
    if match is None or hashlib.sha256(text.encode("utf-8")).hexdigest() != match.group(1):
        return []
    entries = []
    for line in text.splitlines():
        entry = _ENTRY.match(line)
        if entry is not None:
            entries.append((entry.group(1), entry.group(2)))
    return entries


def render_record(entries: Sequence[tuple[str, str]], added: Iterable[str], key: str) -> bytes:
    """The bytes of a record holding `entries` (as `parse_record` returns them) and `added` tree ids (40 hex) under
    `key` (64 hex), the added ones newest; an entry already present moves to the end rather than repeating.

    Keeps the newest MAX_ENTRIES entries. Raises: ValueError when a tree id or the key is not lower-case hex of its
    length.
    """
    new = [(key, tree) for tree in dict.fromkeys(added)]
    for pair in new:
        if not _ENTRY.match(f"{pair[0]} {pair[1]}"):
            raise ValueError(f"not a key and tree id: {pair!r}")
    kept = [pair for pair in entries if pair not in new] + new
    body = _HEADER + "".join(f"{k} {t}\n" for k, t in kept[-MAX_ENTRIES:])
    return (body + f"sha256 {hashlib.sha256(body.encode('utf-8')).hexdigest()}\n").encode("utf-8")


def record_path(git_dir: str | os.PathLike[str]) -> Path:
    """Where the record of the repository whose git directory is `git_dir` lives (for a bare repository, the
    repository itself; otherwise its `.git`)."""
    return Path(git_dir) / VALID_TREES_FILE


def read_record(git_dir: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The entries of the record in `git_dir` (see `parse_record`); [] when there is none or it cannot be read.

    Blocking (reads at most MAX_FILE_BYTES + 1 bytes). Never raises.
    """
    try:
        with open(record_path(git_dir), "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        return []
    return parse_record(data)


def read_valid_trees(git_dir: str | os.PathLike[str], key: str | None = None) -> frozenset[str]:
    """The tree ids (40 hex) the record in `git_dir` holds under `key` (default: `validation_key()`).

    Empty when there is no intact record, or none of its entries was written under `key`. Blocking. Never raises.
    """
    wanted = validation_key() if key is None else key
    return frozenset(tree for entry_key, tree in read_record(git_dir) if entry_key == wanted)
