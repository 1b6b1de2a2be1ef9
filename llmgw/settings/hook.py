"""The git hooks of a settings repository: `python -m llmgw.settings.hook pre-receive|post-receive`.

Git runs them in the bare repository with the pushed ref updates on stdin, one `<old> <new> <ref>` line each
(https://git-scm.com/docs/githooks#pre-receive). In pre-receive the pushed objects are still quarantined, so
the repository is opened from the environment (GIT_DIR, GIT_QUARANTINE_PATH, GIT_OBJECT_DIRECTORY...).

pre-receive: every updated branch head must validate; deleting `main` is refused. What the pusher sees on
refusal is the error list, `file:line:column: key: reason`, prefixed by git with "remote:".
post-receive: POST {"refs": [{"ref", "old", "new"}]} as JSON to `llmgw.notifyurl` (timeout NOTIFY_TIMEOUT
seconds); a failure is reported on stderr and never fails the push.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence

import pygit2

from llmgw.errors import SettingsError
from llmgw.settings.loading import load_commit
from llmgw.settings.repository import NOTIFY_URL_KEY

ZERO = "0" * 40
NOTIFY_TIMEOUT = 2.0


def _updates(lines: Iterable[str]) -> list[tuple[str, str, str]]:
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
    return out


def pre_receive(lines: Iterable[str], repo_dir: str, out=sys.stderr) -> int:
    """Check each pushed branch head; print the errors; return the exit status (0 accept, 1 refuse)."""
    refused = False
    for old, new, ref in _updates(lines):
        if not ref.startswith("refs/heads/"):
            continue
        if new == ZERO:
            if ref == "refs/heads/main":
                print(f"refusing to delete {ref}: it holds the cluster's settings", file=out)
                refused = True
            continue
        try:
            settings = load_commit(repo_dir, new, from_env=True)
        except SettingsError as exc:
            errors = [i for i in exc.issues if i.severity == "error"]
            print(f"refusing {ref} at {new[:12]}: {len(errors)} settings error{'s' if len(errors) != 1 else ''}:", file=out)
            for issue in exc.issues:
                print(f"  {issue}", file=out)
            refused = True
            continue
        for warning in settings.warnings:
            print(f"  {warning}", file=out)
        print(f"{ref} at {new[:12]}: settings valid", file=out)
    return 1 if refused else 0


def post_receive(lines: Iterable[str], repo_dir: str, out=sys.stderr) -> int:
    """Notify the control plane at `llmgw.notifyurl`, if set. Always returns 0."""
    updates = _updates(lines)
    try:
        repo = pygit2.Repository(repo_dir)
        url = repo.config[NOTIFY_URL_KEY] if NOTIFY_URL_KEY in repo.config else None
    except (pygit2.GitError, KeyError):
        url = None
    if not url or not updates:
        return 0
    body = json.dumps({"refs": [{"ref": r, "old": o, "new": n} for o, n, r in updates]}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=NOTIFY_TIMEOUT) as response:
            response.read(4096)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        print(f"warning: could not notify the control plane at {url} ({exc}); it will notice the push "
              "at its next poll", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for git: argv[0] is the hook name; the repository is the current directory (or GIT_DIR)."""
    args = list(sys.argv[1:] if argv is None else argv)
    repo_dir = os.environ.get("GIT_DIR", ".")
    if args[:1] == ["pre-receive"]:
        return pre_receive(sys.stdin, repo_dir)
    if args[:1] == ["post-receive"]:
        return post_receive(sys.stdin, repo_dir)
    print("usage: python -m llmgw.settings.hook pre-receive|post-receive", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
