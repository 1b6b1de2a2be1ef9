"""`SettingsDesk`: what an operator changes through the control plane is a commit to the settings branch, authored
by that operator (`llmgw stop|start`, `llmgw node cordon|uncordon|drain`, `llmgw slurm lend|reclaim`, SSH keys, a
model's replicas and adapters: the admin API's routes, which the CLI and the console call), and what a commit would
do is a plan (`preview`) and, before it is made, a diff (`edit(..., preview=True)`).

A request becomes an event on the control loop's channel (`settings_edit_requested`) whose effect, `CommitSettings`,
the desk's own handler (`commit`, lane "settings": one commit after the other) writes to the branch; the watcher
then polls, so its news of the new head reaches the loop as any push's does, and the requester gets the commit (or
the error) by the request's id. A remote settings repository takes no commit from here: the operator pushes there.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any

import trio

from llmgw.control.autoscaling import wanted_counts
from llmgw.control.canaries import holds_of
from llmgw.control.effects import (
    CommitSettings, ModelAdapter, ModelReplicas, ModelServe, NodeVerb, ServingStopped, SettingsEdit, SshKeys,
)
from llmgw.control.events import settings_edit_requested
from llmgw.control.reports import fleet_for
from llmgw.control.state import ControlState
from llmgw.control.watching import SettingsWatcher
from llmgw.errors import LlmgwError, UsageError
from llmgw.plan.cpu_speed import ExpectedSpeed, expected_cpu_speeds
from llmgw.plan.forecasting import ModelForecast, RecordedLoad
from llmgw.plan.types import Plan
from llmgw.settings import EditCommit
from llmgw.settings.model_commits import commit_model_adapter, commit_model_replicas, commit_new_model
from llmgw.settings.node_commits import commit_node_verb, commit_serving_stopped, commit_ssh_key

WRITERS: dict[type, Callable[..., EditCommit]] = {
    ServingStopped: lambda repo, edit, name, email, branch, **options: commit_serving_stopped(
        repo, edit.stopped, name, email, branch, **options),
    NodeVerb: lambda repo, edit, name, email, branch, **options: commit_node_verb(
        repo, edit.verb, edit.node, name, email, branch, **options),
    SshKeys: lambda repo, edit, name, email, branch, **options: commit_ssh_key(
        repo, edit.action, edit.email, edit.keys, name, email, branch, **options),
    ModelReplicas: lambda repo, edit, name, email, branch, **options: commit_model_replicas(
        repo, edit.model, name, email, branch, count=edit.count, low=edit.low, high=edit.high, **options),
    ModelAdapter: lambda repo, edit, name, email, branch, **options: commit_model_adapter(
        repo, edit.model, edit.action, edit.name, edit.weights, name, email, branch, **options),
    ModelServe: lambda repo, edit, name, email, branch, **options: commit_new_model(
        repo, edit.model, edit.serving, name, email, branch, **options),
}
"""How each kind of `SettingsEdit` is written (llmgw.settings, each through `commit_edit`): (repo path, edit, author
name, author email, branch, expect=..., preview=...) -> the `EditCommit`."""


class _Answer:
    """The outcome of one request: set once, with the writer's result or the LlmgwError it raised."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: LlmgwError | None = None


