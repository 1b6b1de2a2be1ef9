"""The empty-catalog guard: an emptied catalog must never stop a fleet by accident.

A settings version "serves nothing" when no model wants a replica and none routes to endpoints. Going from
settings that serve something to settings that serve nothing is refused unless `allow_empty: true` is set in
llmgw.yaml or the caller passes `allow_empty=True` (`llmgw apply --allow-empty`). Stopping everything on
purpose is `llmgw stop` (`serving.stopped`), which this guard does not touch.
"""

from __future__ import annotations

from llmgw.errors import Issue, SettingsError
from llmgw.identity import ShardState
from llmgw.plan.types import Fleet
from llmgw.settings.model import Settings

_RUNNING = frozenset({ShardState.PENDING, ShardState.FETCHING, ShardState.STARTING, ShardState.READY,
                      ShardState.FAILED})


class EmptiedCatalogError(SettingsError):
    """Settings that would remove every model were refused (set `allow_empty: true` to mean it)."""


def serves_something(settings: Settings) -> bool:
    """True when some catalog model wants at least one replica or routes to endpoints."""
    return any(m.endpoints or m.replicas > 0 or m.scaling is not None for m in settings.models.values())


def check_not_emptied(previous: Settings | None, new: Settings, *, allow_empty: bool = False) -> str | None:
    """Return why `new` must not replace `previous`, or None when it may.

    Refused (a sentence naming the fix is returned) when `previous` serves some model and `new` serves none,
    unless `allow_empty` or `new.cluster.allow_empty`. `previous` None (nothing applied yet) is never refused.
    """
    if allow_empty or new.cluster.allow_empty or previous is None:
        return None
    if not serves_something(previous) or serves_something(new):
        return None
    names = ", ".join(sorted(m.name for m in previous.models.values()
                             if m.endpoints or m.replicas > 0 or m.scaling is not None))
    where = f" (commit {new.commit[:12]})" if new.commit else ""
    return (f"the new settings{where} would remove every model ({names}) and stop the fleet; "
            f"set allow_empty: true in llmgw.yaml or run llmgw apply --allow-empty if that is meant, "
            f"or llmgw stop to stop serving without changing the catalog")


def guard_fleet_not_emptied(settings: Settings, fleet: Fleet, *, allow_empty: bool = False) -> None:
    """Raise `EmptiedCatalogError` when `settings` serve nothing while `fleet` still runs shards of ours.

    Not raised when `allow_empty`, `settings.cluster.allow_empty` or `serving_stopped` is set.
    """
    cluster = settings.cluster
    if allow_empty or cluster.allow_empty or cluster.serving_stopped or serves_something(settings):
        return
    running = sorted(s.shard_id for n in fleet.nodes if n.alive for s in n.shards
                     if not s.adopted_foreign and s.state in _RUNNING)
    if not running:
        return
    shown = ", ".join(running[:5]) + (f" and {len(running) - 5} more" if len(running) > 5 else "")
    where = f" of commit {settings.commit[:12]}" if settings.commit else ""
    raise EmptiedCatalogError([Issue(
        "llmgw.yaml", 0, 0, "allow_empty",
        f"the settings{where} serve no model, which would stop {len(running)} running shards ({shown}); "
        f"set allow_empty: true in llmgw.yaml or run llmgw apply --allow-empty if that is meant, "
        f"or llmgw stop to stop serving without changing the catalog")])
