"""The handlers of the training effects (`llmgw.control.training`), registered by `register_training_handlers`.

StartTraining and CancelTraining are commands over the node's stream (a refused or unanswered start fails the job
with the node's reason); KeepTrainingPiece writes the piece into the store's key/value (base64 under
`training/<job>/piece/<index>`, then the adapter's record under `training/<job>/adapter` once the last is kept):
`read_adapter` reads them back for `llmgw train get` (GET /api/v1/training/JOB/adapter).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from typing import Any

import trio

from llmgw.control.training import CancelTraining, KeepTrainingPiece, StartTraining, training_piece_kept, training_start_failed
from llmgw.errors import LlmgwError, StoreError, TemporaryError, UsageError
from llmgw.wire import pb

log = logging.getLogger("llmgw.control")

START_TIMEOUT = 30.0
"""Seconds a node has to answer StartTraining or CancelTraining (it answers before training)."""


# -- the store -------------------------------------------------------------------------------------------------

def _piece_key(job_id: str, index: int) -> str:
    return f"training/{job_id}/piece/{index}"


def _adapter_key(job_id: str) -> str:
    return f"training/{job_id}/adapter"


def keep_piece(store: Any, effect: KeepTrainingPiece) -> None:
    """Write one piece, and after the last the adapter's record (name, size, sha256, count). Blocking."""
    store.put(_piece_key(effect.job_id, effect.index), base64.b64encode(effect.data).decode("ascii"))
    if effect.index == effect.count - 1:
        store.put(_adapter_key(effect.job_id), json.dumps({"name": effect.name, "size": effect.size,
                                                           "sha256": effect.sha256, "count": effect.count}))


def read_adapter(store: Any, job_id: str) -> tuple[dict, bytes]:
    """(the adapter's record, its bytes) of `job_id` from the store, checked against its sha256. Blocking. Raises
    UsageError when the store holds no complete adapter of that job."""
    record = store.get(_adapter_key(job_id))
    if record is None:
        raise UsageError(f"the store holds no adapter of training job {job_id}: see `llmgw train show {job_id}`")
    doc = json.loads(record)
    parts = []
    for index in range(doc["count"]):
        value = store.get(_piece_key(job_id, index))
        if value is None:
            raise UsageError(f"piece {index} of training job {job_id}'s adapter is missing from the store")
        parts.append(base64.b64decode(value))
    data = b"".join(parts)
    if hashlib.sha256(data).hexdigest() != doc["sha256"] or len(data) != doc["size"]:
        raise UsageError(f"the adapter of training job {job_id} in the store does not match its sha256; train it "
                         "again")
    return doc, data


# -- handlers --------------------------------------------------------------------------------------------------

def register_training_handlers(handlers, ctx) -> None:
    """StartTraining, CancelTraining and KeepTrainingPiece's handlers (`ctx`: llmgw.control.handlers.EffectContext)."""
    handlers.register(StartTraining, lambda e: _start(ctx, e))
    handlers.register(CancelTraining, lambda e: _cancel(ctx, e))
    handlers.register(KeepTrainingPiece, lambda e: _keep(ctx, e), lane="training-pieces")


async def _start(ctx, effect: StartTraining) -> None:
    job = effect.status.job
    command = pb.StartTraining(job_id=job.job_id, spec_json=job.to_json(), llama_cpp=effect.llama_cpp)
    try:
        outcome = await ctx.agents.command(effect.node_id, START_TIMEOUT, fencing_token=effect.token,
                                           start_training=command)
        error = "" if outcome.ok else f"node {effect.node_id} refused the job: {outcome.error}"
    except LlmgwError as exc:
        error = f"node {effect.node_id} did not take the job: {exc}"
    if error:
        log.warning("training job %s: %s", job.job_id, error)
        ctx.update(training_start_failed(job.job_id, effect.node_id, error, time.time()),
                   f"training job {job.job_id} not started")


async def _cancel(ctx, effect: CancelTraining) -> None:
    try:
        await ctx.agents.command(effect.node_id, START_TIMEOUT, fencing_token=effect.token,
                                 cancel_training=pb.CancelTraining(job_id=effect.job_id, reason=effect.reason))
    except LlmgwError as exc:  # the node is gone or away: nothing of the job runs on for us
        log.info("could not tell node %s to stop training job %s: %s", effect.node_id, effect.job_id, exc)


async def _keep(ctx, effect: KeepTrainingPiece) -> None:
    error = ""
    try:
        await trio.to_thread.run_sync(keep_piece, ctx.store, effect)
    except (StoreError, TemporaryError) as exc:
        error = f"the store could not keep piece {effect.index} of the adapter: {exc}"
    ctx.update(training_piece_kept(effect.job_id, effect.sha256, time.time(), error),
               f"piece {effect.index + 1}/{effect.count} of training job {effect.job_id} kept")
