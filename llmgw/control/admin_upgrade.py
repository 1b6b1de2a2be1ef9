"""The admin API's routes of `llmgw upgrade` (llmgw.control.admin hands them over here):

    POST /api/v1/upgrade?max_unavailable=N&paused=0|1&confirm_seconds=S&ready_timeout=S
         body: the release as a tar (application/octet-stream: the release directory's manifest.json, its signature and
         every file it lists), at most MAX_RELEASE_BYTES. Verified against releases.trusted_keys, then rolled out
         node by node (llmgw.control.upgrade_run); answers {"upgrade": the rollout as planned}.
    POST /api/v1/upgrade/pause | /api/v1/upgrade/resume     {"upgrade": the rollout}

The rollout's progress is in GET /api/v1/status ("upgrade"). Refusals are 409 (one under way, an agent too old, not
the leader, no trusted key) and 400 (a release that does not check, a bad parameter), each a sentence.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import trio

from llmgw.control.admin_inputs import AdminInputError, query_int
from llmgw.control.upgrades import upgrade_document
from llmgw.control.view import ControlView
from llmgw.errors import ReleaseError, UsageError

MAX_RELEASE_BYTES = 4 << 30
"""The largest release tar the admin API takes (llmgw with its dependency wheels is about 36 MB)."""
UPLOADS = "upgrades"
"""The directory under the control plane's state directory that holds the release tars received."""
ROUTES = ("/api/v1/upgrade", "/api/v1/upgrade/pause", "/api/v1/upgrade/resume")


def serves(method: str, path: str) -> bool:
    return method == "POST" and path in ROUTES


def _flag(query: dict[str, str], name: str) -> bool:
    text = query.get(name, "0").strip().lower()
    if text not in ("0", "1", "true", "false", ""):
        raise AdminInputError(name, f"{name} is 0 or 1, not {text[:20]!r}")
    return text in ("1", "true")


async def _receive_tar(receive, directory: Path) -> Path:
    """Write the request's body into a new file under `directory`; its path. Raises UsageError past
    MAX_RELEASE_BYTES or when the client goes away (the file is removed)."""
    directory.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix="release-", suffix=".tar", dir=directory)
    path = Path(name)
    size = 0
    try:
        with open(handle, "wb") as stream:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise UsageError("the client went away before the whole release was sent")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > MAX_RELEASE_BYTES:
                    raise UsageError(f"the release is larger than {MAX_RELEASE_BYTES} bytes")
                if chunk:
                    await trio.to_thread.run_sync(stream.write, chunk)
                if not message.get("more_body"):
                    return path
    except BaseException:
        path.unlink(missing_ok=True)
        raise


async def serve_upgrade(plane: ControlView, path: str, query: dict[str, str], receive, state_dir: Path
                        ) -> dict[str, Any]:
    """Answer one route of this module (`serves`): the rollout's document. Raises UsageError (409) or
    AdminInputError; a release that does not check is a UsageError naming why (409 is the API's refusal)."""
    runner = plane.upgrades
    if path.endswith("/pause"):
        return {"upgrade": upgrade_document(runner.pause(), _offset())}
    if path.endswith("/resume"):
        return {"upgrade": upgrade_document(runner.resume(), _offset())}
    if runner.current is not None and not runner.current.ended:
        raise UsageError(f"an upgrade to llmgw {runner.current.version} is under way: wait for it to end, or pause "
                         "it (`llmgw upgrade --pause`)")
    options = dict(max_unavailable=query_int(query, "max_unavailable", 1, 1, 10000),
                   paused=_flag(query, "paused"),
                   confirm_seconds=float(query_int(query, "confirm_seconds", 120, 5, 3600)),
                   ready_timeout=float(query_int(query, "ready_timeout", 300, 5, 86400)))
    uploads = state_dir / UPLOADS
    tar = await _receive_tar(receive, uploads)
    try:
        upgrade = await plane.upgrade(tar, **options)
    except ReleaseError as exc:
        tar.unlink(missing_ok=True)
        raise UsageError(f"the release does not check: {exc}") from exc
    except BaseException:
        tar.unlink(missing_ok=True)
        raise
    for old in uploads.glob("release-*.tar"):  # the tars of rollouts that ended
        if old != tar:
            old.unlink(missing_ok=True)
    return {"upgrade": upgrade_document(upgrade, _offset())}


def _offset() -> float:
    import time

    return time.time() - trio.current_time()
