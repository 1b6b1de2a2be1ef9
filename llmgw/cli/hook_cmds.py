"""The git hooks of a settings repository: `python -m llmgw.cli.hook_cmds pre-receive|post-receive`.

`llmgw repo init` installs two shell scripts that run this module (see llmgw.settings.repository); git gives them
the pushed ref updates on stdin and shows what they print on stderr to the pusher, prefixed with "remote:".
pre-receive: `llmgw.settings.hook.judge_push` decides; its exit status accepts (0) or refuses (1) the push. The tree
ids it found valid are added to the repository's record of valid trees (`record_valid_trees`; the format is in
llmgw.settings.valid_trees), so that the control plane does not check them again; a record that cannot be written
is a warning and never fails the push (the control plane then validates the tree in full).
post-receive: POSTs `llmgw.settings.post_receive.notification`'s JSON body to `llmgw.notifyurl` (a running control plane)
with the repository's hook token (header X-Llmgw-Hook-Token) with httpx, waiting at most NOTIFY_TIMEOUT seconds; a failure is a warning on stderr and never fails the push (the
control plane notices the push at its next poll). URLs are printed with any password or token replaced by `***`.
Git starts Python twice per push: post-receive imports only llmgw.settings.post_receive, refs and valid_trees
(pygit2, no settings model), and httpx only when there is a URL to POST to; pre-receive imports the validation.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import sys
from collections.abc import Sequence
from typing import TextIO

from llmgw.settings.post_receive import Notification, notification
from llmgw.settings.refs import redact_url
from llmgw.settings.valid_trees import read_record, record_path, render_record, validation_key

NOTIFY_TIMEOUT = 2.0
USAGE = "usage: python -m llmgw.cli.hook_cmds pre-receive|post-receive"


def notify(message: Notification, out: TextIO, timeout: float = NOTIFY_TIMEOUT) -> bool:
    """POST `message` (JSON) to its URL directly (no proxy from the environment), waiting at most `timeout` seconds.

    Returns True when the control plane answered 2xx; otherwise prints a warning naming the URL (redacted) and
    the reason to `out` and returns False. Never raises for an unreachable, slow or refusing control plane, nor
    for a malformed URL. Blocking.
    """
    import ssl

    import httpx  # here, not at the top: post-receive with no notify URL, and pre-receive, never POST

    where = redact_url(message.url)
    try:
        headers = {"Content-Type": "application/json"}
        if message.token:
            headers["X-Llmgw-Hook-Token"] = message.token
        if message.ca_file:
            verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=message.ca_file)
        else:  # the system's CAs for https; none loaded for plain http (no TLS, no redirect followed): 0.17 s of CPU
            verify = httpx.URL(message.url).scheme == "https"
        response = httpx.post(message.url, content=message.body, timeout=timeout, trust_env=False,
                              headers=headers, verify=verify)
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
        reason = redact_url(str(exc)) or type(exc).__name__
    else:
        if response.is_success:
            return True
        reason = f"it answered HTTP {response.status_code}"
    print(f"warning: could not notify the control plane at {where} ({reason}); it will notice the push at its "
          "next poll", file=out)
    return False


def record_valid_trees(git_dir: str | os.PathLike[str], trees: Sequence[str], key: str | None = None) -> None:
    """Add `trees` (tree ids, 40 hex) under `key` (default: this llmgw's `validation_key()`) to the record of valid
    trees in `git_dir`, keeping its newest entries (see llmgw.settings.valid_trees).

    Concurrent pushes each run their hook: the read-modify-write holds an exclusive lock (flock on
    `<record>.lock`), and the new record is written to a new temporary file in the same directory, flushed to disk
    and renamed over the old one, so a reader sees the old record or the new one, never a part. A damaged record
    is replaced. Files are created with mode 0666 less the umask (what git's own files get), so a control plane
    running as another user of the repository's group can read the record. Blocking.
    Raises: OSError when the directory cannot be written (the caller warns; the tree is then validated in full).
    """
    target = record_path(git_dir)
    lock = os.open(f"{target}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = render_record(read_record(git_dir), trees, validation_key() if key is None else key)
        temporary = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(8)}"
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    finally:
        os.close(lock)


def main(argv: Sequence[str] | None = None, stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    """Run hook `argv[0]` in the repository git runs it in (GIT_DIR, else the current directory).

    Returns the hook's exit status: pre-receive 0 (accept) or 1 (refuse); post-receive always 0; 2 for a wrong
    argument.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    stdin = sys.stdin if stdin is None else stdin
    out = sys.stderr if out is None else out
    repo_dir = os.environ.get("GIT_DIR", ".")
    if args[:1] == ["pre-receive"]:
        from llmgw.settings.hook import judge_push  # here: it imports the settings model (post-receive needs none)

        verdict = judge_push(stdin, repo_dir, out)
        if verdict.valid_trees:
            try:
                record_valid_trees(repo_dir, verdict.valid_trees)
            except OSError as exc:
                print(f"warning: could not record the valid settings tree in {record_path(repo_dir)} ({exc}); "
                      "the control plane will validate it again", file=out)
        return verdict.status
    if args[:1] == ["post-receive"]:
        message = notification(stdin, repo_dir)
        if message is not None:
            notify(message, out)
        return 0
    print(USAGE, file=out)
    return 2


if __name__ == "__main__":
    sys.exit(main())
