"""Training jobs in the control plane (docs/training.md): the transitions of their events, the pass's rule, and their
effects. Pure (the handlers are in `llmgw.control.training_handlers`).

`training_step(state, now_unix)` runs `llmgw.training.queueing.schedule` over the state's book with the
fleet as `NodeRoom`s (`rooms`) and turns its starts and cancels into `StartTraining` / `CancelTraining` effects;
`decide` calls it in every pass of the leader (a node lost or given room), and so do the events that change the book
at once (`training_submitted`, `training_cancel_requested`). `training_reported` folds a node's TrainingReport into
the job's status; `training_piece_received` asks the store to keep a piece (`KeepTrainingPiece`), and
`training_piece_kept` counts it (the job is done once its report said so and every piece is kept). The wire's
messages come in as `Report` and `KeepTrainingPiece` values (`llmgw.control.agents` converts them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmgw.control.state import ControlState
from llmgw.plan.identity import engine_version_of
from llmgw.training.jobs import ENDED, Adapter, JobState, JobStatus, TrainingJob
from llmgw.training.queueing import NodeRoom, schedule


@dataclass(frozen=True)
class StartTraining:
    """Send `status`'s job to `node_id`; `llama_cpp`: the llama.cpp version serving its model ("" none: the adapter
    stays a PEFT safetensors file)."""

    status: JobStatus
    node_id: str
    llama_cpp: str = ""
    token: int = 0


@dataclass(frozen=True)
class CancelTraining:
    """Tell `node_id` to stop job `job_id`."""

    job_id: str
    node_id: str
    reason: str
    token: int = 0


@dataclass(frozen=True)
class Report:
    """A node's TrainingReport (agent.proto): `state` ("fetching", "running", "converting", "sending", "done",
    "failed"), `step` of `steps`, `loss`, `losses`, `peak_memory_bytes`, `seconds`, `error`."""

    job_id: str
    state: str
    step: int = 0
    steps: int = 0
    loss: float = 0.0
    losses: tuple[float, ...] = ()
    peak_memory_bytes: int = 0
    seconds: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class KeepTrainingPiece:
    """Keep piece `index` of `count` of job `job_id`'s adapter file `name` (`size` bytes, `sha256`) in the store."""

    job_id: str
    name: str
    index: int
    count: int
    data: bytes
    size: int
    sha256: str


def _classes(record) -> frozenset[str]:
    labels = dict(record.state.labels)
    return frozenset({*([labels["class"]] if "class" in labels else []),
                      *(gpu.gpu_class for gpu in record.state.gpus if gpu.gpu_class)})


def rooms(state: ControlState) -> list[NodeRoom]:
    """The fleet as the training rule sees it: each node's classes, its memory less what its shards reserve,
    whether it is connected, and why a job there cannot go on (lost). Pure."""
    out = []
    lost_after = state.fleet.lost_after
    for record in state.fleet.records():
        node = record.state
        used = sum(shard.memory_bytes for shard in node.shards if not shard.adopted_foreign)
        gone = (f"node {node.node_id} was lost (no heartbeat for {lost_after:g} s)"
                if record.lost or not node.alive else "")
        out.append(NodeRoom(node.node_id, _classes(record), max(0, node.memory_bytes - used), record.connected,
                            gone))
    return out


def _llama_cpp(state: ControlState, job: TrainingJob) -> str:
    settings = state.settings
    model = settings.models.get(job.model) if settings is not None else None
    if model is None or model.engine != "llama.cpp":
        return ""
    return engine_version_of(settings, model) or "any"


def training_step(state: ControlState, now_unix: float) -> tuple[ControlState, list]:
    """The book after the training rule at `now_unix`, and the effects it asks for (commands only from a leader;
    a follower leaves the book as it is). Pure."""
    if not state.leadership.leader or not state.training.jobs:
        return state, []
    book, starts, cancels = schedule(state.training, rooms(state), now_unix)
    if book is state.training:
        return state, []
    token = state.leadership.token
    effects: list = [StartTraining(s.status, s.node_id, _llama_cpp(state, s.status.job), token) for s in starts]
    effects += [CancelTraining(c.job_id, c.node_id, c.reason, token) for c in cancels]
    return replace(state, training=book), effects


def training_seen(state: ControlState, node_id: str, running: frozenset[str], now_unix: float) -> ControlState:
    """`state` after a heartbeat of `node_id` listing the training jobs its agent runs (`running`): a job the book
    has fetching, running or converting there that is not listed failed with the agent (it restarted: its training is gone).
    Jobs starting (the agent may not have it yet) or sending (the agent is done with it) are left alone. Pure."""
    book = state.training
    for status in state.training.jobs:
        if (status.node_id == node_id and status.state in (JobState.FETCHING, JobState.RUNNING, JobState.CONVERTING)
                and status.job_id not in running):
            book = book.put(replace(status, state=JobState.FAILED, ended_unix=now_unix, error=(
                f"the agent of node {node_id} no longer runs the job (it restarted?); submit it again")))
    return state if book is state.training else replace(state, training=book)


