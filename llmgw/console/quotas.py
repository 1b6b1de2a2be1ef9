"""The console's Quotas page as data: each project's limits (projects.yaml, as `Settings.quota_scopes` chains them:
the project's own, its team's, its organisation's) beside what counts against each now, read from the store as the
gateway's quota check reads it (`llmgw.store.Store.quota_use`, rows shaped like `llmgw.store.LimitUse`). Pure.

A team's or an organisation's limit is shared by all of its projects: its row names the others that count against
it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

LIMIT_WORDS = {
    "requests_per_minute": "requests per minute",
    "tokens_per_minute": "tokens per minute",
    "tokens_per_day": "tokens per UTC day",
    "concurrent_requests": "requests in flight",
    "budget": "cost per UTC month",
}
"""What each limit of projects.yaml `quota` counts, in words (the keys of `llmgw.store.quotas.LIMITS`)."""

SCOPE_WORDS = {"project": "project", "team": "team", "org": "organisation"}


@dataclass(frozen=True)
class LimitRow:
    """One limit of one scope: `scope` ("team research"), `key` (the store's "team:research"), `limit_name`
    (projects.yaml's key), `words` (what it counts), `limit`, `used`, `remaining`, `ratio` (used / limit, 0 to
    1), `money` (a budget, in the cluster's currency), `frees_in` (seconds until what counts now is gone; None for
    requests in flight, which go when they end) and `shared_with` (the other projects counting against it)."""

    scope: str
    key: str
    limit_name: str
    words: str
    limit: float
    used: float
    remaining: float
    ratio: float
    money: bool
    frees_in: float | None
    shared_with: tuple[str, ...]


@dataclass(frozen=True)
class ProjectQuotas:
    """A project's section of the page: its `team`, `organisation` and `rows` (narrowest scope first; () when no
    scope of it has a limit)."""

    project: str
    team: str
    organisation: str
    rows: tuple[LimitRow, ...]


def scopes_of(settings: Any, projects: Iterable[str]) -> list[tuple[str, Any]]:
    """The quota scopes (key, limits) of `projects` under `settings` (`Settings.quota_scopes`), each once, in first
    appearance order: what the page asks the store about."""
    seen: dict[str, Any] = {}
    for project in projects:
        for key, quota in settings.quota_scopes(project):
            seen.setdefault(key, quota)
    return list(seen.items())


def project_quotas(settings: Any, projects: Sequence[str], uses: Iterable[Any]) -> list[ProjectQuotas]:
    """The page's sections, one per project of `projects` (in that order) that `settings` has, from `uses` (the
    store's `LimitUse` rows of `scopes_of(settings, projects)`)."""
    by_scope: dict[str, list[Any]] = {}
    for use in uses:
        by_scope.setdefault(use.scope, []).append(use)
    sections = []
    for name in projects:
        project = settings.projects.get(name)
        if project is None:
            continue
        rows = []
        for key, _quota in settings.quota_scopes(name):
            kind, _, subject = key.partition(":")
            members = sorted(other for other, p in settings.projects.items()
                             if (kind == "team" and p.team == subject) or (kind == "org" and p.organisation == subject))
            for use in by_scope.get(key, ()):
                limit, used = float(use.limit), float(use.used)
                rows.append(LimitRow(
                    scope=f"{SCOPE_WORDS.get(kind, kind)} {subject}", key=key, limit_name=use.limit_name,
                    words=LIMIT_WORDS.get(use.limit_name, use.limit_name), limit=limit, used=used,
                    remaining=max(0.0, limit - used), ratio=min(1.0, used / limit) if limit > 0 else 1.0,
                    money=use.limit_name == "budget",
                    frees_in=None if use.limit_name == "concurrent_requests" else float(use.reset_seconds),
                    shared_with=tuple(other for other in members if other != name)))
        sections.append(ProjectQuotas(name, project.team, project.organisation, tuple(rows)))
    return sections
