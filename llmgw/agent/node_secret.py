"""The node's secret: what proves to a control plane that a Register comes from this node (issue 25, item 1).

The agent makes it once, 32 random bytes as URL-safe base64 (43 characters, `secrets.token_urlsafe(32)`), and keeps
it in `<state_dir>/node-secret`, mode 0600, created with O_EXCL so two agents starting at once cannot write two.
Every Register carries it (`Register.node_secret`); the control plane keeps only its SHA-256, recorded on the node
id's first Register, and refuses a Register of that id with any other secret (`llmgw.control.node_identity`).
The same state directory after a restart, a reinstall of llmgw or a reboot keeps the node's identity; a new state
directory is a new identity, which the operator lets in with `llmgw node forget-identity ID` (or, over mutual TLS,
the node's certificate vouches for it).

Blocking file I/O: call at start (`NodeAgent.__init__`) or in a thread.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from llmgw.errors import UsageError

log = logging.getLogger("llmgw.agent")

SECRET_FILE = "node-secret"
SECRET_BYTES = 32


def load_or_create_secret(state_dir: str | os.PathLike[str]) -> str:
    """The node secret kept in `<state_dir>/node-secret`, made there (mode 0600) when there is none.

    A file readable by others is narrowed to 0600 (logged): the secret may have been read, but refusing to start
    would not take that back. Raises UsageError when the file holds something that is not a secret this module
    made (it is left alone: the operator decides), or cannot be read or written (OSError as a sentence).
    """
    path = Path(state_dir) / SECRET_FILE
    try:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return _read(path)
        secret = secrets.token_urlsafe(SECRET_BYTES)
        with os.fdopen(descriptor, "w") as file:
            file.write(secret + "\n")
            file.flush()
            os.fsync(file.fileno())
        log.info("made this node's secret in %s (mode 0600); it proves the node's identity at Register", path)
        return secret
    except OSError as exc:
        raise UsageError(f"cannot read or make the node secret {path}: {exc}; the agent cannot register without "
                         "it. Check the state directory's owner and permissions.") from exc


def _read(path: Path) -> str:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, 0o600)
        log.warning("the node secret %s was readable by others (mode %o); it is 0600 now", path, mode)
    secret = path.read_text().strip()
    if len(secret) < 32 or not secret.isascii() or not secret.isprintable() or " " in secret:
        raise UsageError(f"{path} does not hold a node secret (at least 32 printable characters); move it away "
                         "to make a new one, then let the node in again on the control plane "
                         "(`llmgw node forget-identity NODE_ID`).")
    return secret
