"""Who may do what on the admin listener and in the console, from projects.yaml: `people.operators` and
`people.viewers` (e-mail addresses) and each project's `members`. Access follows the settings: it is reviewed,
reverted and blamed like any other setting, and an account in the store only proves who someone is.

Roles (`Access.role`), highest first:
- operator: everything (the same as the control plane's own admin token);
- viewer: reads everything, changes nothing;
- member: a project member who is neither, with their `projects` (their keys, usage and quotas).
An e-mail named nowhere has no role (`Access.role` None): it cannot log in. E-mails compare in lower case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPERATOR, VIEWER, MEMBER = "operator", "viewer", "member"
ROLES = (OPERATOR, VIEWER, MEMBER)


@dataclass(frozen=True)
class People:
    """projects.yaml `people`: the e-mails of operators and viewers, in lower case, in file order."""

    operators: tuple[str, ...] = ()
    viewers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Access:
    """What `email` may do under some settings: its `role` (OPERATOR, VIEWER, MEMBER, or None: nothing) and the
    projects it is a member of (by name, sorted; an operator or viewer may be a member too)."""

    email: str
    role: str | None
    projects: tuple[str, ...] = ()

    @property
    def may_change(self) -> bool:
        """Whether this person may change the cluster (commit settings, restart, apply): operators only."""
        return self.role == OPERATOR


def access_of(email: str, people: People, projects: Mapping[str, Any]) -> Access:
    """The `Access` of `email` under `people` and `projects` (name -> `Project`, whose `members` are e-mails)."""
    email = email.strip().lower()
    member_of = tuple(sorted(name for name, project in projects.items()
                             if email in (m.lower() for m in project.members)))
    if email in people.operators:
        role: str | None = OPERATOR
    elif email in people.viewers:
        role = VIEWER
    else:
        role = MEMBER if member_of else None
    return Access(email, role, member_of)


def build_people(data: Mapping[str, Any], found: Any, file: str) -> People:
    """projects.yaml's `people` (validated by the schema already); an e-mail listed twice, or as both operator and
    viewer, is an error naming its line (`found.add`)."""
    seen: dict[str, str] = {}
    lists: dict[str, list[str]] = {"operators": [], "viewers": []}
    for key in ("operators", "viewers"):
        for index, raw in enumerate(data.get(key, ())):
            email = str(raw).strip().lower()
            if email in seen:
                found.add(file, ("people", key, index),
                          f"{raw} is already listed in people.{seen[email]}: a person has one role; keep one entry "
                          "(operators may do everything viewers may)")
                continue
            seen[email] = key
            lists[key].append(email)
    return People(tuple(lists["operators"]), tuple(lists["viewers"]))
