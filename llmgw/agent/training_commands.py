"""The agent's StartTraining and CancelTraining handlers (`llmgw.agent.commands`; docs/training.md).

StartTraining is answered at once (ok, or why the job cannot run here: no training environment, no base weights);
the training then runs as a task of the agent's nursery (it goes on while the connection is down) and reports with
TrainingReport messages: "fetching" while the base weights a job names by source are fetched into the weights
cache and checked as an engine's are (`fetch_base`; a job naming a directory on the node skips it), "running" after
each step (step, loss, every loss so far, peak memory), "converting" while
llama.cpp's converter writes the GGUF (a model served by llama.cpp; for another engine the adapter is PEFT's
`adapter_config.json` and `adapter_model.safetensors` in one tar), "sending" while the adapter goes back in
TrainingPiece messages (each waits for a connection's room: none is dropped while one is open), then "done"; or
"failed" with the reason. Its files are kept under `<state_dir>/training/<job id>/` until the next job of that id.
CancelTraining cancels the task (the training process is killed) and answers ok, also when nothing ran.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import trio

from llmgw.agent import weights_tree
from llmgw.agent.node import Command, NodeAgent
from llmgw.agent.weights import WeightsSpec
from llmgw.agent.weights_layout import engine_model_path
from llmgw.engines.installing import default_cache_dir
from llmgw.errors import LlmgwError, UsageError, WeightsError
from llmgw.groups import expect_leaves
from llmgw.training import running
from llmgw.training.environment import find_converter, training_python
from llmgw.training.jobs import job_from_json
from llmgw.wire import agent_message, pb

log = logging.getLogger("llmgw.agent")

DELIVER_WAIT = 0.05
"""Seconds between two tries to queue a piece while no connection has room."""


def _python(agent: NodeAgent) -> Path | None:
    config = agent.config
    if config.training_python is not None:
        return Path(config.training_python) if Path(config.training_python).exists() else None
    return (training_python(config.engines_path)
            or training_python(Path(config.cache_dir or default_cache_dir()) / "engines"))


async def start_training(agent: NodeAgent, command: Command) -> None:
    """StartTraining: check what the job needs, answer, and run it in the agent's nursery. Not a checkpoint."""
    body: pb.StartTraining = command.body
    try:
        job = job_from_json(body.spec_json)
        python = _python(agent)
        if python is None:
            raise UsageError(f"node {agent.config.node_id} has no training environment: run `python -m "
                             "llmgw.training.environment` there (`make train-env`)")
        if not job.base_weights and not (Path(job.base) / "config.json").is_file():
            raise UsageError(f"node {agent.config.node_id} has no base weights at {job.base} (a directory of "
                             "Hugging Face safetensors with config.json)")
        converter = None
        if body.llama_cpp:
            converter = find_converter(Path(agent.config.cache_dir or default_cache_dir()), body.llama_cpp)
            if converter is None:
                raise UsageError(f"node {agent.config.node_id} has no llama.cpp source with convert_lora_to_gguf.py "
                                 f"under {agent.config.cache_dir or default_cache_dir()}/src to convert the adapter "
                                 "for llama.cpp")
    except LlmgwError as exc:
        agent.result(command.id, str(exc))
        return
    old = agent.training.pop(job.job_id, None)
    if old is not None:
        old.cancel()
    scope = trio.CancelScope()
    agent.training[job.job_id] = scope
    agent.result(command.id)
    agent.nursery.start_soon(_train, agent, job, python, converter, scope)


async def fetch_base(agent: NodeAgent, sources: tuple[tuple[str, str], ...]) -> Path:
    """The base weights of `sources` ((source, sha256) pairs, a directory source's files listed by the Hub) fetched
    into the agent's weights cache with the engines' fetcher (`llmgw.agent.weights_tree.fetch_all`: its mirrors, its
    offline setting, every file checked against its sha256 or git blob id, pickles refused) and laid out as one
    Hugging Face directory (`llmgw.agent.weights_layout.engine_model_path`, as for vLLM). Raises WeightsError (a
    file that cannot be fetched or is not what its source publishes, or a set without `config.json`)."""
    config = agent.config
    files = [WeightsSpec(source, sha256) for source, sha256 in sources]
    try:
        paths, names, within = await weights_tree.fetch_all(files, config.weights_path,
                                                            [Path(m) for m in config.mirrors],
                                                            offline=config.offline_only)
    except BaseExceptionGroup as group:
        raise expect_leaves(group, LlmgwError)[0] from group
    directory = await trio.to_thread.run_sync(engine_model_path, "vllm", names, paths, config.weights_path, within)
    if not (directory / "config.json").is_file():
        raise WeightsError(f"the base weights {', '.join(s for s, _ in sources)} hold no config.json: name a "
                           "directory of Hugging Face safetensors with config.json and the tokenizer")
    return directory


