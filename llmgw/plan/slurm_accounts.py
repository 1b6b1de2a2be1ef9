"""Projects as Slurm accounts: the `sacctmgr` commands that make Slurm's accounts match projects.yaml. Pure.

Organisations, teams and projects become accounts (`org-<name>`, `team-<name>`, `<project>`), each under the one
above it; project members become users of their project's account, their login made from their e-mail
(`login_of`). llmgw marks what it makes with a Description starting "llmgw:" and only ever changes or deletes
accounts so marked: an account an administrator made is never touched. Format: slurm.schedmd.com/sacctmgr.html.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from llmgw.settings.model import Settings
from llmgw.tools.slurm import SlurmAccount, SlurmAssociation

MARK = "llmgw:"
_LOGIN = re.compile(r"[^a-z0-9_-]")

Command = tuple[str, ...]


def login_of(email: str) -> str:
    """A Linux login from an e-mail address: its local part, lower case, other characters as '-', starting with a
    letter ("u" put in front otherwise), at most 32 characters. "Ada.Lovelace+x@acme.example" -> "ada-lovelace-x"."""
    login = _LOGIN.sub("-", email.split("@", 1)[0].lower()).strip("-") or "user"
    if not login[0].isalpha():
        login = "u" + login
    return login[:32]


def desired_accounts(settings: Settings) -> dict[str, tuple[str, str, str]]:
    """Account name -> (parent, description, organisation), parents before children (organisation, team, project)."""
    out: dict[str, tuple[str, str, str]] = {}
    for name in sorted(settings.organisations):
        out[f"org-{name}"] = ("root", f"{MARK} organisation {name}", name)
    for name in sorted(settings.teams):
        team = settings.teams[name]
        out[f"team-{name}"] = (f"org-{team.organisation}", f"{MARK} team {name}", team.organisation)
    for name in sorted(settings.projects):
        project = settings.projects[name]
        out[name] = (f"team-{project.team}", f"{MARK} project {name}", project.organisation)
    return out


def account_commands(settings: Settings, cluster: str, accounts: Iterable[SlurmAccount],
                     assocs: Iterable[SlurmAssociation]) -> tuple[Command, ...]:
    """The `sacctmgr -i ...` argument lists (without "sacctmgr") that make `cluster`'s accounts and user
    associations match `settings`' projects, given what `sacctmgr show account` / `show assoc` print now.

    Order: accounts added parents first, users added, users removed, stale llmgw accounts deleted children first.
    An account named like one of llmgw's but not marked as llmgw's is left alone (and gets no users from llmgw).
    Returns () when Slurm already matches.
    """
    existing = {a.name: a for a in accounts}
    ours = {name for name, account in existing.items() if account.description.startswith(MARK)}
    wanted = desired_accounts(settings)
    users_now = {(a.account, a.user) for a in assocs if a.cluster == cluster and a.user}
    commands: list[Command] = []
    for name, (parent, description, organisation) in wanted.items():
        if name not in existing:
            commands.append(("-i", "add", "account", name, f"Cluster={cluster}", f"Parent={parent}",
                             f"Description={description}", f"Organization={organisation}"))
    usable = {name for name in wanted if name not in existing or name in ours}
    wanted_users = {(project, login_of(member)) for project in settings.projects if project in usable
                    for member in settings.projects[project].members}
    for account, user in sorted(wanted_users - users_now):
        commands.append(("-i", "add", "user", user, f"Account={account}", f"Cluster={cluster}"))
    for account, user in sorted(users_now - wanted_users):
        if account in ours:
            commands.append(("-i", "delete", "user", user, f"Account={account}", f"Cluster={cluster}"))
    stale = [name for name in ours if name not in wanted]
    order = {"org": 2, "team": 1}
    for name in sorted(stale, key=lambda n: (order.get(n.split("-", 1)[0], 0), n)):
        commands.append(("-i", "delete", "account", name))  # the whole account: with Cluster= only its association goes
    return tuple(commands)
