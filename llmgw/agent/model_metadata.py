"""Reading a model's metadata from the Hub (or any HTTP server) without fetching its weights: HTTP Range reads of
each file's header only, parsed by `llmgw.tools.model_headers`.

Sources (the catalog's spelling, `llmgw.agent.weights`):

- `hf://org/repo[@revision]/path/model.gguf` (or `https://.../model.gguf`): one GGUF file. Its header is read
  with `Range: bytes=0-<n>` from the Hub's resolve URL (`<endpoint>/<org>/<repo>/resolve/<revision>/<path>`, the
  same the weights fetcher uses), asking for more (the missing bytes only) while the header goes on: 1 MiB first,
  then twice what was read, so at most twice the header plus 1 MiB is read.
- `hf://org/repo[@revision]/[dir/]` (ending in "/"): a repository (or a directory of one) in Hugging Face's format.
  Its files are listed by the Hub's tree API (`llmgw.agent.weights_tree`, the fetcher's listing), `config.json` is
  read whole (a few kB), and each `*.safetensors` file's first 8 + N bytes (its length, then its JSON header).

The Hub's answer to an LFS file's resolve URL (a redirect) names its sha256 (`X-Linked-Etag`): a GGUF's is kept
(`ModelFacts.sha256`), for the catalog's `sha256:` (the explorer's serve form). A server that ignores Range (answers 200) is read only as far as asked, then the connection is closed. The token
is sent as Bearer to the Hub only (httpx drops it on a redirect to another host, the Hub's CDN).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from urllib.parse import quote

import httpx

from llmgw.agent.weights import HF_DEFAULT_ENDPOINT, hub_url
from llmgw.agent.weights_tree import MAX_TREE_PAGES
from llmgw.errors import WeightsError
from llmgw.tools.model_headers import (
    ModelFacts, NeedMoreBytes, combined, parse_gguf_header, parse_safetensors_header, safetensors_header_length,
)
from llmgw.tools.values import ParseError
from llmgw.http_trust import default_verify

FIRST_READ_BYTES = 1 << 20
"""The first Range read of a GGUF file (most headers of small models fit; a 256k vocabulary takes about 6 MB)."""
MAX_CONFIG_BYTES = 1 << 20
_REPOSITORY = re.compile(r"^hf://(?P<repo>[^/@\s]+/[^/@\s]+)(?:@(?P<revision>[^/\s]+))?/(?P<path>(?:[^/\s@]+/)*)$")


@dataclass
class _Reads:
    """Bytes read from the server, all requests together (what `ModelFacts.header_bytes` reports)."""

    bytes: int = 0
    sha256: str = ""  # the Hub's X-Linked-Etag of the GGUF read (an LFS file's sha256)


def _endpoint(endpoint: str | None) -> str:
    return (endpoint or os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")


def _url_of(source: str, endpoint: str | None) -> str:
    if source.startswith("hf://"):
        return hub_url(source, endpoint)
    if source.startswith(("https://", "http://")):
        return source
    raise WeightsError(f"{source}: the explorer reads hf://org/repo@revision/file.gguf, hf://org/repo@revision/ (a "
                       "repository of safetensors files) or an https:// GGUF URL")


def check_source(source: str) -> None:
    """Refuse a `source` the explorer cannot read, before any network or fleet read: WeightsError naming it when it is
    neither hf://org/repo@revision/file.gguf, hf://org/repo@revision/ nor an http(s):// URL. No I/O."""
    if source.endswith("/") and source.startswith("hf://"):
        _parse_repository(source)
    else:
        _url_of(source, HF_DEFAULT_ENDPOINT)


async def _read_range(client: httpx.AsyncClient, url: str, source: str, start: int, end: int, headers: dict,
                      reads: _Reads) -> tuple[bytes, int | None]:
    """Bytes `start`..`end` (inclusive) of `url` (fewer at the file's end), and the file's size when the answer says
    it (Content-Range's total, or a 200's Content-Length). Raises WeightsError naming the status."""
    wanted = end - start + 1
    try:
        # identity: a range of the file's own bytes, never of a compressed body
        async with client.stream("GET", url, headers={**headers, "Range": f"bytes={start}-{end}",
                                                      "Accept-Encoding": "identity"}) as answer:
            if answer.status_code == 416:
                return b"", None
            if answer.status_code in (401, 403):
                raise WeightsError(f"{source}: the server answered {answer.status_code} at {url}; a gated model "
                                   "needs a Hub token (--token-file, or $HF_TOKEN)")
            if answer.status_code == 404:
                raise WeightsError(f"{source}: not found (404 at {url}); check the repository, revision and path")
            if answer.status_code not in (200, 206):
                raise WeightsError(f"{source}: the server answered HTTP {answer.status_code} at {url}")
            total: int | None = None
            for step in answer.history:  # the Hub's resolve answer (a redirect to its CDN) names an LFS file's sha256
                etag = step.headers.get("X-Linked-Etag", "").strip('"')
                if re.fullmatch(r"[0-9a-f]{64}", etag):
                    reads.sha256 = etag
            if answer.status_code == 206:
                match = re.fullmatch(r"bytes \d+-\d+/(\d+)", answer.headers.get("Content-Range", ""))
                total = int(match.group(1)) if match else None
            elif answer.headers.get("Content-Length", "").isdigit():
                total = int(answer.headers["Content-Length"])
            skip = start if answer.status_code == 200 else 0  # a server that ignores Range sends from byte 0
            data = bytearray()
            async for chunk in answer.aiter_bytes():
                reads.bytes += len(chunk)
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                data += chunk
                if len(data) >= wanted:
                    break  # closing the stream ends a 200 that would send the whole file
            return bytes(data[:wanted]), total
    except httpx.HTTPError as exc:
        raise WeightsError(f"{source}: reading {url} failed ({exc})") from exc


