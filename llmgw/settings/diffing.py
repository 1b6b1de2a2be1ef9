"""The semantic difference between two Settings: what changed per model, node, project, engine, ... .

Because Settings are normalised (bytes, seconds, defaults filled in), `16Gi` vs `16384Mi`, `0.90` vs `0.9`
and a value written at its default vs its absence are equal and never show. A node's changes leave out what it
inherits from agents/default.yaml both before and after (that change shows once, under the defaults).
Secret-bearing values (keys named `secret`, `*_secret`, `token`, `password`, `api_key`, and the store URL)
are never shown: their change appears as `<redacted, changed>`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmgw.identity import engine_key
from llmgw.settings.model import ClusterSettings, Settings
from llmgw.units import format_duration, format_size

REDACTED_CHANGED = "<redacted, changed>"
REDACTED = "<redacted>"
_SECRET_KEY = re.compile(r"(^|_)(secret|token|password|api_key)$")
_SECRET_PATHS = {"store.url"}
_DURATIONS = {"poll_interval", "reconcile_interval", "node_lost_after", "action_timeout", "forecast_check_after",
              "heartbeat_interval", "telemetry_interval", "shard_stop_grace", "job_time_limit"}


@dataclass(frozen=True)
class FieldChange:
    """One changed value: dotted `path` ("resources.memory_bytes"), `old` and `new` as display text (None: absent)."""

    path: str
    old: str | None
    new: str | None


@dataclass(frozen=True)
class Change:
    """What changed about one subject.

    `section` is one of "cluster", "engine", "model", "agents", "node", "organisation", "team", "project",
    "firewall", "slurm", "people"; `name` the subject's name (model name, node id, "llama.cpp@b11434", ...);
    `action` "added", "removed" or "changed"; `fields` the values that differ (for added/removed: its values).
    """

    section: str
    name: str
    action: str
    fields: tuple[FieldChange, ...] = ()


@dataclass(frozen=True)
class SettingsDiff:
    """Every change from one Settings to another, in a stable order (section, then name). Empty: no change."""

    changes: tuple[Change, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changes)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: {"changed": bool, "changes": [{section, name, action, fields: [{path, old, new}]}]}."""
        return {"changed": bool(self.changes),
                "changes": [{**{k: getattr(c, k) for k in ("section", "name", "action")},
                             "fields": [dataclasses.asdict(f) for f in c.fields]} for c in self.changes]}

    def to_text(self) -> str:
        """Plain text, one subject per line (`+` added, `-` removed, `~` changed), its fields indented below."""
        lines = []
        for change in self.changes:
            mark = {"added": "+", "removed": "-", "changed": "~"}[change.action]
            lines.append(f"{mark} {change.section} {change.name}")
            for f in change.fields:
                if f.old == f.new == REDACTED_CHANGED:
                    lines.append(f"    {f.path}: {REDACTED_CHANGED}")
                elif change.action == "changed":
                    lines.append(f"    {f.path}: {_show(f.old)} -> {_show(f.new)}")
                else:
                    lines.append(f"    {f.path}: {_show(f.new if change.action == 'added' else f.old)}")
        return "\n".join(lines) + ("\n" if lines else "")


