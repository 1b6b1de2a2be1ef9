"""`llmgw plan --at AUDIT_COMMIT` and `llmgw diff --at REV`: plans of the past, made again from the settings
repository alone (no control plane needed), from the fleet each audit commit recorded (`llmgw.control.replaying`).

Both print the plan as `llmgw plan` does (--json: {"audit_commit", "pass", "settings_commit", "fleet",
"plan_digest", "recorded_digest", "reproduced", "changes", "lines", "plan"}). Exit 0: the plan changes nothing,
2: it changes something, 1: an error, or (`plan --at`) a plan that is not the one the pass recorded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from llmgw.errors import UsageError


def settings_repository(repo: str | None, state_dir: Path | None) -> str:
    """The settings repository to read: `repo`, else `<state>/settings.git` when it exists (as `llmgw up` keeps
    it; state: `state_dir`, $LLMGW_STATE, .state), else the one around the current directory (the control plane's
    own repository: a clone does not fetch refs/llmgw/audit unless told to).

    Raises: UsageError when none is found."""
    from llmgw.settings import discover_repository

    if repo is not None:
        found = discover_repository(repo)
        if found is None:
            raise UsageError(f"{repo} is not a git repository; give the settings repository with --repo")
        return found
    state = state_dir or Path(os.environ.get("LLMGW_STATE") or ".state")
    if (state / "settings.git").is_dir():
        return str(state / "settings.git")
    found = discover_repository(os.getcwd())
    if found is not None:
        return found
    raise UsageError(f"{os.getcwd()} is in no git repository and {state}/settings.git does not exist; give the "
                     "settings repository (the one whose refs/llmgw/audit the control plane writes) with --repo")


def _print(replay, heading: str, as_json: bool, *, must_match: bool) -> int:
    from llmgw.plan import plan_to_json, render_plan

    plan = replay.plan
    changes = plan.changes or bool(plan.unplaced)
    lines = render_plan(plan, include_keep=False)
    if as_json:
        click.echo(json.dumps({
            "audit_commit": replay.audit, "pass": replay.planned.number, "settings_commit": replay.settings_commit,
            "fleet": replay.planned.fleet_digest, "plan_digest": replay.digest,
            "recorded_digest": replay.planned.plan_digest, "reproduced": replay.reproduced, "changes": changes,
            "lines": lines, "plan": plan_to_json(plan)}, indent=2))
    else:
        click.echo(heading)
        if not changes:
            click.echo("no changes: the fleet already ran these settings")
        for line in lines:
            click.echo(line)
    if must_match and not replay.reproduced:
        click.echo(f"error: this is not the plan pass {replay.planned.number} made (recorded "
                   f"{replay.planned.plan_digest[:19]}, made now {replay.digest[:19]}): the planner changed since "
                   "(another llmgw version), or the settings commit was rewritten", err=True)
        return 1
    return 2 if changes else 0


def plan_at_command(rev: str, repo: str | None, state_dir: Path | None, as_json: bool) -> int:
    """`llmgw plan --at REV`: print the plan of audit commit REV's pass, made again; the exit status."""
    from llmgw.control.replaying import plan_at

    replay = plan_at(settings_repository(repo, state_dir), rev)
    fleet = replay.fleet
    heading = (f"pass {replay.planned.number} (audit commit {replay.audit[:12]}) for settings "
               f"{(replay.settings_commit or 'none')[:12]}, against its fleet of {len(fleet.nodes)} node"
               f"{'' if len(fleet.nodes) == 1 else 's'} ({replay.planned.fleet_digest[:19]})"
               + (": reproduced, the plan it made" if replay.reproduced else ""))
    return _print(replay, heading, as_json, must_match=True)


def diff_at_command(rev: str, repo: str | None, state_dir: Path | None, as_json: bool) -> int:
    """`llmgw diff --at REV`: print the plan of settings REV against the fleet when it was applied; the status."""
    from llmgw.control.replaying import diff_at

    replay = diff_at(settings_repository(repo, state_dir), rev)
    heading = (f"settings {(replay.settings_commit or '')[:12]} against the fleet when it was applied: pass "
               f"{replay.planned.number} (audit commit {replay.audit[:12]}), {len(replay.fleet.nodes)} node"
               f"{'' if len(replay.fleet.nodes) == 1 else 's'}")
    return _print(replay, heading, as_json, must_match=False)