async def _gguf(client: httpx.AsyncClient, source: str, url: str, headers: dict, reads: _Reads,
                size: int | None = None) -> ModelFacts:
    data, total = await _read_range(client, url, source, 0, FIRST_READ_BYTES - 1, headers, reads)
    size = size or total
    while True:
        try:
            return parse_gguf_header(data, source, size or 0)
        except NeedMoreBytes as more:
            if size is not None and len(data) >= size:
                raise WeightsError(f"{source}: the file ends inside its GGUF header; it is cut short") from None
            following, _ = await _read_range(client, url, source, len(data), more.at_least - 1, headers, reads)
            if not following:
                raise WeightsError(f"{source}: the file ends inside its GGUF header; it is cut short") from None
            data += following
        except ParseError as exc:
            raise WeightsError(str(exc)) from exc


async def _safetensors(client: httpx.AsyncClient, source: str, url: str, headers: dict, reads: _Reads,
                       size: int) -> ModelFacts:
    data, _ = await _read_range(client, url, source, 0, 7, headers, reads)
    try:
        end = safetensors_header_length(data, source)
        rest, _ = await _read_range(client, url, source, len(data), end - 1, headers, reads)
        return parse_safetensors_header(data + rest, source, size)
    except (NeedMoreBytes, ParseError) as exc:
        raise WeightsError(f"{source}: not a safetensors header ({exc})") from exc


def _parse_repository(source: str) -> tuple[str, str, str]:
    match = _REPOSITORY.match(source)
    if not match:
        raise WeightsError(f"{source}: a repository is written hf://org/repo@revision/ (or hf://org/repo/ for main)")
    return match["repo"], match["revision"] or "main", match["path"]


async def _tree(client: httpx.AsyncClient, source: str, headers: dict, endpoint: str | None) -> list[dict]:
    repo, revision, path = _parse_repository(source)
    folder = f"/{quote(path.rstrip('/'))}" if path else ""
    url: str | None = f"{_endpoint(endpoint)}/api/models/{repo}/tree/{quote(revision, safe='')}{folder}?recursive=true"
    entries: list[dict] = []
    for _ in range(MAX_TREE_PAGES):
        if url is None:
            break
        try:
            answer = await client.get(url, headers=headers)
        except httpx.HTTPError as exc:
            raise WeightsError(f"{source}: cannot list the repository at {url} ({exc})") from exc
        if answer.status_code != 200:
            raise WeightsError(f"{source}: listing the repository answered HTTP {answer.status_code} at {url}; "
                               "check the repository and revision (a gated one needs a token)")
        page = answer.json()
        if not isinstance(page, list):
            raise WeightsError(f"{source}: the tree at {url} is not a JSON array of entries")
        entries += [e for e in page if isinstance(e, dict) and e.get("type") == "file"]
        following = answer.links.get("next", {}).get("url")
        url = str(answer.url.join(following)) if following else None
    if url is not None:
        raise WeightsError(f"{source}: the repository lists more than {MAX_TREE_PAGES} pages of files")
    return [{**e, "path": e["path"][len(path):]} for e in entries
            if isinstance(e.get("path"), str) and e["path"].startswith(path)]


async def read_model_facts(source: str, *, client: httpx.AsyncClient, token: str | None = None,
                           endpoint: str | None = None) -> ModelFacts:
    """What `source`'s metadata says (see the module), read without its weights; `header_bytes` counts every byte
    the server sent. `endpoint` the Hub's (default `$HF_ENDPOINT` or huggingface.co), `token` sent as Bearer.

    Raises WeightsError naming the source: not found, refused (a gated model without a token), not GGUF or
    safetensors, or a repository without safetensors files. Cancellable."""
    reads = _Reads()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if not source.endswith("/"):
        facts = await _gguf(client, source, _url_of(source, endpoint), headers, reads)
        return replace(facts, header_bytes=reads.bytes, sha256=reads.sha256)
    repo, revision, path = _parse_repository(source)
    files = await _tree(client, source, headers, endpoint)
    ggufs = sorted(e["path"] for e in files if e["path"].endswith(".gguf"))
    tensors = sorted((e["path"], e.get("size")) for e in files if e["path"].endswith(".safetensors"))
    if not tensors:
        hint = f"; it holds GGUF files, name one: {source}{ggufs[0]}" if ggufs else ""
        raise WeightsError(f"{source}: the repository holds no .safetensors file{hint}")

    def url(name: str) -> str:
        return hub_url(f"hf://{repo}@{revision}/{path}{name}", endpoint)

    config = None
    if any(e["path"] == "config.json" for e in files):
        raw, _ = await _read_range(client, url("config.json"), source, 0, MAX_CONFIG_BYTES - 1, headers, reads)
        try:
            config = json.loads(raw)
        except ValueError as exc:
            raise WeightsError(f"{source}: config.json is not JSON ({exc})") from exc
    parts = [await _safetensors(client, f"{source}{name}", url(name), headers, reads, size if isinstance(size, int)
                                else 0) for name, size in tensors]
    try:
        facts = combined(source, parts, config if isinstance(config, dict) else None)
    except ParseError as exc:
        raise WeightsError(str(exc)) from exc
    return replace(facts, header_bytes=reads.bytes)


async def read_source(source: str, *, token: str | None = None, endpoint: str | None = None) -> ModelFacts:
    """`read_model_facts` with a client of its own (redirects followed, 30 s timeouts). Raises WeightsError.
    Cancellable."""
    async with httpx.AsyncClient(follow_redirects=True, timeout=httpx.Timeout(30.0), verify=default_verify()) as client:
        return await read_model_facts(source, client=client, token=token, endpoint=endpoint)
