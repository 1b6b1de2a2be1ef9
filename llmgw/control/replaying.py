"""A past pass's plan made again from its audit commit (`llmgw plan --at`), and a settings commit planned against the
fleet as it was when it was applied (`llmgw diff --at`). Blocking (git reads, planning): call it in a worker thread
or from the command line.

Each audit commit carries the fleet its pass gave the planner and a digest of the plan it made
(`llmgw.plan.recorded`); the settings come from the settings commit the pass planned (`load_commit`). Planning is
pure, so the same llmgw makes the same plan: `Replay.reproduced` says whether the digest matches.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from llmgw.errors import UsageError
from llmgw.plan import (
    FLEET_FILE, PASS_FILE, Plan, PlannedPass, canary_holds, fleet_from_record, pass_from_record, plan_digest, plan_or_refusal,
)
from llmgw.plan.types import Fleet
from llmgw.settings import audit_commit, load_commit, read_audit_chain, read_audit_file


@dataclass(frozen=True)
class Replay:
    """Audit commit `audit` (40 hex) of pass `planned`, its recorded `fleet`, and `plan`: what planning
    `settings_commit` against that fleet gives now. `reproduced`: its digest is the one the pass recorded (for a
    replay of another settings commit than the pass's, whether the plans are the same)."""

    audit: str
    planned: PlannedPass
    fleet: Fleet
    settings_commit: str | None
    plan: Plan

    @property
    def digest(self) -> str:
        return plan_digest(self.plan)

    @property
    def reproduced(self) -> bool:
        return self.digest == self.planned.plan_digest


def _recorded(repo_path: str, audit: str) -> tuple[PlannedPass, Fleet]:
    pass_bytes = read_audit_file(repo_path, PASS_FILE, audit)
    fleet_bytes = read_audit_file(repo_path, FLEET_FILE, audit)
    if pass_bytes is None or fleet_bytes is None:
        raise UsageError(f"audit commit {audit[:12]} records no plan (written by an llmgw before plans were recorded, "
                         "or by a pass that planned nothing: no settings in force, or a catalog that would stop "
                         "every model)")
    where = f"audit commit {audit[:12]}"
    planned = pass_from_record(pass_bytes, fleet_bytes, f"{PASS_FILE} of {where}")
    return planned, fleet_from_record(fleet_bytes, f"{FLEET_FILE} of {where}")


def plan_at(repo_path: str | os.PathLike[str], rev: str) -> Replay:
    """The plan of the pass of audit commit `rev` (full or abbreviated id, `refs/llmgw/audit~2`), made again.

    Raises: SettingsError when `rev` is no audit commit or the settings commit no longer loads; UsageError when
    the commit records no plan.
    """
    path = str(repo_path)
    audit = audit_commit(path, rev)
    planned, fleet = _recorded(path, audit)
    return _replay(path, audit, planned, fleet, planned.settings_commit)


def _replay(path: str, audit: str, planned: PlannedPass, fleet: Fleet, settings_commit: str | None) -> Replay:
    if settings_commit is None:
        raise UsageError(f"audit commit {audit[:12]} planned without settings in force: there is no plan to make")
    settings = load_commit(path, settings_commit)
    holds = canary_holds(planned.canaries, lambda commit, model: load_commit(path, commit).models[model])
    plan, _refused = plan_or_refusal(settings, fleet, planned.allow_empty, holds, planned.replicas)
    return Replay(audit, planned, fleet, settings.commit, plan)


def diff_at(repo_path: str | os.PathLike[str], rev: str) -> Replay:
    """The plan of settings commit `rev` (anything `git rev-parse` takes) against the fleet as it was when it was
    applied: the fleet recorded by the first audit commit whose pass planned `rev` (the pass that began applying
    it). Its `planned` is that pass's.

    Raises: SettingsError when `rev` names no commit or does not load; UsageError when no recorded pass planned it
    (not applied yet, or applied by an llmgw before plans were recorded).
    """
    path = str(repo_path)
    settings = load_commit(path, rev)
    first: str | None = None
    for audit, data in read_audit_chain(path, PASS_FILE):  # newest first: the last match is the first pass
        if data is not None and _planned_commit(data) == settings.commit:
            first = audit
    if first is None:
        raise UsageError(f"no audit commit records a pass that planned settings {str(settings.commit)[:12]} ({rev}): "
                         "it was not applied yet (`llmgw diff --live` plans it against the fleet now)")
    planned, fleet = _recorded(path, first)
    return _replay(path, first, planned, fleet, settings.commit)


def _planned_commit(data: bytes) -> str | None:
    """The settings commit a `plan/pass.json` names (None when it is not readable)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc.get("settings_commit") if isinstance(doc, dict) else None
