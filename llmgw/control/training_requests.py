"""What an operator asks of the training jobs through the control plane (`llmgw train`, the admin API's
/api/v1/training routes): submit one, list them, show one, cancel one, fetch a finished job's adapter."""

from __future__ import annotations

import base64
import secrets
import time
from typing import Any

import trio

from llmgw.control.looping import ControlLoop
from llmgw.control.training import training_cancel_requested, training_submitted
from llmgw.control.training_handlers import read_adapter
from llmgw.errors import UsageError
from llmgw.training.jobs import ENDED, JOB_ID, job_from_request


async def submit(loop: ControlLoop, body: dict[str, Any]) -> dict[str, Any]:
    """Queue the job of `body` (`llmgw.training.jobs.job_from_request`; "job": its id, default "train-<8 hex>")
    and return its status once the control plane took it (started already where a node had room). Raises
    UsageError for a job that is not valid, an id in use, a model not in the catalog, or a control plane that does
    not lead (it would never start it)."""
    state = loop.state
    job_id = str(body.get("job") or f"train-{secrets.token_hex(4)}")
    if not JOB_ID.fullmatch(job_id):
        raise UsageError(f"training job id {job_id!r}: use lower-case letters, digits and dashes")
    if state.training.get(job_id) is not None:
        raise UsageError(f"training job {job_id} exists already; give another id")
    name = body.get("model")
    model = state.settings.models.get(name) if state.settings is not None and isinstance(name, str) else None
    catalog = tuple((f.source, f.sha256, f.secret or "") for f in model.weights) if model is not None else ()
    job = job_from_request(body, job_id, time.time(), catalog)
    if model is None:
        raise UsageError(f"the catalog has no model {job.model!r}; a job trains an adapter for one of the catalog's "
                         "models")
    if not state.leadership.leader:
        raise UsageError(f"this control plane does not lead ({state.leadership.holder or 'no leader known'} does): "
                         "submit the job to the leader")
    loop.update(training_submitted(job, time.time()), f"training job {job_id} submitted")
    await loop.folded_all()
    return job_status(loop, job_id)


def jobs(loop: ControlLoop) -> dict[str, Any]:
    """{"jobs": [status, ...]} in the order submitted (`JobStatus.to_dict`)."""
    return {"jobs": [status.to_dict() for status in loop.state.training.jobs]}


def job_status(loop: ControlLoop, job_id: str) -> dict[str, Any]:
    """One job's status. Raises UsageError for an unknown job."""
    status = loop.state.training.get(job_id)
    if status is None:
        raise UsageError(f"no training job {job_id} (this control plane knows jobs since it started: "
                         "`llmgw train list`)")
    return status.to_dict()


async def cancel(loop: ControlLoop, job_id: str) -> dict[str, Any]:
    """Cancel a job (its node is told to stop it) and return its status; one that ended is left as it is. Raises
    UsageError for an unknown job."""
    status = loop.state.training.get(job_id)
    if status is None:
        raise UsageError(f"no training job {job_id}")
    if status.state not in ENDED:
        loop.update(training_cancel_requested(job_id, "cancelled by the operator", time.time()),
                    f"training job {job_id} cancelled")
        await loop.folded_all()
    return job_status(loop, job_id)


async def adapter(store: Any, job_id: str) -> dict[str, Any]:
    """A finished job's adapter from the store: {"job", "name", "size", "sha256", "data_base64"}. Raises
    UsageError when the store holds none (the job did not finish, or no store)."""
    if store is None:
        raise UsageError("this control plane has no store yet")
    doc, data = await trio.to_thread.run_sync(read_adapter, store, job_id)
    return {"job": job_id, "name": doc["name"], "size": doc["size"], "sha256": doc["sha256"],
            "data_base64": base64.b64encode(data).decode("ascii")}
