"""`SettingsDesk`: what an operator changes through the control plane is a commit to the settings branch, authored
by that operator (`llmgw stop|start`, `llmgw node cordon|uncordon|drain`, `llmgw slurm lend|reclaim`, SSH keys),
and what a commit would do is a plan (`preview`). Each commit wakes the watcher, whose news reaches the control
loop as any push's does. A remote settings repository takes no commit from here: the operator pushes there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import trio

from llmgw.control.registry import FleetRegistry
from llmgw.control.reports import fleet_for
from llmgw.control.watching import SettingsWatcher
from llmgw.errors import UsageError
from llmgw.plan.types import Plan
from llmgw.settings.node_commits import NodeVerbCommit, commit_node_verb, commit_ssh_key


class SettingsDesk:
    """Commits to branch `branch` of the repository `watcher` reads (named `location` to people)."""

    def __init__(self, watcher: SettingsWatcher, location: str, branch: str):
        self.watcher, self.location, self.branch = watcher, location, branch

    async def preview(self, rev: str | None, fleet: FleetRegistry) -> Plan:
        """The plan `rev` (None: the branch head) would run against `fleet`. Raises SettingsError."""
        from llmgw.plan import make_plan
        from llmgw.settings import load_commit

        if self.watcher.remote:
            await self.watcher.poll()
        target = rev or f"refs/heads/{self.branch}"
        settings = await trio.to_thread.run_sync(load_commit, str(self.watcher.repo_path), target)
        return make_plan(settings, fleet_for(fleet.fleet(), settings))

    async def _commit(self, refusal: str, write: Callable[..., Any], *args: Any) -> Any:
        """Run `write(repo path, *args, branch=)` in a thread, then poll. Raises UsageError `refusal` when remote."""
        if self.watcher.remote:
            raise UsageError(f"the settings live at {self.location}; {refusal}")
        commit = await trio.to_thread.run_sync(
            functools.partial(write, str(self.watcher.repo_path), *args, branch=self.branch))
        await self.watcher.poll()
        return commit

    async def set_stopped(self, stopped: bool, author_name: str, author_email: str) -> str:
        """Commit `serving.stopped: <stopped>` as the operator; returns the commit id.
        Raises: UsageError when the settings repository is remote (commit it there instead)."""
        from llmgw.settings import set_serving_stopped

        word = "true" if stopped else "false"
        return await self._commit(f"commit serving.stopped: {word} in llmgw.yaml there and push it.",
                                  set_serving_stopped, stopped, author_name, author_email)

    async def node_verb(self, verb: str, node: str, author_name: str, author_email: str) -> NodeVerbCommit:
        """Commit `llmgw node cordon|uncordon|drain` or `llmgw slurm lend|reclaim` for `node` as the operator
        (llmgw.settings.node_commits); returns the branch head and whether a commit was made.
        Raises: UsageError when the settings are remote."""
        return await self._commit(f"make the change ({verb} {node}) there and push it.",
                                  commit_node_verb, verb, node, author_name, author_email)

    async def ssh_keys(self, action: str, email: str, keys: tuple[str, ...], author_name: str,
                       author_email: str) -> NodeVerbCommit:
        """Commit `llmgw slurm users keys add|remove` (llmgw.settings.node_commits.commit_ssh_key) as the operator.
        Raises: UsageError when the settings are remote; SettingsError when the result does not validate."""
        return await self._commit("change ssh_keys in slurm.yaml there and push it.",
                                  commit_ssh_key, action, email, keys, author_name, author_email)
