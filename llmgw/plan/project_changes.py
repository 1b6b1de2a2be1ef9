"""What a settings change does to each project: its quotas, the models it may use, and their prices. Pure.

A project is bound by its own quota and by its team's and organisation's, so a change of a team's quota shows
under every project of that team. Prices are per million tokens in the cluster's currency (`Prices`; a model
without them costs nothing per token). `gpu_hour_cost` prices GPU-hours (Slurm jobs', and the replicas' a project
uses, `llmgw usage --gpu-hours`): it applies to every project alike, so its changes are listed once, cluster-wide.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from llmgw.settings.model import Model, Project, Quota, Settings

_QUOTA_KEYS = tuple(f.name for f in fields(Quota))


@dataclass(frozen=True)
class ValueChange:
    """One value that changed: `subject` ("project demo", "team platform", "model gemma-3-270m"), `key`
    ("tokens_per_day", "prompt_per_million"), `old` / `new` as display text ("none" for no limit or no price)."""

    subject: str
    key: str
    old: str
    new: str


@dataclass(frozen=True)
class ProjectChange:
    """The changes that concern one project. `action` "added", "removed" or "changed".

    `quotas`: limits of the project, its team or its organisation that changed. `models_added` /
    `models_removed`: catalog models it may use now and may not before (or the reverse), by name.
    `prices`: price changes of models it may use after the change (before, for a removed project).
    """

    project: str
    action: str
    quotas: tuple[ValueChange, ...] = ()
    models_added: tuple[str, ...] = ()
    models_removed: tuple[str, ...] = ()
    prices: tuple[ValueChange, ...] = ()


def _show(value: float | int | None) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _quota_changes(subject: str, old: Quota | None, new: Quota | None) -> list[ValueChange]:
    old, new = old or Quota(), new or Quota()
    return [ValueChange(subject, key, _show(getattr(old, key)), _show(getattr(new, key)))
            for key in _QUOTA_KEYS if getattr(old, key) != getattr(new, key)]


def _bounds(settings: Settings, project: Project | None) -> list[tuple[str, Quota | None]]:
    """(subject, quota) for the project, its team and its organisation ("team platform", ...)."""
    if project is None:
        return []
    team = settings.teams.get(project.team)
    organisation = settings.organisations.get(project.organisation)
    return [(f"project {project.name}", project.quota), (f"team {project.team}", team.quota if team else None),
            (f"organisation {project.organisation}", organisation.quota if organisation else None)]


def usable_models(settings: Settings, project: Project) -> frozenset[str]:
    """Catalog names `project` may use: its entries resolved through aliases; "*" is every model."""
    if "*" in project.models:
        return frozenset(settings.models)
    names = set()
    for entry in project.models:
        model = settings.resolve_model(entry)
        if model is not None:
            names.add(model.name)
    return frozenset(names)


def _price_changes(name: str, old: Model | None, new: Model | None) -> list[ValueChange]:
    changes = []
    for key in ("prompt_per_million", "completion_per_million"):
        before = getattr(old.prices, key) if old is not None else None
        after = getattr(new.prices, key) if new is not None else None
        if before != after:
            changes.append(ValueChange(f"model {name}", key, _show(before), _show(after)))
    return changes


def project_changes(base: Settings, head: Settings) -> tuple[ProjectChange, ...]:
    """Every project whose quotas, usable models or their prices differ from `base` to `head`, by name.

    A project only in `head` is "added" (its quotas shown against none); only in `base`, "removed".
    Projects with nothing changed are left out.
    """
    result = []
    for name in sorted(set(base.projects) | set(head.projects)):
        old, new = base.projects.get(name), head.projects.get(name)
        action = "added" if old is None else "removed" if new is None else "changed"
        old_bounds, new_bounds = dict(_bounds(base, old)), dict(_bounds(head, new))
        quotas: list[ValueChange] = []
        subjects = list(new_bounds) + [s for s in old_bounds if s not in new_bounds]
        for subject in subjects:
            quotas += _quota_changes(subject, old_bounds.get(subject), new_bounds.get(subject))
        before = usable_models(base, old) if old is not None else frozenset()
        after = usable_models(head, new) if new is not None else frozenset()
        prices: list[ValueChange] = []
        for model in sorted(after if new is not None else before):
            prices += _price_changes(model, base.models.get(model), head.models.get(model))
        if action == "changed" and not (quotas or before != after or prices):
            continue
        result.append(ProjectChange(name, action, tuple(quotas), tuple(sorted(after - before)),
                                    tuple(sorted(before - after)), tuple(prices)))
    return tuple(result)


def gpu_hour_cost_changes(base: Settings, head: Settings) -> tuple[ValueChange, ...]:
    """Changes of `gpu_hour_cost` per GPU class ("default" included) and of the currency, cluster-wide."""
    old, new = base.cluster.gpu_hour_cost, head.cluster.gpu_hour_cost
    changes = [ValueChange("gpu_hour_cost", cls, _show(old.get(cls)), _show(new.get(cls)))
               for cls in sorted(set(old) | set(new)) if old.get(cls) != new.get(cls)]
    if base.cluster.currency != head.cluster.currency:
        changes.append(ValueChange("cluster", "currency", base.cluster.currency, head.cluster.currency))
    return tuple(changes)
