"""`SettingsDesk`: what an operator changes through the control plane is a commit to the settings branch, authored
by that operator (`llmgw stop|start`, `llmgw node cordon|uncordon|drain`, `llmgw slurm lend|reclaim`, SSH keys),
and what a commit would do is a plan (`preview`).

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
from llmgw.control.effects import CommitSettings, NodeVerb, ServingStopped, SettingsEdit, SshKeys
from llmgw.control.events import settings_edit_requested
from llmgw.control.reports import fleet_for
from llmgw.control.state import ControlState
from llmgw.control.watching import SettingsWatcher
from llmgw.errors import LlmgwError, UsageError
from llmgw.plan.forecasting import ModelForecast, RecordedLoad
from llmgw.plan.types import Plan
from llmgw.settings import set_serving_stopped
from llmgw.settings.node_commits import NodeVerbCommit, commit_node_verb, commit_ssh_key

WRITERS: dict[type, Callable[..., Any]] = {
    ServingStopped: lambda repo, edit, name, email, branch: set_serving_stopped(
        repo, edit.stopped, name, email, branch=branch),
    NodeVerb: lambda repo, edit, name, email, branch: commit_node_verb(
        repo, edit.verb, edit.node, name, email, branch=branch),
    SshKeys: lambda repo, edit, name, email, branch: commit_ssh_key(
        repo, edit.action, edit.email, edit.keys, name, email, branch=branch),
}
"""How each kind of `SettingsEdit` is written (llmgw.settings): (repo path, edit, author name, author email, branch)
-> the writer's result (a commit id, or a `NodeVerbCommit`)."""


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
        from llmgw.plan import make_plan
        from llmgw.plan.forecasting import forecast_change
        from llmgw.settings import load_commit

        if self.watcher.remote:
            await self.watcher.poll()
        target = rev or f"refs/heads/{self.branch}"
        settings = await trio.to_thread.run_sync(load_commit, str(self.watcher.repo_path), target)
        fleet = fleet_for(state.fleet.fleet(), settings)
        plan = make_plan(settings, fleet, canaries=holds_of(state.canaries), replicas=wanted_counts(state.scales))
        if load is None or state.settings is None:
            return plan, ()
        return plan, forecast_change(state.settings, settings, fleet, plan, load)

    async def _commit(self, refusal: str, edit: SettingsEdit, author_name: str, author_email: str) -> Any:
        """Ask the loop to commit `edit` as the author and wait for the handler's answer. A checkpoint.
        Raises: UsageError `refusal` when remote; what the writer raised (SettingsError, UsageError)."""
        if self.watcher.remote:
            raise UsageError(f"the settings live at {self.location}; {refusal}")
        request = secrets.token_hex(8)
        answer = self._waiting[request] = _Answer()
        try:
            self.update(settings_edit_requested(CommitSettings(request, edit, author_name, author_email)),
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
                                  effect.author_name, effect.author_email, self.branch)
        try:
            answer.result = await trio.to_thread.run_sync(write)
        except LlmgwError as exc:
            answer.error = exc
        else:
            await self.watcher.poll()
        finally:
            answer.done.set()

    async def set_stopped(self, stopped: bool, author_name: str, author_email: str) -> str:
        """Commit `serving.stopped: <stopped>` as the operator; returns the commit id.
        Raises: UsageError when the settings repository is remote (commit it there instead)."""
        word = "true" if stopped else "false"
        return await self._commit(f"commit serving.stopped: {word} in llmgw.yaml there and push it.",
                                  ServingStopped(stopped), author_name, author_email)

    async def node_verb(self, verb: str, node: str, author_name: str, author_email: str) -> NodeVerbCommit:
        """Commit `llmgw node cordon|uncordon|drain` or `llmgw slurm lend|reclaim` for `node` as the operator
        (llmgw.settings.node_commits); returns the branch head and whether a commit was made.
        Raises: UsageError when the settings are remote."""
        return await self._commit(f"make the change ({verb} {node}) there and push it.",
                                  NodeVerb(verb, node), author_name, author_email)

    async def ssh_keys(self, action: str, email: str, keys: tuple[str, ...], author_name: str,
                       author_email: str) -> NodeVerbCommit:
        """Commit `llmgw slurm users keys add|remove` (llmgw.settings.node_commits.commit_ssh_key) as the operator.
        Raises: UsageError when the settings are remote; SettingsError when the result does not validate."""
        return await self._commit("change ssh_keys in slurm.yaml there and push it.",
                                  SshKeys(action, email, tuple(keys)), author_name, author_email)
