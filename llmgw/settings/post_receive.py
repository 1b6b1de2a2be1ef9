"""What the post-receive hook of a settings repository sends (`notification`), light enough for a process git
starts on every push: it imports pygit2 and llmgw.settings.reading only (llmgw.settings imports its other modules
when their names are first read), not the settings model, jsonschema or ruamel.

The URL in git config `llmgw.notifyurl` and the JSON body {"refs": [{"ref", "old", "new"}]} to POST there, with the
token in the git directory's `llmgw-hook-token` (the control plane accepts an unsigned notification only with it)
and the CA file in `llmgw.notifyca` (an https control plane). The POST itself is the caller's
(`llmgw.cli.hook_cmds.notify`; llmgw.settings does no network I/O). `parse_updates` reads a hook's stdin for both
hooks (llmgw.settings.hook judges pushes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass

import pygit2

from llmgw.errors import SettingsError
from llmgw.settings.reading import open_repository

NOTIFY_URL_KEY = "llmgw.notifyurl"
NOTIFY_CA_KEY = "llmgw.notifyca"
"""Git config key: the CA certificate file the post-receive hook verifies an https notify URL with (unset: the
system's CAs)."""
HOOK_TOKEN_FILE = "llmgw-hook-token"
"""In the settings repository's git directory (mode 0600): the token the post-receive hook sends the control plane
(header X-Llmgw-Hook-Token); written by the control plane (`llmgw.settings.hook_token`)."""


@dataclass(frozen=True)
class RefUpdate:
    """One line of a hook's stdin: `ref` moves from `old` to `new` (40 hex each; ZERO: created / deleted)."""

    old: str
    new: str
    ref: str


@dataclass(frozen=True)
class Notification:
    """What post-receive sends: a JSON `body` (bytes) to POST to `url`, with the repository's hook `token` (""
    when there is none) and the CA file to verify an https `url` with (`ca_file`, "" for the system's CAs)."""

    url: str
    body: bytes
    token: str = ""
    ca_file: str = ""


def parse_updates(lines: Iterable[str]) -> list[RefUpdate]:
    """The `<old> <new> <ref>` lines of a hook's stdin, in order; other lines are skipped."""
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            out.append(RefUpdate(*parts))
    return out


def notification(lines: Iterable[str], repo_dir: str | os.PathLike[str]) -> Notification | None:
    """post-receive: what to POST where, or None when `llmgw.notifyurl` is not set or nothing moved.

    Blocking (reads the repository's config). Never raises: an unreadable repository means no notification.
    """
    updates = parse_updates(lines)
    try:
        repo = open_repository(repo_dir)
        url = repo.config[NOTIFY_URL_KEY] if NOTIFY_URL_KEY in repo.config else None
        ca_file = repo.config[NOTIFY_CA_KEY] if NOTIFY_CA_KEY in repo.config else ""
        token_file = os.path.join(repo.path, HOOK_TOKEN_FILE)
        token = open(token_file).read().strip() if os.path.isfile(token_file) else ""
    except (SettingsError, pygit2.GitError, KeyError, ValueError, OSError):
        url = None
    if not url or not updates:
        return None
    body = json.dumps({"refs": [{"ref": u.ref, "old": u.old, "new": u.new} for u in updates]}).encode()
    return Notification(url, body, token, ca_file)
