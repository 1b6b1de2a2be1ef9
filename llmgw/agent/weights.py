"""Fetching model weights into a content-addressed cache, always checked against their sha256.

Layout (the same for the cache and for offline mirrors):

    <weights_dir>/sha256/<digest>     verified files, named by the hex sha256 of their content
    <weights_dir>/partial/<digest>    downloads in progress, resumed with HTTP Range after an interruption

Sources: `hf://org/repo[@revision]/path` (the Hub's resolve URL `<endpoint>/<org>/<repo>/resolve/<revision or
main>/<path>`, endpoint from the argument, `$HF_ENDPOINT` or https://huggingface.co, token sent as Bearer to the Hub
only), `https://...` / `http://...`, and `file://...`. Mirrors are searched first by digest; a file found there is
hard-linked when on the same file system, else copied, and checked like any other.

Pickles are refused by content as well as by name (`llmgw.agent.pickles.pickle_format`): a file whose first bytes
are a pickle of any protocol (0x80, the protocol 2-5 and valid opcodes; or, for protocols 0 and 1, which have no
PROTO opcode, opcodes that parse with the unpickler's stack from the first byte) or that is a zip holding
`data.pkl` (PyTorch's checkpoint layout) is refused, after the download and before it becomes `sha256/<digest>` (and when such a file
is already in the cache), unless the model sets `allow_pickle`. GGUF (`GGUF` magic) and safetensors (an 8-byte
header length, then JSON) never match.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import httpx
import trio

from llmgw.agent.pickles import pickle_format
from llmgw.errors import WeightsError
from llmgw.groups import expect_leaves
from llmgw.http_trust import default_verify

HF_DEFAULT_ENDPOINT = "https://huggingface.co"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""Formats that run code when loaded (Python pickle); refused unless the model sets `allow_pickle`."""
MAX_PARALLEL = 4
"""Files fetched and verified at once."""
CHUNK = 1 << 20

Progress = Callable[[float, str], None]
"""`progress(fraction, text)`: bytes done over bytes known (0..1) across all files of one fetch, and a line of text."""


@dataclass(frozen=True)
class WeightsSpec:
    """One file to fetch: `source` URL and hex `sha256`; `token` overrides the fetch's token for this file."""

    source: str
    sha256: str
    token: str | None = None


def spec_of(item: object) -> WeightsSpec:
    """Accept a WeightsSpec, the settings' or the wire's WeightsFile (`.source`, `.sha256`, `.secret_value`) or a
    (source, sha256) pair."""
    if isinstance(item, WeightsSpec):
        return item
    if isinstance(item, tuple) and len(item) == 2:
        return WeightsSpec(str(item[0]), str(item[1]))
    source, digest = getattr(item, "source", None), getattr(item, "sha256", None)
    if not isinstance(source, str) or not isinstance(digest, str):
        raise WeightsError(f"{item!r} is not a weights file: it needs a source and a sha256")
    return WeightsSpec(source, digest, getattr(item, "secret_value", None) or None)


