"""The git hooks of a settings repository: `python -m llmgw.cli.hook_cmds pre-receive|post-receive`.

`llmgw repo init` installs two shell scripts that run this module (see llmgw.settings.repository); git gives them
the pushed ref updates on stdin and shows what they print on stderr to the pusher, prefixed with "remote:".
pre-receive: `llmgw.settings.hook.check_push` decides; its exit status accepts (0) or refuses (1) the push.
post-receive: POSTs `llmgw.settings.hook.notification`'s JSON body to `llmgw.notifyurl` (a running control plane)
with httpx, waiting at most NOTIFY_TIMEOUT seconds; a failure is a warning on stderr and never fails the push (the
control plane notices the push at its next poll). URLs are printed with any password or token replaced by `***`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO

import httpx

from llmgw.settings import redact_url
from llmgw.settings.hook import Notification, check_push, notification

NOTIFY_TIMEOUT = 2.0
USAGE = "usage: python -m llmgw.cli.hook_cmds pre-receive|post-receive"


def notify(message: Notification, out: TextIO, timeout: float = NOTIFY_TIMEOUT) -> bool:
    """POST `message` (JSON) to its URL directly (no proxy from the environment), waiting at most `timeout` seconds.

    Returns True when the control plane answered 2xx; otherwise prints a warning naming the URL (redacted) and
    the reason to `out` and returns False. Never raises for an unreachable, slow or refusing control plane, nor
    for a malformed URL. Blocking.
    """
    where = redact_url(message.url)
    try:
        response = httpx.post(message.url, content=message.body, timeout=timeout, trust_env=False,
                              headers={"Content-Type": "application/json"})
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
        reason = redact_url(str(exc)) or type(exc).__name__
    else:
        if response.is_success:
            return True
        reason = f"it answered HTTP {response.status_code}"
    print(f"warning: could not notify the control plane at {where} ({reason}); it will notice the push at its "
          "next poll", file=out)
    return False


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
        return check_push(stdin, repo_dir, out)
    if args[:1] == ["post-receive"]:
        message = notification(stdin, repo_dir)
        if message is not None:
            notify(message, out)
        return 0
    print(USAGE, file=out)
    return 2


if __name__ == "__main__":
    sys.exit(main())