def training_submitted(job: TrainingJob, now_unix: float):
    """The transition of a job submitted (the admin API checked it): queued, and started at once where it fits.
    Raises nothing; a job id in use is refused before (`llmgw.control.training.submit`)."""
    def transition(state: ControlState):
        following = replace(state, training=state.training.put(JobStatus(job)))
        following, effects = training_step(following, now_unix)
        return following, False, tuple(effects)
    return transition


def training_cancel_requested(job_id: str, reason: str, now_unix: float):
    """The transition of a cancel asked by a person: the job is cancelled (its node told) unless it ended."""
    def transition(state: ControlState):
        status = state.training.get(job_id)
        if status is None or status.state in ENDED:
            return state, False, ()
        following = replace(state, training=state.training.put(replace(status, cancel=True, error=reason)))
        following, effects = training_step(following, now_unix)
        return following, False, tuple(effects)
    return transition


def training_start_failed(job_id: str, node_id: str, error: str, now_unix: float):
    """The transition of a StartTraining refused or unanswered: the job fails with the node's reason."""
    def transition(state: ControlState):
        status = state.training.get(job_id)
        if status is None or status.state in ENDED or status.node_id != node_id:
            return state, False
        return replace(state, training=state.training.put(replace(
            status, state=JobState.FAILED, error=error, ended_unix=now_unix))), False
    return transition


_REPORTED = {"fetching": JobState.FETCHING, "running": JobState.RUNNING, "converting": JobState.CONVERTING, "sending": JobState.SENDING,
             "done": JobState.SENDING, "failed": JobState.FAILED}


def training_reported(node_id: str, report: Report, now_unix: float):
    """The transition of a node's TrainingReport: the job's progress (a report of a job not on that node, or ended,
    is left alone). "done" counts once every piece is kept."""
    def transition(state: ControlState):
        status = state.training.get(report.job_id)
        kind = _REPORTED.get(report.state)
        if status is None or kind is None or status.node_id != node_id or status.state in ENDED:
            return state, False
        new = replace(status, state=kind, step=report.step or status.step, steps=report.steps or status.steps,
                      loss=report.loss if report.losses else status.loss,
                      losses=tuple(report.losses) or status.losses,
                      peak_memory_bytes=max(status.peak_memory_bytes, report.peak_memory_bytes),
                      seconds=report.seconds or status.seconds, error=report.error)
        if report.state == "failed":
            new = replace(new, ended_unix=now_unix)
        elif report.state == "done" and new.adapter is not None and new.adapter.complete:
            new = replace(new, state=JobState.DONE, ended_unix=now_unix)
        elif report.state == "done":
            new = replace(new, error="")  # waits for its pieces: `training_piece_kept` ends it
        return replace(state, training=state.training.put(new)), False
    return transition


def training_piece_received(node_id: str, piece: KeepTrainingPiece):
    """The transition of a TrainingPiece: kept in the store (`KeepTrainingPiece`) when it is of a job on that node."""
    def transition(state: ControlState):
        status = state.training.get(piece.job_id)
        if status is None or status.node_id != node_id or status.state in ENDED or piece.index >= piece.count:
            return state, False, ()
        adapter = status.adapter
        if adapter is None or adapter.sha256 != piece.sha256:
            adapter = Adapter(piece.name, piece.size, piece.sha256, piece.count)
        following = replace(state, training=state.training.put(replace(status, adapter=adapter)))
        return following, False, (piece,)
    return transition


def training_piece_kept(job_id: str, sha256: str, now_unix: float, error: str = ""):
    """The transition of a piece kept in the store (or not: `error`, which fails the job)."""
    def transition(state: ControlState):
        status = state.training.get(job_id)
        if status is None or status.adapter is None or status.adapter.sha256 != sha256 or status.state in ENDED:
            return state, False
        if error:
            new = replace(status, state=JobState.FAILED, error=error, ended_unix=now_unix)
        else:
            adapter = replace(status.adapter, kept=status.adapter.kept + 1)
            new = replace(status, adapter=adapter)
            if adapter.complete and status.state is JobState.SENDING and status.step >= status.steps:
                new = replace(new, state=JobState.DONE, ended_unix=now_unix)
        return replace(state, training=state.training.put(new)), False
    return transition
