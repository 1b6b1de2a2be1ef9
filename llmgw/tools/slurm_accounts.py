"""The `sacctmgr` commands that make Slurm's accounts and user associations what llmgw wants. Pure.

Split from llmgw.plan.slurm_accounts (which says what is wanted, from projects.yaml) so the agent on the Slurm
controller, which reads `sacctmgr show` and runs the commands, computes them from the wanted accounts its SlurmRole
carries. llmgw marks what it makes with a Description starting MARK and only ever changes or deletes accounts so
marked: an account an administrator made is never touched. Format: slurm.schedmd.com/sacctmgr.html.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.tools.slurm import SlurmAccount, SlurmAssociation

MARK = "llmgw:"

Command = tuple[str, ...]


@dataclass(frozen=True)
class WantedAccount:
    """One account llmgw keeps: its `parent` account ("root" at the top), `description` (starting MARK),
    `organisation`, and the logins of its `users`."""

    parent: str
    description: str
    organisation: str
    users: tuple[str, ...] = ()


def account_commands(wanted: Mapping[str, WantedAccount], cluster: str, accounts: Iterable[SlurmAccount],
                     assocs: Iterable[SlurmAssociation]) -> tuple[Command, ...]:
    """The `sacctmgr -i ...` argument lists (without "sacctmgr") that make `cluster`'s accounts and user
    associations match `wanted` (by account name, parents before children), given what `sacctmgr show account` /
    `show assoc` print now.

    Order: accounts added parents first, users added, users removed, stale llmgw accounts deleted children first
    (by depth: a project before its team before its organisation). An account named like one of llmgw's but not
    marked as llmgw's is left alone (and gets no users from llmgw). Returns () when Slurm already matches.
    """
    existing = {a.name: a for a in accounts}
    ours = {name for name, account in existing.items() if account.description.startswith(MARK)}
    users_now = {(a.account, a.user) for a in assocs if a.cluster == cluster and a.user}
    commands: list[Command] = []
    for name, account in wanted.items():
        if name not in existing:
            commands.append(("-i", "add", "account", name, f"Cluster={cluster}", f"Parent={account.parent}",
                             f"Description={account.description}", f"Organization={account.organisation}"))
    usable = {name for name in wanted if name not in existing or name in ours}
    wanted_users = {(name, user) for name in usable for user in wanted[name].users}
    for account, user in sorted(wanted_users - users_now):
        commands.append(("-i", "add", "user", user, f"Account={account}", f"Cluster={cluster}"))
    for account, user in sorted(users_now - wanted_users):
        if account in ours:
            commands.append(("-i", "delete", "user", user, f"Account={account}", f"Cluster={cluster}"))
    parents = {a.account: a.parent for a in assocs if a.cluster == cluster and not a.user}

    def depth(name: str) -> int:
        seen = 0
        while name in parents and parents[name] not in ("", "root") and seen < 32:
            name, seen = parents[name], seen + 1
        return seen

    stale = [name for name in ours if name not in wanted]
    for name in sorted(stale, key=lambda n: (-depth(n), n)):
        commands.append(("-i", "delete", "account", name))  # the whole account: with Cluster= only its association goes
    return tuple(commands)
