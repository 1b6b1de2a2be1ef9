"""Transitions of the control plane's events beyond a pass (`llmgw.control.deciding` has the pass and the actions'
outcomes). Pure: each builds the next `ControlState`, and some ask for effects (`llmgw.control.effects`).

- `settings_published`: the settings watcher's news (settings in force, a rejected head) becomes the state's.
- `change_effects`: a batch of events that changed what the routing table depends on asks for `PublishRoutingTable`.
- `audit_written`, `nodes_forgotten`: what the audit and store handlers learned.
- `slurm_jobs_reported`, `slurm_jobs_written`: ended Slurm jobs to record into usage, and the outcome.
- `settings_edit_requested`: a person's edit of the settings, to be committed as them (`CommitSettings`); its
  outcome comes back as the watcher's news of the new branch head (`settings_published`).
- `wipe_requested`: `llmgw node remove`'s wipe of a node's host over its agent's stream (`WipeNode`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from llmgw.control.canaries import canaries_for_settings
from llmgw.control.effects import CommitSettings, Effect, PublishRoutingTable, RecordSlurmUsage, WipeNode
from llmgw.control.reports import memory_thresholds
from llmgw.control.restart_only import restart_notes
from llmgw.control.state import SLURM_RECORDED_MAX, ControlState, SlurmLedger, WatchState, frozen
from llmgw.settings.model import ClusterSettings

Transition = Callable[[ControlState], tuple]


def settings_published(watch: WatchState, lost_after: float | None,
                       started: tuple[ClusterSettings, Collection[str]] | None = None) -> Transition:
    """The transition of the watcher's new `watch`: the state's watch, the fleet's node expiry (`lost_after`
    seconds, None: the settings' `node_lost_after`, 30 s without settings) and memory thresholds, and the notes of
    settings that only a restart applies (`started`: the cluster settings the control plane started with and the
    keys the command line set; None: none yet), and the canaries the change starts or ends
    (`llmgw.control.canaries.canaries_for_settings`). Placement-relevant."""
    settings = watch.settings
    expiry = lost_after or (settings.cluster.node_lost_after if settings else 30.0)
    thresholds = memory_thresholds(settings)
    notes = restart_notes(*started, settings.cluster) if started is not None and settings is not None else None

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        before = state.settings if state.settings is not None else watch.applied  # at start: the applied commit's
        following = replace(state, watch=watch, fleet=state.fleet.with_limits(
            expiry, thresholds, settings.cluster.max_inlet_celsius if settings else None),
                            canaries=canaries_for_settings(state.canaries, before, settings))
        return (following if notes is None else replace(following, restart_notes=notes)), True

    return transition


def watch_reason(watch: WatchState) -> str:
    """How the watcher's news is named among a pass's triggers: "settings <commit>" (and a rejected head)."""
    settings = watch.settings
    commit = settings.commit[:12] if settings and settings.commit else "none"
    rejected = watch.bad or watch.held
    return f"settings {commit}" + (f" (head {rejected.commit[:12]} rejected)" if rejected else "")


def change_effects(old: ControlState, new: ControlState, reasons: list[str]) -> tuple[Effect, ...]:
    """The effects of a batch of events that changed `old` into `new` (`reasons`: the placement-relevant ones):
    the routing table is published again when something it depends on changed, at once when the settings did."""
    if reasons or new.settings is not old.settings:
        return (PublishRoutingTable(new, at_once=new.settings is not old.settings),)
    return ()


def audit_written(snapshot) -> Transition:
    """The transition of an audit commit queued with status snapshot `snapshot`."""
    return lambda state: (replace(state, audit_snapshot=snapshot), False)


def nodes_forgotten(state: ControlState) -> tuple[ControlState, bool]:
    """Keeping the connected nodes in the store failed: the next pass tries again."""
    return replace(state, remembered=None), False


def slurm_jobs_reported(state: ControlState, node_id: str, cluster: str, jobs: tuple[tuple[str, object], ...],
                        until: float) -> tuple[ControlState, bool, tuple[Effect, ...]]:
    """A heartbeat of `node_id` reported ended Slurm jobs `jobs` ((request id, usage record) pairs) of `cluster`
    and the sacct margin `until` (unix seconds, 0: none). Those recorded already are left out; when nothing is new
    and the cursor is there already, nothing happens. Otherwise the jobs count as recorded (at most
    `SLURM_RECORDED_MAX` remembered, oldest forgotten first), the cursor as moved, and a `RecordSlurmUsage` writes
    them. Returns (state, False, effects)."""
    ledger = state.slurm
    fresh = tuple((rid, record) for rid, record in jobs if rid not in ledger.recorded)
    if not fresh and until <= ledger.cursors.get(cluster, 0.0):
        return state, False, ()
    recorded = dict(ledger.recorded)
    for request_id, _ in fresh:
        recorded[request_id] = None
    while len(recorded) > SLURM_RECORDED_MAX:
        del recorded[next(iter(recorded))]
    cursors = ledger.cursors
    if until:
        cursors = frozen({**cursors, cluster: max(until, cursors.get(cluster, 0.0))})
    following = replace(state, slurm=replace(ledger, recorded=frozen(recorded), cursors=cursors))
    return following, False, (RecordSlurmUsage(node_id, cluster, fresh, until, ledger.failed),)


def slurm_jobs_written(cluster: str, recorded: tuple[str, ...], failed: tuple[str, ...], cursor_moved: bool,
                       ) -> Transition:
    """The transition of a `RecordSlurmUsage` written: `failed` request ids are forgotten as recorded and kept as
    failed (the agent sends them again), `recorded` ones are no longer failed, and the cluster's cursor is forgotten
    unless it moved in the store (`cursor_moved`)."""
    def transition(state: ControlState) -> tuple[ControlState, bool]:
        ledger = state.slurm
        recorded_ids = {k: None for k in ledger.recorded if k not in failed}
        cursors = ledger.cursors if cursor_moved else frozen(
            {k: v for k, v in ledger.cursors.items() if k != cluster})
        return replace(state, slurm=SlurmLedger(recorded=frozen(recorded_ids), cursors=cursors,
                                                failed=(ledger.failed - set(recorded)) | set(failed))), False
    return transition


def wipe_requested(effect: WipeNode) -> Transition:
    """The transition of `llmgw node remove`'s wipe of a drained node's host: the state stays, and `effect` goes
    out with the lease's fencing token of now (a deposed leader's wipe is refused by the agent)."""
    return lambda state: (state, False, (replace(effect, token=state.leadership.token),))


def settings_edit_requested(effect: CommitSettings) -> Transition:
    """The transition of a person's edit of the settings (admin API, CLI, console): the state stays, and the edit is
    committed as them (`effect`). Not placement-relevant: the new head, once committed, is."""
    return lambda state: (state, False, (effect,))