class SettingsDesk:
    """Commits to branch `branch` of the repository `watcher` reads (named `location` to people). `update`: the
    control loop's `update`, where requests go; `commit` is the handler of their `CommitSettings` effects."""

    def __init__(self, watcher: SettingsWatcher, location: str, branch: str, update: Callable[..., None]):
        self.watcher, self.location, self.branch, self.update = watcher, location, branch, update
        self._waiting: dict[str, _Answer] = {}

    async def preview(self, rev: str | None, state: ControlState, load: RecordedLoad | None = None
                      ) -> tuple[Plan, tuple[ModelForecast, ...]]:
        """The plan `rev` (None: the branch head) would run against the control plane's `state` as a pass plans:
        its fleet, the replica counts its autoscaler wants and the canaries it holds (without them `llmgw plan`
        showed an autoscaled replica stopped that `llmgw apply` kept); and, given the fleet's recent `load`, the
        forecast of each model it changes against the settings in force (`llmgw.plan.forecasting`; () without
        `load` or settings in force). Raises SettingsError."""
        plan, forecasts, _ = await self.preview_with_estimates(rev, state, load)
        return plan, forecasts

    async def preview_with_estimates(self, rev: str | None, state: ControlState, load: RecordedLoad | None = None
                                     ) -> tuple[Plan, tuple[ModelForecast, ...], tuple[ExpectedSpeed, ...]]:
        """`preview`'s plan and forecasts, and the decode speed expected of each replica it places on a probed CPU
        node (`llmgw.plan.cpu_speed.expected_cpu_speeds`). Raises SettingsError."""
        from llmgw.plan import make_plan
        from llmgw.plan.forecasting import forecast_change
        from llmgw.settings import load_commit

        if self.watcher.remote:
            await self.watcher.poll()
        target = rev or f"refs/heads/{self.branch}"
        settings = await trio.to_thread.run_sync(load_commit, str(self.watcher.repo_path), target)
        fleet = fleet_for(state.fleet.fleet(), settings)
        plan = make_plan(settings, fleet, canaries=holds_of(state.canaries), replicas=wanted_counts(state.scales))
        speeds = expected_cpu_speeds(settings, fleet, plan)
        if load is None or state.settings is None:
            return plan, (), speeds
        return plan, forecast_change(state.settings, settings, fleet, plan, load), speeds

    async def edit(self, edit: SettingsEdit, author_name: str, author_email: str, *, expect: str = "",
                   preview: bool = False) -> EditCommit:
        """Commit `edit` as the author (`expect`: only onto that head, see `commit_edit`), or with `preview` say what
        it would change (the diff, written by the same writer in a worker thread; nothing committed). A checkpoint.
        Raises: UsageError when the settings repository is remote (the person commits there instead) or the head is
        not `expect`; SettingsError (`llmgw validate`'s words) when the result would not validate."""
        if self.watcher.remote:
            raise UsageError(f"the settings live at {self.location}; {_remote_advice(edit)}")
        if preview:
            return await trio.to_thread.run_sync(functools.partial(
                WRITERS[type(edit)], str(self.watcher.repo_path), edit, author_name, author_email, self.branch,
                preview=True))
        request = secrets.token_hex(8)
        answer = self._waiting[request] = _Answer()
        try:
            self.update(settings_edit_requested(CommitSettings(request, edit, author_name, author_email, expect)),
                        f"settings edit by {author_email}")
            await answer.done.wait()
        finally:
            del self._waiting[request]
        if answer.error is not None:
            raise answer.error
        return answer.result

    async def commit(self, effect: CommitSettings) -> None:
        """The handler of `CommitSettings`: write the edit (in a worker thread), let the watcher read the new head
        (its news is the outcome's transition), and answer the request waiting on `effect.request` (if any still
        waits). Raises nothing: a writer's LlmgwError is the requester's answer."""
        answer = self._waiting.get(effect.request) or _Answer()
        write = functools.partial(WRITERS[type(effect.edit)], str(self.watcher.repo_path), effect.edit,
                                  effect.author_name, effect.author_email, self.branch, expect=effect.expect)
        try:
            answer.result = await trio.to_thread.run_sync(write)
        except LlmgwError as exc:
            answer.error = exc
        else:
            await self.watcher.poll()
        finally:
            answer.done.set()


def _remote_advice(edit: SettingsEdit) -> str:
    """What to do instead of `edit` when the settings repository is remote: a sentence's end."""
    if isinstance(edit, ServingStopped):
        return f"commit serving.stopped: {'true' if edit.stopped else 'false'} in llmgw.yaml there and push it."
    if isinstance(edit, NodeVerb):
        return f"make the change ({edit.verb} {edit.node}) there and push it."
    if isinstance(edit, SshKeys):
        return "change ssh_keys in slurm.yaml there and push it."
    return f"change model {edit.model}'s catalog file there and push it."
