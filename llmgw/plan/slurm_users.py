"""The Linux users llmgw makes on every Slurm node from project members (slurm.yaml `users: llmgw`). Pure.

Who: every member (e-mail) of every project in projects.yaml, once. Login: `login_of(email)` (the e-mail's local
part, lower case, other characters as '-'); when another member already holds that login, the fallback
`login_of(email)[:23] + "-" + 8 hex digits of sha256(email)` (deterministic, at most 32 characters). The store
gives each e-mail its login and a UID the first time it is seen (`Store.assign_slurm_users`, from FIRST_UID up) and
keeps both for good, so logins never move when members come and go, and a UID is never reused. The Slurm accounts'
users (`llmgw.plan.slurm_accounts`) are these same logins. Home: `<shared_path>/home/<login>`. SSH keys: slurm.yaml
`ssh_keys` (kept with `llmgw slurm users keys`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.plan.slurm_accounts import login_of
from llmgw.settings.model import Settings

FIRST_UID = 200000
"""The first UID llmgw gives; far above Debian's UID_MAX (60000) and the usual ranges of LDAP sites."""
SHELL = "/bin/bash"


@dataclass(frozen=True)
class WantedUser:
    """One Linux user every Slurm node should have: `login` and `uid` (the group of the same name has GID = UID),
    the member's `email` (written into the GECOS field as "llmgw user <email>", which is how an agent knows the
    users it made), `home` on the shared path, and the member's SSH public `keys` (authorized_keys lines)."""

    email: str
    login: str
    uid: int
    home: str
    keys: tuple[str, ...] = ()
    shell: str = SHELL


def member_emails(settings: Settings) -> tuple[str, ...]:
    """Every project member's e-mail once, sorted (empty unless slurm.yaml says `users: llmgw`)."""
    if settings.slurm.users != "llmgw":
        return ()
    return tuple(sorted({member for project in settings.projects.values() for member in project.members}))


def login_candidates(email: str) -> tuple[str, str]:
    """The logins to try for `email`, in order: `login_of(email)`, then its collision-safe fallback."""
    login = login_of(email)
    return login, f"{login[:23]}-{hashlib.sha256(email.encode()).hexdigest()[:8]}"


def home_of(shared_path: str, login: str) -> str:
    """A user's home: "<shared_path>/home/<login>"."""
    return f"{shared_path.rstrip('/')}/home/{login}"


def wanted_users(settings: Settings, assigned: Iterable[tuple[str, str, int]]) -> tuple[WantedUser, ...]:
    """The users of `settings`' members, from the store's (email, login, uid) rows (`assigned`; rows of e-mails
    that are no longer members are left out), sorted by UID, each with its home and its keys."""
    members = set(member_emails(settings))
    keys: Mapping[str, tuple[str, ...]] = settings.slurm.ssh_keys
    return tuple(sorted((WantedUser(email, login, uid, home_of(settings.slurm.shared_path, login),
                                    tuple(keys.get(email, ())))
                         for email, login, uid in assigned if email in members), key=lambda user: user.uid))


def users_digest_input(settings: Settings) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What of the users a node's part depends on, for its digest before the store is asked: each member's e-mail
    and keys, and the shared path. A change makes every Slurm node be configured again."""
    emails = member_emails(settings)
    return tuple((email, tuple(settings.slurm.ssh_keys.get(email, ()))) for email in emails) + (
        ((settings.slurm.shared_path, ()),) if emails else ())