def _show(value: str | None) -> str:
    return "(absent)" if value is None else value


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten dataclasses and mappings into {"a.b": leaf}; tuples of dataclasses by index, other tuples whole."""
    out: dict[str, Any] = {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value) if f.compare]
    elif isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, tuple) and value and any(dataclasses.is_dataclass(v) or isinstance(v, Mapping) for v in value):
        items = [(f"[{i}]", v) for i, v in enumerate(value)]
    else:
        return {prefix: value}
    for key, item in items:
        path = f"{prefix}{key}" if key.startswith("[") or not prefix else f"{prefix}.{key}"
        out.update(_flatten(item, path))
    if not items and prefix:
        out[prefix] = value
    return out


def _is_secret(path: str) -> bool:
    last = path.rsplit(".", 1)[-1].split("[", 1)[0]
    return path in _SECRET_PATHS or bool(_SECRET_KEY.search(last))


def _display(path: str, value: Any) -> str | None:
    if value is None:
        return None
    if _is_secret(path):
        return REDACTED
    if path.endswith("_bytes") and isinstance(value, int):
        return format_size(value)
    if path.rsplit(".", 1)[-1] in _DURATIONS and isinstance(value, (int, float)):
        return format_duration(value)
    if isinstance(value, Mapping):
        value = dict(value)
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value, default=str)


def _field_changes(old: Any, new: Any, skip: set[str] = frozenset()) -> tuple[FieldChange, ...]:
    a, b = _flatten(old) if old is not None else {}, _flatten(new) if new is not None else {}
    changes = []
    for path in sorted(set(a) | set(b)):
        if path in skip:
            continue
        va, vb = a.get(path), b.get(path)
        if va == vb:
            continue
        if _is_secret(path) and va is not None and vb is not None:
            changes.append(FieldChange(path, REDACTED_CHANGED, REDACTED_CHANGED))
        else:
            changes.append(FieldChange(path, _display(path, va), _display(path, vb)))
    return tuple(changes)


def _section(section: str, old: Mapping[Any, Any], new: Mapping[Any, Any], name=str) -> list[Change]:
    changes = []
    for key in sorted(set(old) | set(new), key=lambda k: name(k)):
        if key not in new:
            changes.append(Change(section, name(key), "removed", _field_changes(None, old[key])))
        elif key not in old:
            changes.append(Change(section, name(key), "added", _field_changes(None, new[key])))
        else:
            fields = _field_changes(old[key], new[key])
            if fields:
                changes.append(Change(section, name(key), "changed", fields))
    return changes


def diff_settings(a: Settings, b: Settings) -> SettingsDiff:
    """The semantic difference from settings `a` (before) to `b` (after). Pure; never shows a secret value."""
    changes: list[Change] = []
    cluster = _field_changes(a.cluster, b.cluster)
    if cluster:
        changes.append(Change("cluster", a.cluster.name if a.cluster.name == b.cluster.name else b.cluster.name,
                              "changed", cluster))
    changes += _section("engine", a.engines, b.engines, name=lambda k: engine_key(*k))
    changes += _section("model", a.models, b.models)
    defaults = _field_changes(a.agent_defaults, b.agent_defaults)
    if defaults:
        changes.append(Change("agents", "default", "changed", defaults))
    for node in sorted(set(a.node_agents) | set(b.node_agents)):
        old, new = a.node_agents.get(node), b.node_agents.get(node)
        if old is None or new is None:
            base = b.agent_defaults if old is None else a.agent_defaults
            own = _field_changes(base, new if old is None else old)
            kept = tuple(FieldChange(f.path, None, f.new) if old is None else FieldChange(f.path, f.new, None) for f in own)
            changes.append(Change("node", node, "added" if old is None else "removed", kept))
            continue
        fa, fb = _flatten(old), _flatten(new)
        da, db = _flatten(a.agent_defaults), _flatten(b.agent_defaults)
        inherited = {p for p in fa if fa.get(p) == da.get(p) and fb.get(p) == db.get(p)}
        fields = _field_changes(old, new, skip=inherited)
        if fields:
            changes.append(Change("node", node, "changed", fields))
    changes += _section("organisation", a.organisations, b.organisations)
    changes += _section("team", a.teams, b.teams)
    changes += _section("project", a.projects, b.projects)
    for section in ("firewall", "slurm", "people"):
        fields = _field_changes(getattr(a, section), getattr(b, section))
        if fields:
            changes.append(Change(section, section, "changed", fields))
    return SettingsDiff(tuple(changes))


RESTART_ONLY: Mapping[str, str] = {
    "gateway": "listeners.gateway", "admin": "listeners.admin", "agents": "listeners.agents", "store": "store",
    "tracing": "tracing", "trace_requests": "tracing.sample_requests",
}
"""`ClusterSettings` fields the control plane reads only when it starts (`ControlPlane.run`: the listeners and the
gateway's worker processes, the store, the control plane's tracing) -> their key in llmgw.yaml. A change to one
takes effect at the control plane's next start (`llmgw restart`), not when the commit is applied."""
APPLIED_AT_ONCE = frozenset({"store.responses_retention", "store.files_retention"})
"""Keys under a RESTART_ONLY field that take effect when the commit is applied (through the routing table)."""


def restart_only_changes(before: ClusterSettings, after: ClusterSettings) -> tuple[FieldChange, ...]:
    """The values of RESTART_ONLY keys that differ from `before` to `after`, each `path` spelt as in llmgw.yaml
    ("listeners.gateway.workers", "store.url" with its value redacted), sorted by path. Empty: none. Pure."""
    changes = []
    for change in _field_changes(before, after):
        field, _, rest = change.path.partition(".")
        if field in RESTART_ONLY and change.path not in APPLIED_AT_ONCE:
            path = RESTART_ONLY[field] + (f".{rest}" if rest else "")
            changes.append(FieldChange(path, change.old, change.new))
    return tuple(sorted(changes, key=lambda c: c.path))
