"""Downloading an engine archive or sdist to a file and checking its sha256 (engines only; weights have their own,
resumable fetcher in `llmgw.agent.weights`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import httpx
import trio

from llmgw.errors import EngineError
from llmgw.http_trust import default_verify

Progress = Callable[[float, str], None]
"""`progress(fraction, text)`: fraction of the current step done, 0..1; text says what is happening."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at `path` (read in 1 MiB blocks). Blocking."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


async def download_verified(url: str, target: Path, sha256: str, *, progress: Progress | None = None,
                            transport: httpx.AsyncBaseTransport | None = None) -> Path:
    """Download `url` to `target` unless a file with digest `sha256` is already there; return `target`.

    The body is written to `target.partial` and renamed only after its sha256 matched. Raises EngineError with both
    digests on a mismatch (the partial file is deleted) and on HTTP or network failures. Cancellable.
    """
    if target.is_file() and await trio.to_thread.run_sync(sha256_file, target) == sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        async with httpx.AsyncClient(follow_redirects=True, transport=transport, verify=default_verify(),
                                     timeout=httpx.Timeout(30.0, read=120.0)) as client:
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise EngineError(f"downloading {url} failed with HTTP {response.status_code}; "
                                      "check the URL in engines.yaml or use a mirror")
                total = int(response.headers.get("content-length") or 0)
                done = 0
                with partial.open("wb") as out:
                    async for chunk in response.aiter_bytes(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress and total:
                            progress(done / total, f"downloading {target.name}")
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise EngineError(f"downloading {url} failed ({exc}); check the network or use a mirror") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    actual = digest.hexdigest()
    if actual != sha256:
        partial.unlink(missing_ok=True)
        raise EngineError(f"{url} has sha256 {actual}, expected {sha256}; the file was deleted. "
                          "Check the digest in engines.yaml or the source")
    partial.replace(target)
    return target
