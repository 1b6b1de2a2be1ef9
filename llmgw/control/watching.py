"""The settings watcher: which settings commit is in force, and why a newer one is not.

The settings repository is a local path (read in place) or a URL (https, ssh, file: fetched with pygit2 into a
bare mirror under the state directory). Each poll fetches (URL only), reads the branch head, and, when it moved,
loads and validates that commit (`llmgw.settings.load_commit`). A commit whose tree the repository's pre-receive
hook recorded as valid under this llmgw (llmgw.settings.valid_trees) is not schema-checked a second time; every
other commit is validated in full: one written by a forge or by anything else without the hook, one fetched into
the mirror (the mirror has no record), one recorded by another llmgw version. A commit that does not validate is
never put in force: the last good one stays, and `WatchState.bad` names the commit and every issue (file, line,
reason).
A remote that cannot be reached keeps the last good commit; `WatchState.remote_error` says so.

Guard: a commit that removes every model while models are in force is held back (`WatchState.held`) unless its
`llmgw.yaml` sets `allow_empty: true` or the poll is made with `allow_empty=True` (`llmgw apply --allow-empty`).

At start, when the branch head does not validate, the commit `refs/llmgw/applied` points at (the last one the
fleet converged to) is put in force instead, so a restart never leaves the fleet without settings. When the head
validates and is not that commit, the applied commit's settings are kept beside it (`WatchState.applied`), so a
canary rollout under way when the control plane stopped starts again rather than rolling out unjudged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import trio

from llmgw.control.state import RejectedCommit, WatchState
from llmgw.errors import Issue, SettingsError
from llmgw.plan import check_not_emptied
from llmgw.settings import (
    APPLIED_REF, SchemaCheck, branch_head, fetch_mirror, load_commit, redact_url, ref_commit, validate_data,
)
from llmgw.settings.model import Settings

def is_url(location: str) -> bool:
    """True for "https://...", "ssh://...", "file://..." and scp-like "user@host:path"; False for a local path."""
    if "://" in location:
        return True
    head, sep, _ = location.partition(":")
    return bool(sep) and "@" in head and "/" not in head


class SettingsWatcher:
    """Keeps `state` up to date with the settings branch.

    `location` is a local repository path or a URL; `mirror` where a URL is fetched to. `publish(state)` is
    called (synchronously) with the new `WatchState` after it is set, whenever the settings in force change, a
    new head is rejected (bad or held) or the remote's reachability changes; it never reads the watcher back.
    `check_schema` is the schema check of a commit the pre-receive hook has not recorded as valid (default
    `llmgw.settings.validate_data`; a test passes one that counts its calls). `ssh_key`: the private key file an ssh
    URL is fetched with (`llmgw.settings.fetch_mirror`).
    """

    def __init__(self, location: str, branch: str, mirror: Path,
                 publish: Callable[[WatchState], None] = lambda state: None, *,
                 check_schema: SchemaCheck = validate_data, ssh_key: Path | None = None):
        self.location = location
        self.ssh_key = ssh_key
        self.branch = branch
        self.remote = is_url(location)
        self.repo_path = mirror if self.remote else Path(location)
        self.publish = publish
        self._load = partial(load_commit, trust_hook_record=True, check_schema=check_schema)
        self.state = WatchState()
        self._wake = trio.Event()
        self._lock = trio.Lock()

    def wake(self) -> None:
        """Make the watcher poll now (a hook or forge said the branch moved)."""
        self._wake.set()

    async def poll(self, *, force: bool = False, allow_empty: bool = False) -> WatchState:
        """Fetch (remote only), read the head and load it when it moved (or `force`). Returns the new state.

        Never raises for bad settings or an unreachable remote: both are recorded in the state. A checkpoint.
        """
        before = self.state
        state = await self._poll(force, allow_empty)
        if (state.settings is not before.settings or
                (state.bad, state.held, state.remote_error) != (before.bad, before.held, before.remote_error)):
            self.publish(state)
        return state

    async def _poll(self, force: bool, allow_empty: bool) -> WatchState:
        async with self._lock:
            state = self.state
            remote_error = None
            if self.remote:
                try:
                    await trio.to_thread.run_sync(partial(fetch_mirror, self.location, self.repo_path, self.branch,
                                                           ssh_key=self.ssh_key))
                except OSError as exc:
                    kept = state.settings.commit[:12] if state.settings and state.settings.commit else "none"
                    remote_error = f"{redact_url(str(exc))}; keeping the last good settings commit ({kept})"
            state = replace(state, remote_error=remote_error, last_poll=time.time())
            if not (self.repo_path / "HEAD").exists() and not (self.repo_path / ".git").exists():
                self.state = state
                return state
            head = await trio.to_thread.run_sync(branch_head, self.repo_path, self.branch)
            if head is None or (head == state.head and not force):
                self.state = state
                return state
            state = replace(state, head=head)
            try:
                settings = await trio.to_thread.run_sync(self._load, str(self.repo_path), head)
            except SettingsError as exc:
                state = replace(state, bad=RejectedCommit(head, exc.issues, time.time()), held=None)
                if state.settings is None:
                    state = await self._fall_back_to_applied(state)
                self.state = state
                return state
            current = state.settings
            refusal = check_not_emptied(current, settings, allow_empty=allow_empty)
            if refusal is not None:
                issue = Issue("catalog/", 0, 0, "", refusal)
                self.state = replace(state, held=RejectedCommit(head, (issue,), time.time()), bad=None)
                return self.state
            changed = current is None or current.commit != settings.commit or current != settings
            if current is None:
                state = replace(state, applied=await self._applied_other_than(head))
            self.state = replace(state, settings=settings if changed else current, bad=None, held=None)
        return self.state

    async def _applied_other_than(self, head: str) -> Settings | None:
        """The settings of refs/llmgw/applied when it names a commit other than `head` that loads; else None."""
        applied = await trio.to_thread.run_sync(ref_commit, self.repo_path, APPLIED_REF)
        if applied is None or applied == head:
            return None
        try:
            return await trio.to_thread.run_sync(self._load, str(self.repo_path), applied)
        except SettingsError:
            return None

    async def _fall_back_to_applied(self, state: WatchState) -> WatchState:
        applied = await trio.to_thread.run_sync(ref_commit, self.repo_path, APPLIED_REF)
        if applied is None:
            return state
        try:
            settings = await trio.to_thread.run_sync(self._load, str(self.repo_path), applied)
        except SettingsError:
            return state
        return replace(state, settings=settings)

    async def run(self, interval: Callable[[], float], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Poll every `interval()` seconds and whenever `wake()` is called, forever. Starts with one poll."""
        await self.poll()
        task_status.started()
        while True:
            with trio.move_on_after(interval()):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.poll()