def hub_url(source: str, endpoint: str | None = None) -> str:
    """The resolve URL of `hf://org/repo[@revision]/path` at `endpoint` (default `$HF_ENDPOINT` or the Hub).

    Raises WeightsError when the source lacks an org, a repository or a path.
    """
    rest = source[len("hf://"):]
    parts = rest.split("/", 2)
    if len(parts) < 3 or not all(parts):
        raise WeightsError(f"{source!r} is not a Hub source; write hf://org/repo[@revision]/path/to/file")
    org, repo, path = parts
    repo, _, revision = repo.partition("@")
    base = (endpoint or os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")
    return f"{base}/{org}/{repo}/resolve/{quote(revision or 'main', safe='')}/{quote(path)}"


def check_request(spec: WeightsSpec, allow_pickle: bool) -> None:
    """Refuse, before any I/O, a bad digest, an unknown scheme, or a pickle format without `allow_pickle`."""
    digest = spec.sha256.lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise WeightsError(f"{spec.source}: sha256 {spec.sha256!r} is not 64 hex digits; copy it from the model card")
    scheme = spec.source.split("://", 1)[0] if "://" in spec.source else ""
    if scheme not in ("hf", "https", "http", "file"):
        raise WeightsError(f"{spec.source}: unknown source; use hf://, https:// or file://")
    name = urlparse(spec.source).path.lower()
    if not allow_pickle and name.endswith(PICKLE_SUFFIXES):
        raise WeightsError(f"{spec.source} is a pickle format ({', '.join(PICKLE_SUFFIXES)}), which can run code when "
                           "loaded; use safetensors or GGUF, or set allow_pickle: true on the model if you trust it")


def _refuse_pickle(path: Path, source: str, allow_pickle: bool) -> None:
    """Raise WeightsError when the file at `path` (fetched from `source`) is a pickle and not `allow_pickle`."""
    if allow_pickle:
        return
    kind = pickle_format(path)
    if kind is not None:
        raise WeightsError(f"{source} is {kind}, which can run code when loaded; use safetensors or GGUF, or set "
                           "allow_pickle: true on the model if you trust it")


class _Tally:
    """Bytes done and known across the files of one fetch, reported through `progress`."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self.done: dict[str, int] = {}
        self.total: dict[str, int] = {}

    def update(self, digest: str, done: int, total: int | None, text: str) -> None:
        self.done[digest] = done
        if total:
            self.total[digest] = total
        if self.progress:
            known = sum(self.total.values())
            self.progress(min(1.0, sum(self.done.values()) / known) if known else 0.0, text)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _no_space(exc: OSError, weights_dir: Path, what: str) -> WeightsError:
    try:
        free = shutil.disk_usage(weights_dir).free
    except OSError:
        free = -1
    return WeightsError(f"the disk under {weights_dir} is full while writing {what} ({free} bytes free); the partial "
                        "file was removed: free space or point weights_dir at a larger disk")


async def fetch(files: Sequence[object], weights_dir: Path, mirrors: Sequence[Path] = (), *,
                allow_pickle: bool = False, token: str | None = None, progress: Progress | None = None,
                hf_endpoint: str | None = None, transport: httpx.AsyncBaseTransport | None = None,
                offline: bool = False) -> list[Path]:
    """Make every file of `files` present and verified in `<weights_dir>/sha256/<digest>`; return their paths in
    the order given.

    `files`: WeightsSpec, WeightsFile (settings or wire) or (source, sha256) items. `mirrors`: directories laid out
    like the cache, searched first; `offline`: only them (and file:// sources), never the network. `token`: the Hub token (Bearer), sent only to the Hub endpoint. Up to
    MAX_PARALLEL files are fetched and verified at once. A file already in the cache is trusted (it was verified
    when placed there), but still refused when it is a pickle and not `allow_pickle` (another model may have
    allowed it). Raises WeightsError: bad digest or source, pickle format (by name or content, see
    `pickle_format`; the fetched file is deleted) without `allow_pickle`, HTTP
    failure (401/403 says a token is missing or refused), checksum mismatch (both digests named; the file is
    deleted), or a full disk (no partial file is left). Cancellable: a cancelled download keeps its partial file
    for the next attempt.
    """
    specs = [spec_of(item) for item in files]
    for spec in specs:
        check_request(spec, allow_pickle)
    weights_dir = Path(weights_dir)
    (weights_dir / "sha256").mkdir(parents=True, exist_ok=True)
    (weights_dir / "partial").mkdir(parents=True, exist_ok=True)
    tally = _Tally(progress)
    limiter = trio.CapacityLimiter(MAX_PARALLEL)
    unique = {spec.sha256.lower(): spec for spec in specs}
    async with httpx.AsyncClient(follow_redirects=True, transport=transport, verify=default_verify(),
                                 timeout=httpx.Timeout(30.0, read=300.0)) as client:
        try:
            async with trio.open_nursery() as nursery:
                for digest, spec in unique.items():
                    nursery.start_soon(_fetch_one, spec, digest, weights_dir, mirrors, token, hf_endpoint, client,
                                       tally, limiter, allow_pickle, offline)
        except BaseExceptionGroup as group:
            failures = expect_leaves(group, WeightsError)
            if len(failures) == 1:
                raise failures[0] from group
            raise WeightsError("; ".join(str(e) for e in failures)) from group
    return [weights_dir / "sha256" / spec.sha256.lower() for spec in specs]


async def _fetch_one(spec: WeightsSpec, digest: str, weights_dir: Path, mirrors: Sequence[Path], token: str | None,
                     hf_endpoint: str | None, client: httpx.AsyncClient, tally: _Tally,
                     limiter: trio.CapacityLimiter, allow_pickle: bool = False, offline: bool = False) -> None:
    final = weights_dir / "sha256" / digest
    if final.is_file():
        await trio.to_thread.run_sync(_refuse_pickle, final, spec.source, allow_pickle)
        size = final.stat().st_size
        tally.update(digest, size, size, f"{spec.source}: in the cache")
        return
    async with limiter, _digest_lock(weights_dir, digest):
        if final.is_file():  # another task or process fetched it while we waited
            await trio.to_thread.run_sync(_refuse_pickle, final, spec.source, allow_pickle)
            size = final.stat().st_size
            tally.update(digest, size, size, f"{spec.source}: in the cache")
            return
        for mirror in mirrors:
            candidate = Path(mirror) / "sha256" / digest
            if candidate.is_file():
                await _place_local(candidate, digest, weights_dir, tally, f"mirror {mirror}", spec.source,
                                   allow_pickle)
                return
        if spec.source.startswith("file://"):
            path = Path(unquote(urlparse(spec.source).path))
            if not path.is_file():
                raise WeightsError(f"{spec.source}: no such file")
            await _place_local(path, digest, weights_dir, tally, str(path), spec.source, allow_pickle)
            return
        if offline:
            raise WeightsError(f"{spec.source}: sha256 {digest} is not in the offline mirror "
                               f"{', '.join(str(m) for m in mirrors) or '(none configured)'} and this node fetches "
                               "from its mirror only: add the file to the bundle (`llmgw bundle create --weights`) "
                               "and import it again")
        if spec.source.startswith("hf://"):
            url = hub_url(spec.source, hf_endpoint)
            headers = {"Authorization": f"Bearer {spec.token or token}"} if (spec.token or token) else {}
        else:
            url, headers = spec.source, {}
        await _download(url, headers, spec.source, digest, weights_dir, client, tally, allow_pickle=allow_pickle)


@asynccontextmanager
async def _digest_lock(weights_dir: Path, digest: str) -> AsyncIterator[None]:
    """Hold `partial/<digest>.lock` (flock, polled so that waiting stays cancellable): one writer per digest across
    tasks and processes sharing a weights directory."""
    handle = (weights_dir / "partial" / f"{digest}.lock").open("a")
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await trio.sleep(0.2)
        yield
    finally:
        handle.close()  # releases the lock


def _verify_and_commit(staged: Path, digest: str, weights_dir: Path, origin: str, source: str = "",
                       allow_pickle: bool = False) -> None:
    """Hash `staged`; on a match (and when it is no pickle, or `allow_pickle`) move it to `sha256/<digest>`, else
    delete it and raise WeightsError."""
    actual = _sha256_file(staged)
    if actual != digest:
        staged.unlink(missing_ok=True)
        raise WeightsError(f"{origin} has sha256 {actual}, expected {digest}; the file was deleted. Check the digest "
                           "in the model's settings or the source")
    try:
        _refuse_pickle(staged, source or origin, allow_pickle)
    except WeightsError:
        staged.unlink(missing_ok=True)
        raise
    os.replace(staged, weights_dir / "sha256" / digest)


async def _place_local(path: Path, digest: str, weights_dir: Path, tally: _Tally, origin: str, source: str = "",
                       allow_pickle: bool = False) -> None:
    """Hard-link (same file system) or copy `path` into the cache, then verify it."""
    staged = weights_dir / "partial" / f"{digest}.local"
    staged.unlink(missing_ok=True)
    size = path.stat().st_size
    try:
        os.link(path, staged)
        how = "linked"
    except OSError:
        how = "copied"
        try:
            await trio.to_thread.run_sync(shutil.copyfile, path, staged, abandon_on_cancel=False)
        except OSError as exc:
            staged.unlink(missing_ok=True)
            if exc.errno == errno.ENOSPC:
                raise _no_space(exc, weights_dir, path.name) from exc
            raise WeightsError(f"cannot copy {path} into {weights_dir} ({exc})") from exc
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
    tally.update(digest, size // 2, size, f"{origin}: {how}, verifying")
    try:
        await trio.to_thread.run_sync(_verify_and_commit, staged, digest, weights_dir, f"{path} ({origin})", source,
                                      allow_pickle)
    finally:
        staged.unlink(missing_ok=True)
    tally.update(digest, size, size, f"{origin}: {how} and verified")


async def _download(url: str, headers: dict[str, str], source: str, digest: str, weights_dir: Path,
                    client: httpx.AsyncClient, tally: _Tally, *, retry_whole: bool = True,
                    allow_pickle: bool = False) -> None:
    """Download `url` into `partial/<digest>`, resuming from its current size with a Range request, then verify."""
    partial = weights_dir / "partial" / digest
    have = partial.stat().st_size if partial.is_file() else 0
    hasher = hashlib.sha256()
    if have:
        def _hash_existing() -> None:
            with partial.open("rb") as handle:
                for block in iter(lambda: handle.read(CHUNK), b""):
                    hasher.update(block)
        await trio.to_thread.run_sync(_hash_existing)
    request_headers = dict(headers)
    if have:
        request_headers["Range"] = f"bytes={have}-"
    try:
        async with client.stream("GET", url, headers=request_headers) as response:
            status = response.status_code
            if status == 416 and have:
                pass  # the partial file is already complete (or longer than the file): verify below
            elif status in (401, 403):
                raise WeightsError(f"{source}: the server answered {status}; "
                                   + ("the token was refused, check the named secret" if "Authorization" in headers
                                      else "it needs a token: name a secret holding a Hub token on the model"))
            elif status == 404:
                raise WeightsError(f"{source}: not found (404 at {url}); check the repository, revision and path")
            elif status not in (200, 206):
                raise WeightsError(f"{source}: the server answered HTTP {status} at {url}")
            else:
                if status == 200 and have:  # the server ignored Range: start again
                    have, hasher = 0, hashlib.sha256()
                length = response.headers.get("content-length")
                total = have + int(length) if length and length.isdigit() else None
                done = have
                try:
                    with partial.open("ab" if have else "wb") as out:
                        async for chunk in response.aiter_bytes(CHUNK):
                            out.write(chunk)
                            hasher.update(chunk)
                            done += len(chunk)
                            tally.update(digest, done, total, f"{source}: {done}/{total or '?'} bytes")
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        partial.unlink(missing_ok=True)
                        raise _no_space(exc, weights_dir, source) from exc
                    raise WeightsError(f"cannot write {partial} ({exc})") from exc
    except httpx.HTTPError as exc:
        raise WeightsError(f"{source}: download from {url} failed ({exc}); it resumes from byte "
                           f"{partial.stat().st_size if partial.is_file() else 0} on the next attempt") from exc
    actual = hasher.hexdigest()
    if actual != digest:
        if status == 416 and retry_whole:  # a stale partial file: drop it and download the whole file once
            partial.unlink(missing_ok=True)
            await _download(url, headers, source, digest, weights_dir, client, tally, retry_whole=False,
                            allow_pickle=allow_pickle)
            return
        partial.unlink(missing_ok=True)
        raise WeightsError(f"{source} has sha256 {actual}, expected {digest}; the file was deleted. Check the digest "
                           "in the model's settings or the source")
    try:
        await trio.to_thread.run_sync(_refuse_pickle, partial, source, allow_pickle)
    except WeightsError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, weights_dir / "sha256" / digest)
