"""Linux users llmgw creates on a host (for the agent, Slurm), recorded so that removing them leaves /etc as it was.

useradd and userdel rewrite /etc/passwd, group, shadow and gshadow and leave the previous version of each as a backup
beside it (/etc/passwd- ...): after `useradd` then `userdel` the four files are as before, but their backups are
not (measured on Debian 12's shadow-utils 4.13: the backups then hold the user's lines). So the entry records each
of `SIDE_FILES` as it was before (a copy in the journal's `backups/`), and undoing puts them back after `userdel`.
"""

from __future__ import annotations

import pwd
from pathlib import Path

from llmgw.errors import InstallError
from llmgw.install.commands import Runner, check_command, run_command
from llmgw.install.journal import CreatedUser, Journal, sha256_of, write_atomically

SIDE_FILES = ("/etc/passwd-", "/etc/group-", "/etc/shadow-", "/etc/gshadow-", "/etc/subuid", "/etc/subgid",
              "/etc/.pwd.lock")


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def create_user(journal: Journal, name: str, *, home: Path | None = None, run: Runner = run_command) -> None:
    """Create the system user `name` with its own group and no login shell, recorded first (module docstring);
    `home` is its home directory's path (not made here: a unit's StateDirectory, say). Nothing is done for a user
    the journal already lists. Raises InstallError when a user of that name exists that llmgw did not make, or when
    useradd fails."""
    if any(isinstance(e, CreatedUser) and e.name == name for e in journal):
        return
    if user_exists(name):
        raise InstallError(f"user {name} exists and llmgw did not make it: llmgw will not take it over (or remove "
                           "it later); remove it or choose another name")
    files = tuple((path, journal.keep_copy(Path(path))) for path in SIDE_FILES)
    journal.record(CreatedUser(name, files))
    home_dir = ["--home-dir", str(home)] if home else []
    check_command(run(["useradd", "--system", "--user-group", "--no-create-home", *home_dir, "--shell",
                       "/usr/sbin/nologin", name]), f"user {name}")


def remove_user(entry: CreatedUser, journal: Journal, run: Runner = run_command) -> str:
    """`userdel` the user of `entry`, then put back its side files as they were; "removed", or "absent" when the
    user was gone already (the side files are put back either way). Raises InstallError when userdel fails."""
    action = "absent"
    if user_exists(entry.name):
        check_command(run(["userdel", entry.name]), f"user {entry.name}")
        action = "removed"
    for path, digest in entry.files:
        side = Path(path)
        if not digest:
            if path.endswith("-") or (side.is_file() and side.stat().st_size == 0):  # a backup, or made empty
                side.unlink(missing_ok=True)
        elif not side.is_file() or sha256_of(side) != digest:
            mode = side.stat().st_mode & 0o7777 if side.is_file() else 0o600
            write_atomically(side, (journal.backups / digest).read_bytes(), mode)  # owner kept (root:shadow)
    return action
