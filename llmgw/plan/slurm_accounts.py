"""Projects as Slurm accounts: the `sacctmgr` commands that make Slurm's accounts match projects.yaml. Pure.

Organisations, teams and projects become accounts (`org-<name>`, `team-<name>`, `<project>`), each under the one
above it; project members become users of their project's account, their login made from their e-mail
(`login_of`). llmgw marks what it makes with a Description starting "llmgw:" and only ever changes or deletes
accounts so marked: an account an administrator made is never touched. Format: slurm.schedmd.com/sacctmgr.html.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from llmgw.settings.model import Settings
from llmgw.tools.slurm import SlurmAccount, SlurmAssociation
from llmgw.tools.slurm_accounts import MARK, Command, WantedAccount
from llmgw.tools.slurm_accounts import account_commands as commands_for

_LOGIN = re.compile(r"[^a-z0-9_-]")


def login_of(email: str) -> str:
    """A Linux login from an e-mail address: its local part, lower case, other characters as '-', starting with a
    letter ("u" put in front otherwise), at most 32 characters. "Ada.Lovelace+x@acme.example" -> "ada-lovelace-x"."""
    login = _LOGIN.sub("-", email.split("@", 1)[0].lower()).strip("-") or "user"
    if not login[0].isalpha():
        login = "u" + login
    return login[:32]


def desired_accounts(settings: Settings, logins: Mapping[str, str] | None = None) -> dict[str, WantedAccount]:
    """Account name -> WantedAccount, parents before children (organisation, team, project); a project's users are
    its members' logins, sorted: from `logins` (e-mail -> the login the store gave it, `llmgw.plan.slurm_users`)
    where it has one, else `login_of`."""
    logins = logins or {}
    out: dict[str, WantedAccount] = {}
    for name in sorted(settings.organisations):
        out[f"org-{name}"] = WantedAccount("root", f"{MARK} organisation {name}", name)
    for name in sorted(settings.teams):
        team = settings.teams[name]
        out[f"team-{name}"] = WantedAccount(f"org-{team.organisation}", f"{MARK} team {name}", team.organisation)
    for name in sorted(settings.projects):
        project = settings.projects[name]
        out[name] = WantedAccount(f"team-{project.team}", f"{MARK} project {name}", project.organisation,
                                  tuple(sorted({logins.get(member) or login_of(member) for member in project.members})))
    return out


def account_commands(settings: Settings, cluster: str, accounts: Iterable[SlurmAccount],
                     assocs: Iterable[SlurmAssociation]) -> tuple[Command, ...]:
    """The `sacctmgr -i ...` argument lists that make `cluster` match `settings`' projects
    (`llmgw.tools.slurm_accounts.account_commands` over `desired_accounts`)."""
    return commands_for(desired_accounts(settings), cluster, accounts, assocs)
