"""A weights source naming a whole Hugging Face repository directory, expanded into its files.

`hf://org/repo@<40-hex revision>/` (the whole repository) or `hf://org/repo@<40-hex revision>/sub/dir/` (one
directory, recursively) names every file under it at that revision. The operator gives no digest per file: each is
checked against what the Hub publishes in its repository tree,

    GET <endpoint>/api/models/<org>/<repo>/tree/<revision>[/<dir>]?recursive=true

a JSON array of entries `{"type": "file" | "directory", "path": "<repository path>", "size": N, "oid": "<git blob
sha1>", "lfs": {"oid": "<sha256>", "size": N, "pointerSize": N}}`, paginated by a `Link: <url>; rel="next"` header.
Format: huggingface_hub's `HfApi.list_repo_tree` and `RepoFile.__init__` (`hf_api.py`: `BlobLfsInfo(size=lfs["size"],
sha256=lfs["oid"], pointer_size=lfs["pointerSize"])`, `blob_id = oid`).

- A file stored in LFS (every weights file: the Hub stores large and binary files there) is checked against
  `lfs.oid`, the sha256 of its content, exactly as a file listed with its sha256 (`llmgw.agent.weights.fetch`:
  cache, mirrors, resume).
- A small file kept in git itself (`config.json`, tokenizer files) has no sha256 in the tree, only `oid`, the git
  blob id: sha1 over `b"blob <size>\\0" + content` (git's object format). It is downloaded from the Hub, checked
  against that sha1 computed locally, and then stored in the cache under its sha256 like any other file. The cache
  remembers which sha256 each blob id had (`<weights_dir>/git-sha1/<oid>`, its text the sha256), so the next start
  reads it from the cache; mirrors are searched by sha256, so they serve LFS files only.

The operator may pin the whole set with `sha256:` on the directory source: the sha256 of the lines
`"<path>\\0<sha256>\\n"`, one per file, sorted by path, `path` relative to the directory named (`set_digest`). Its
first 16 hex digits are the name of the laid-out directory (`llmgw.agent.weights_layout.layout_key`). A set that
differs is refused before any large download, naming the digest found.

Pickle formats (`.bin`, `.pt`, ...) in the directory are refused unless the model sets `allow_pickle`, naming them.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import httpx

from llmgw.agent.weights import (HF_DEFAULT_ENDPOINT, PICKLE_SUFFIXES, Progress, WeightsSpec, fetch, hub_url,
                                 pickle_format, spec_of)
from llmgw.errors import WeightsError
from llmgw.http_trust import default_verify

_DIRECTORY = re.compile(r"^hf://(?P<repo>[^/@]+/[^/@]+)@(?P<revision>[0-9a-f]{40})/(?P<path>(?:[^/\s@]+/)*)$")
MAX_TREE_PAGES = 100
"""Pages of the tree followed at most (the Hub sends 1,000 entries a page)."""
MAX_GIT_FILE_BYTES = 64 << 20
"""The largest file kept in git (not LFS) that is downloaded into memory and checked by its blob id (the Hub
refuses files over 10 MB outside LFS)."""


@dataclass(frozen=True)
class TreeFile:
    """One file of a directory source: `name`, its path relative to the directory named (where the engine finds it),
    `source` its own hf:// URL, `size` in bytes, and its digest: `sha256` (the LFS object id) or, for a file kept in
    git itself, `sha256` None and `git_sha1` its git blob id."""

    name: str
    source: str
    size: int
    sha256: str | None
    git_sha1: str


def is_directory_source(source: str) -> bool:
    """Whether `source` names a repository directory (an hf:// source ending in "/")."""
    return source.startswith("hf://") and source.endswith("/")


def parse_directory(source: str) -> tuple[str, str, str]:
    """(org/repo, 40-hex revision, directory path "" or "sub/dir/") of a directory source.

    Raises WeightsError when it is not `hf://org/repo@<40-hex revision>/[dir/]` (a directory must be pinned: a branch
    moves, and nothing else pins what the Hub lists)."""
    match = _DIRECTORY.match(source)
    if not match:
        raise WeightsError(f"{source}: a directory source is written hf://org/repo@<40-hex revision>/ or "
                           "hf://org/repo@<40-hex revision>/sub/dir/, pinned to a commit")
    return match["repo"], match["revision"], match["path"]


def tree_url(source: str, endpoint: str | None = None) -> str:
    """The tree API URL listing a directory source recursively at `endpoint` (default `$HF_ENDPOINT` or the Hub).
    Raises WeightsError (`parse_directory`)."""
    repo, revision, path = parse_directory(source)
    base = (endpoint or os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")
    folder = f"/{quote(path.rstrip('/'))}" if path else ""  # as huggingface_hub's list_repo_tree writes it
    return f"{base}/api/models/{repo}/tree/{revision}{folder}?recursive=true"


def _hex(value: object, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and all(c in "0123456789abcdef" for c in value)


def files_of_tree(source: str, entries: Iterable[object], *, allow_pickle: bool = False) -> list[TreeFile]:
    """The files of directory `source` from its tree API entries (see the module), sorted by name.

    Entries that are not files ("directory") are skipped, as are files outside the directory named. Raises
    WeightsError: an entry without a path, size or well-formed digest (naming it), a path leaving its directory, a
    directory holding no file, or pickle formats without `allow_pickle` (naming every one)."""
    repo, revision, prefix = parse_directory(source)
    files: dict[str, TreeFile] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or entry.get("type") != "file":
            continue
        path = entry.get("path")
        if not isinstance(path, str) or not path.startswith(prefix) or path == prefix:
            continue
        name = path[len(prefix):]
        pure = PurePosixPath(name)
        if pure.is_absolute() or ".." in pure.parts or str(pure) != name:
            raise WeightsError(f"{source}: the Hub lists a file {path!r} that leaves its directory")
        lfs = entry.get("lfs")
        sha256 = lfs.get("oid") if isinstance(lfs, Mapping) else None
        size = entry.get("size")
        if (lfs is not None and not _hex(sha256, 64)) or not _hex(entry.get("oid"), 40) or not isinstance(size, int):
            raise WeightsError(f"{source}: the Hub's tree entry for {path} lacks a size, a git oid or an lfs.oid "
                               "sha256; check the endpoint serves the Hub's tree API")
        files[name] = TreeFile(name, f"hf://{repo}@{revision}/{path}", size, sha256, entry["oid"])
    if not files:
        raise WeightsError(f"{source}: the Hub lists no file under it; check the repository, revision and directory")
    pickles = [name for name in files if name.endswith(PICKLE_SUFFIXES)]
    if pickles and not allow_pickle:
        raise WeightsError(f"{source} holds {', '.join(sorted(pickles))}, in a pickle format that can run code when "
                           "loaded; list the model's safetensors files one by one instead, or set allow_pickle: true "
                           "on the model if you trust it")
    return [files[name] for name in sorted(files)]


def set_digest(names: Sequence[str], digests: Sequence[str]) -> str:
    """The digest of a set of files: sha256 (hex) of `"<name>\\0<sha256>\\n"` per file, sorted by name."""
    text = "".join(f"{n}\0{d}\n" for n, d in sorted(zip(names, digests)))
    return hashlib.sha256(text.encode()).hexdigest()


def git_blob_sha1(content: bytes) -> str:
    """Git's object id of a blob holding `content`: sha1 of `b"blob <len>\\0" + content` (hex)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # noqa: S324 - git's id, not security


async def list_tree(source: str, client: httpx.AsyncClient, *, token: str | None = None,
                    endpoint: str | None = None) -> list[object]:
    """The tree API entries of directory `source`, every page (`Link: rel="next"`, at most MAX_TREE_PAGES).

    `token` is sent as Bearer (the tree of a gated repository needs it). Raises WeightsError on HTTP failure (401/403
    says a token is missing or refused, 404 names the repository, revision and directory) or a body that is not a
    JSON array. Cancellable."""
    url: str | None = tree_url(source, endpoint)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    entries: list[object] = []
    for _ in range(MAX_TREE_PAGES):
        if url is None:
            return entries
        try:
            response = await client.get(url, headers=headers)
        except httpx.HTTPError as exc:
            raise WeightsError(f"{source}: cannot list the directory at {url} ({exc}); a directory source needs the "
                               "Hub (or $HF_ENDPOINT) reachable from the node") from exc
        if response.status_code in (401, 403):
            raise WeightsError(f"{source}: listing the directory answered {response.status_code}; "
                               + ("the token was refused, check the named secret" if token
                                  else "it needs a token: name a secret holding a Hub token on the model"))
        if response.status_code == 404:
            raise WeightsError(f"{source}: not found (404 at {url}); check the repository, revision and directory")
        if response.status_code != 200:
            raise WeightsError(f"{source}: listing the directory answered HTTP {response.status_code} at {url}")
        try:
            page = response.json()
        except ValueError as exc:
            raise WeightsError(f"{source}: the tree at {url} is not JSON ({exc})") from exc
        if not isinstance(page, list):
            raise WeightsError(f"{source}: the tree at {url} is not a JSON array of entries")
        entries += page
        following = response.links.get("next", {}).get("url")
        url = str(response.url.join(following)) if following else None
    raise WeightsError(f"{source}: the directory lists more than {MAX_TREE_PAGES} pages of files")


async def _sha256_of_git_file(file: TreeFile, weights_dir: Path, client: httpx.AsyncClient, token: str | None,
                              endpoint: str | None, allow_pickle: bool) -> str:
    """The sha256 of a file kept in git (no lfs.oid): from the cache's `git-sha1/<oid>` record when its file is
    cached, else downloaded from the Hub, checked against its git blob id, and stored in the cache."""
    record = weights_dir / "git-sha1" / file.git_sha1
    if record.is_file():
        digest = record.read_text().strip()
        if _hex(digest, 64) and (weights_dir / "sha256" / digest).is_file():
            return digest
    if file.size > MAX_GIT_FILE_BYTES:
        raise WeightsError(f"{file.source}: the Hub lists it in git, not LFS, at {file.size} bytes (more than "
                           f"{MAX_GIT_FILE_BYTES}); list the model's files one by one with their sha256")
    url = hub_url(file.source, endpoint)
    content = b""
    try:
        async with client.stream("GET", url, headers={"Authorization": f"Bearer {token}"} if token else {}) as answer:
            if answer.status_code != 200:
                raise WeightsError(f"{file.source}: the server answered HTTP {answer.status_code} at {url}")
            async for chunk in answer.aiter_bytes():
                content += chunk
                if len(content) > file.size:
                    break  # longer than the tree says: the id check below refuses it
    except httpx.HTTPError as exc:
        raise WeightsError(f"{file.source}: download from {url} failed ({exc})") from exc
    actual = git_blob_sha1(content)
    if actual != file.git_sha1:
        raise WeightsError(f"{file.source} has git blob id {actual}, but the Hub's tree publishes {file.git_sha1}; "
                           "the file was not kept. Check the source or the mirror serving it")
    digest = hashlib.sha256(content).hexdigest()
    for folder in ("sha256", "partial", "git-sha1"):
        (weights_dir / folder).mkdir(parents=True, exist_ok=True)
    staged = weights_dir / "partial" / f"{digest}.git-{secrets.token_hex(4)}"
    staged.write_bytes(content)
    try:
        kind = None if allow_pickle else pickle_format(staged)
        if kind is not None:
            raise WeightsError(f"{file.source} is {kind}, which can run code when loaded; set allow_pickle: true on "
                               "the model if you trust it")
        os.replace(staged, weights_dir / "sha256" / digest)
    finally:
        staged.unlink(missing_ok=True)
    record.write_text(digest + "\n")
    return digest


async def expand_directory(source: str, weights_dir: Path, client: httpx.AsyncClient, *, set_sha256: str = "",
                           token: str | None = None, endpoint: str | None = None,
                           allow_pickle: bool = False) -> list[tuple[WeightsSpec, str]]:
    """The files of directory `source` as (spec to fetch, name relative to the directory), sorted by name: LFS files
    with their lfs.oid, files kept in git already verified and cached (see the module). When `set_sha256` is given
    the set must have that digest (`set_digest`). Raises WeightsError (`list_tree`, `files_of_tree`, a git blob id
    that differs, or a set digest that differs, naming the digest found). Cancellable."""
    files = files_of_tree(source, await list_tree(source, client, token=token, endpoint=endpoint),
                          allow_pickle=allow_pickle)
    digests = {f.name: f.sha256 or await _sha256_of_git_file(f, Path(weights_dir), client, token, endpoint,
                                                             allow_pickle)
               for f in files}
    found = set_digest([f.name for f in files], [digests[f.name] for f in files])
    if set_sha256 and found != set_sha256.lower():
        raise WeightsError(f"{source}: the set of {len(files)} files has digest {found}, but the model pins "
                           f"{set_sha256}; the files were not fetched. Check the revision, or write the digest found "
                           "if the listing is what you expect")
    return [(WeightsSpec(f.source, digests[f.name], token), f.name) for f in files]


async def fetch_all(files: Sequence[object], weights_dir: Path, mirrors: Sequence[Path] = (), *,
                    allow_pickle: bool = False, token: str | None = None, progress: Progress | None = None,
                    hf_endpoint: str | None = None,
                    transport: httpx.AsyncBaseTransport | None = None, offline: bool = False
                    ) -> tuple[list[Path], list[str], list[str | None]]:
    """`llmgw.agent.weights.fetch` of `files` (as it takes them), directory sources first expanded into their files
    (`expand_directory`; a directory item's `sha256` is the set's digest, or empty). Returns the cached paths, the
    source of each and its name relative to its directory source (None for a file listed by itself), in the
    catalog's order with each directory's files in its place, sorted by name. `offline`: mirrors only (a directory
    source, listed from the Hub, is refused). Raises WeightsError (`expand_directory`, `fetch`).
    Cancellable."""
    wanted: list[WeightsSpec] = []
    names: list[str | None] = []
    async with httpx.AsyncClient(follow_redirects=True, transport=transport, verify=default_verify(),
                                 timeout=httpx.Timeout(30.0, read=120.0)) as client:
        for item in files:
            source = getattr(item, "source", None)
            if not (isinstance(source, str) and is_directory_source(source)):
                wanted.append(spec_of(item))
                names.append(None)
                continue
            if offline:
                raise WeightsError(f"{source}: a directory source is listed from the Hub, and this node fetches from "
                                   "its offline mirror only: list the model's files one by one with their sha256")
            if progress:
                progress(0.0, f"{source}: listing the directory")
            own = getattr(item, "secret_value", None) or token
            listed = await expand_directory(source, Path(weights_dir), client,
                                            set_sha256=getattr(item, "sha256", "") or "", token=own,
                                            endpoint=hf_endpoint, allow_pickle=allow_pickle)
            wanted += [spec for spec, _ in listed]
            names += [name for _, name in listed]
            if progress:  # the digest found, for an operator who wants to pin the set
                digest = set_digest([name for _, name in listed], [spec.sha256 for spec, _ in listed])
                progress(0.0, f"{source}: {len(listed)} files, set sha256 {digest}")
    paths = await fetch(wanted, weights_dir, mirrors, allow_pickle=allow_pickle, token=token, progress=progress,
                        hf_endpoint=hf_endpoint, transport=transport, offline=offline)
    return paths, [spec.source for spec in wanted], names
