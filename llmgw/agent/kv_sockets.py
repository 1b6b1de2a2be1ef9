"""Where vLLM engines publish their KV-cache events: IPC sockets in a directory only the engines' user can enter.

An IPC socket's path is a Unix socket name: to connect to it (or to bind that name first) a process needs to enter
every directory above it. The agent makes `<state_dir>/kv` with mode 0700, owned by its own user (the user its
engines run as), and refuses one that is not exactly that (a symbolic link, another owner, group or other access):
no other user of the node (a Slurm job's, say) can then publish into the mirror, subscribe to the engine's events, or
take the socket's name first (issue 25). A Unix socket's path must fit `sun_path` (107 bytes on Linux): when
`<state_dir>/kv` is too deep for that, the directory is `<temp dir>/llmgw-kv-<uid>-<digest>` instead (the digest
of the state directory's path: two agents of one user never share it), with the same checks.
Each shard's socket is named by a digest of its shard id (shard ids hold "/").
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

from llmgw.errors import EngineError

MAX_SOCKET_PATH = 100
"""Bytes: the longest IPC socket path used (Linux's sun_path holds 107 and a NUL; kept short of it)."""
_NAME_LENGTH = len("0123456789abcdef.sock")


def kv_socket_dir(state_dir: Path) -> Path:
    """The directory of the KV-event sockets (see the module), made when missing and checked: mode 0700, owned by
    this process's user, a real directory. Blocking (a few system calls). Raises EngineError saying what is wrong
    with an existing directory (the caller does not start the engine's events then)."""
    preferred = Path(state_dir).absolute() / "kv"
    if len(os.fsencode(str(preferred))) + 1 + _NAME_LENGTH > MAX_SOCKET_PATH:
        digest = hashlib.sha256(os.fsencode(str(preferred))).hexdigest()[:12]
        preferred = Path(tempfile.gettempdir()) / f"llmgw-kv-{os.getuid()}-{digest}"
    try:
        preferred.parent.mkdir(parents=True, exist_ok=True)
        preferred.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(preferred)
    except OSError as exc:
        raise EngineError(f"cannot make the KV-event socket directory {preferred}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise EngineError(f"{preferred} is not a directory (a link?); remove it, the agent makes it again")
    if info.st_uid != os.getuid():
        raise EngineError(f"the KV-event socket directory {preferred} belongs to uid {info.st_uid}, not to the agent's "
                          f"user ({os.getuid()}); remove it, the agent makes it again")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(preferred, 0o700)  # ours: made with a umask, or loosened by hand
    return preferred


def kv_endpoint(directory: Path, shard_id: str) -> str:
    """The ZMQ endpoint ("ipc:///.../<16 hex>.sock") of `shard_id`'s KV events in `directory`. Pure."""
    name = hashlib.sha256(shard_id.encode()).hexdigest()[:16]
    return f"ipc://{directory / name}.sock"
