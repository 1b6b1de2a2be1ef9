"""The admin API's routes of API keys (issue 36): an operator's for every project, a project member's for their
own projects, a viewer's to read.

    GET  /api/v1/keys?project=P          the keys of P (every project's without P: operators and viewers only)
    POST /api/v1/keys {"project", "name"} a new key of P: its plaintext once, under "key"
    POST /api/v1/keys/{id}/revoke         revoke it (idempotent)

`serve_keys` decides and does one request and returns (HTTP status, JSON document); who may (`keys_refusal`) is a
pure rule over the caller's `Access`. A key made or revoked by a person records their e-mail (`created_by`,
`revoked_by` on the key: `llmgw keys list` and the console show them); nobody's token records nobody. The store
calls run in the admin API's worker threads.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from llmgw.control.admin_inputs import AdminInputError, body_text
from llmgw.errors import UsageError
from llmgw.settings import MEMBER, OPERATOR, VIEWER, Access
from llmgw.store import ApiKey

KEYS_PATH = "/api/v1/keys"
log = logging.getLogger("llmgw.control.admin")


def serves(path: str) -> bool:
    """Whether `path` is one of these routes."""
    return path == KEYS_PATH or (path.startswith(KEYS_PATH + "/") and path.endswith("/revoke")
                                 and path.count("/") == 5)


def key_json(key: ApiKey, now: float) -> dict[str, Any]:
    """A key as the admin API shows it: id, project, name, prefix, state at `now`, times (unix seconds), and who
    made and revoked it (an e-mail, None: nobody's token or the CLI)."""
    return {"id": key.key_id, "project": key.project, "name": key.name, "prefix": key.prefix,
            "state": str(key.state(now)), "created_at": key.created_at, "expires_at": key.expires_at,
            "revoked_at": key.revoked_at, "created_by": key.created_by, "revoked_by": key.revoked_by}


def keys_refusal(access: Access | None, method: str, project: str | None) -> str | None:
    """Why the caller of `access` (None: nobody's token, which passes) may not `method` the keys of `project`
    (None: of every project); None when they may. Pure."""
    if access is None or access.role == OPERATOR:
        return None
    if access.role == VIEWER:
        return None if method == "GET" else (f"{access.email} is a viewer (projects.yaml people.viewers): viewers "
                                             "read keys and make or revoke none; ask an operator or a member of the "
                                             "project.")
    if access.role == MEMBER and project is not None and project in access.projects:
        return None
    if access.role == MEMBER:
        what = f"project {project}'s keys" if project else "every project's keys"
        return (f"{access.email} is a member of {', '.join(access.projects)}, not of what this asks ({what}): "
                "members see, make and revoke their own projects' keys.")
    return f"{access.email} has no role in projects.yaml: ask an operator."


async def serve_keys(admin: Any, access: Access | None, method: str, path: str, query: dict[str, str],
                     body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One request of these routes for the caller of `access` (None: nobody's token): (status, document).
    Raises AdminInputError (400) for a missing or unknown project."""
    store, now = admin.plane.store, time.time()
    by = access.email if access is not None else None
    if store is None:
        raise UsageError("this control plane has no store: no API keys")
    if method == "GET" and path == KEYS_PATH:
        project = query.get("project") or None
        if (why := keys_refusal(access, method, project)) is not None:
            return 403, {"error": {"type": "forbidden", "message": why}}
        keys = await admin.in_store_thread(store.list_api_keys, project)
        return 200, {"keys": [key_json(key, now) for key in keys]}
    if method == "POST" and path == KEYS_PATH:
        project = body_text(body, "project", "")
        settings = admin.plane.snapshot().settings
        if not project or settings is None or project not in settings.projects:
            raise AdminInputError("project", f"no project {project!r} in projects.yaml: say {{\"project\": NAME}} "
                                  "with a project of the settings in force")
        if (why := keys_refusal(access, method, project)) is not None:
            return 403, {"error": {"type": "forbidden", "message": why}}
        key, plaintext = await admin.in_store_thread(functools.partial(store.create_api_key, created_by=by), project,
                                                     body_text(body, "name", "") or None)
        log.info("API key %s of project %s made by %s", key.key_id, project, by or "nobody's admin token")
        return 200, {**key_json(key, now), "key": plaintext}
    if method == "POST":
        key_id = path.split("/")[4]
        known = {key.key_id: key for key in await admin.in_store_thread(store.list_api_keys, None)}
        if key_id not in known:
            return 404, {"error": {"type": "not_found", "message": f"there is no API key {key_id!r}"}}
        if (why := keys_refusal(access, method, known[key_id].project)) is not None:
            return 403, {"error": {"type": "forbidden", "message": why}}
        revoked = await admin.in_store_thread(functools.partial(store.revoke_api_key, by=by), key_id)
        log.info("API key %s of project %s revoked by %s", key_id, revoked.project, by or "nobody's admin token")
        return 200, key_json(revoked, now)
    return 404, {"error": {"type": "not_found", "message": f"no route {method} {path}"}}