async def cancel_training(agent: NodeAgent, command: Command) -> None:
    """CancelTraining: cancel the job's task (its process is killed) and answer ok."""
    scope = agent.training.pop(command.body.job_id, None)
    if scope is not None:
        scope.cancel()
    agent.result(command.id)


def _report(agent: NodeAgent, job_id: str, state: str, **fields) -> None:
    agent.emit(agent_message(training_report=pb.TrainingReport(job_id=job_id, state=state, **fields)))


async def _deliver(agent: NodeAgent, message: pb.AgentMessage) -> None:
    """Queue `message` on every open connection, waiting while none is open or has room."""
    while True:
        if [outbox for outbox in list(agent.outboxes) if outbox.put(message)]:
            return
        await trio.sleep(DELIVER_WAIT)


async def _train(agent: NodeAgent, job, python: Path, converter: Path | None, scope: trio.CancelScope) -> None:
    workdir = Path(agent.config.state_dir) / "training" / job.job_id
    started = time.monotonic()
    seen = {"losses": [], "peak": 0}

    def on_event(event: dict) -> None:
        if event["event"] != "step":
            return
        seen["losses"].append(float(event["loss"]))
        seen["peak"] = max(seen["peak"], int(event.get("peak_memory_bytes", 0)))
        _report(agent, job.job_id, "running", step=int(event["step"]), steps=int(event["steps"]),
                loss=float(event["loss"]), losses=seen["losses"], peak_memory_bytes=seen["peak"],
                seconds=float(event.get("seconds", 0.0)))

    with scope:
        try:
            await trio.to_thread.run_sync(lambda: shutil.rmtree(workdir, ignore_errors=True))
            base = Path(job.base)
            if job.base_weights:
                _report(agent, job.job_id, "fetching", steps=job.hyper.steps)
                base = await fetch_base(agent, job.base_weights)
            _report(agent, job.job_id, "running", steps=job.hyper.steps)
            adapter_dir = await running.train(python, job, base, workdir, on_event,
                                                 threads=agent.config.training_threads)
            done = dict(steps=job.hyper.steps, step=job.hyper.steps, losses=seen["losses"],
                        loss=seen["losses"][-1] if seen["losses"] else 0.0, peak_memory_bytes=seen["peak"])
            if converter is not None:
                _report(agent, job.job_id, "converting", seconds=time.monotonic() - started, **done)
                out = await running.convert_to_gguf(python, converter, base, adapter_dir,
                                                    workdir / "adapter.gguf")
            else:  # a PEFT adapter (vLLM): its two files in one uncompressed tar
                out = await trio.to_thread.run_sync(running.pack_peft, adapter_dir, workdir / "adapter.tar")
            data = await trio.to_thread.run_sync(out.read_bytes)
            _report(agent, job.job_id, "sending", seconds=time.monotonic() - started, **done)
            parts = running.pieces(data)
            digest = running.sha256_hex(data)
            for index, part in enumerate(parts):
                await _deliver(agent, agent_message(training_piece=pb.TrainingPiece(
                    job_id=job.job_id, name=out.name, index=index, count=len(parts), data=part, size=len(data),
                    sha256=digest)))
            _report(agent, job.job_id, "done", seconds=time.monotonic() - started, **done)
        except (LlmgwError, OSError) as exc:
            log.warning("training job %s failed: %s", job.job_id, exc)
            _report(agent, job.job_id, "failed", error=str(exc), seconds=time.monotonic() - started)
        finally:
            if agent.training.get(job.job_id) is scope:
                del agent.training[job.job_id]
