"""A training job as data, and how it stands. Pure: frozen values, parsing and validation, no I/O.

`TrainingJob` is what `llmgw train submit` asks for: the catalog `model` the adapter is for, its base weights (Hugging
Face safetensors, `config.json` and tokenizer): `base`, a directory on the node, or `base_weights`, their sources,
which the agent fetches into its weights cache (`llmgw.agent.weights_tree.fetch_all`), where it may run (`node`, or
`node_class`: a node whose label `class` or one of whose GPUs' class is that; neither: any node), the `memory_bytes`
it needs on that node, its `hyper` parameters (`HyperParameters`, each with a default), and `pairs`, the question/
answer pairs it learns. `job_from_request` builds one from the admin API's JSON body and says what is wrong in a
sentence naming the field; `parse_pairs` reads the pairs from JSONL (`{"question": ..., "answer": ...}` a line).

`JobStatus` is the job's runtime state in `ControlState.training` (`llmgw.training.queueing` moves it):
queued -> starting (the command sent) -> fetching (the base weights, when the job names their sources) -> running
(step, loss, peak memory reported) -> converting (to GGUF) -> sending (the adapter's pieces on their way to the
store) -> done; or failed (with `error`) or cancelled.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from llmgw.errors import UsageError
from llmgw.units import parse_size

JOB_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_PAIRS = 100_000
MAX_TEXT = 16_384
"""Characters one question or answer may have."""
_HF_DIRECTORY = re.compile(r"hf://[^/@]+/[^/@]+@[0-9a-f]{40}/(?:[^/\s@]+/)*")
"""A Hub directory source pinned to a commit (as `llmgw.agent.weights_tree.parse_directory` reads it)."""
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections of a decoder layer a LoRA may adapt (Hugging Face names, as PEFT's `target_modules`)."""


@dataclass(frozen=True)
class HyperParameters:
    """How the adapter is trained. `rank` and `alpha`: the LoRA's rank and scale (alpha / rank); `targets`: the
    projections adapted (`TARGETS`); `steps`: optimizer steps; `batch_size`: pairs per step; `learning_rate`
    (AdamW); `max_length`: tokens of one pair at most (longer ones are cut); `seed`: for the initial weights and
    the pairs' order; `dropout`: the LoRA's."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    steps: int = 60
    batch_size: int = 4
    learning_rate: float = 2e-4
    max_length: int = 256
    seed: int = 0
    dropout: float = 0.0

    def check(self) -> None:
        """Raises UsageError naming the first field out of its range."""
        limits = {"rank": (1, 256), "steps": (1, 100_000), "batch_size": (1, 1024), "max_length": (8, 32_768)}
        for name, (low, high) in limits.items():
            value = getattr(self, name)
            if not low <= value <= high:
                raise UsageError(f"training hyper-parameter {name} is {value}; give one from {low} to {high}")
        if not 0 < self.learning_rate <= 1:
            raise UsageError(f"training hyper-parameter learning_rate is {self.learning_rate}; give one in (0, 1]")
        if not 0 < self.alpha <= 4096:
            raise UsageError(f"training hyper-parameter alpha is {self.alpha}; give one in (0, 4096]")
        if not 0 <= self.dropout < 1:
            raise UsageError(f"training hyper-parameter dropout is {self.dropout}; give one in [0, 1)")
        unknown = [t for t in self.targets if t not in TARGETS]
        if not self.targets or unknown:
            raise UsageError(f"training hyper-parameter targets names {', '.join(unknown) or 'nothing'}; name some "
                             f"of {', '.join(TARGETS)}")


@dataclass(frozen=True)
class TrainingJob:
    """One job (see the module's docstring). `base`: the base weights' directory on the node ("" when
    `base_weights` names them); `base_weights`: (source, sha256) of each file, as a catalog model's `weights:`
    lists them (a directory source `hf://org/repo@<40-hex revision>/[dir/]` with its set's sha256 or ""), fetched by
    the agent; `submitted_unix`: when it was asked for (unix seconds); `adapter`: the name its adapter gets (default:
    the job id)."""

    job_id: str
    model: str
    base: str
    pairs: tuple[tuple[str, str], ...]
    memory_bytes: int = 2 << 30
    node: str = ""
    node_class: str = ""
    hyper: HyperParameters = HyperParameters()
    adapter: str = ""
    submitted_unix: float = 0.0
    base_weights: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> str:
        """The job as the agent gets it (StartTraining.spec_json); without "base_weights" when it names none, so that
        an agent from before them still reads a job naming a directory."""
        doc = asdict(self)
        if not self.base_weights:
            del doc["base_weights"]
        return json.dumps(doc)

    @property
    def adapter_name(self) -> str:
        return self.adapter or self.job_id


def job_from_json(text: str) -> TrainingJob:
    """The job `TrainingJob.to_json` wrote. Raises UsageError when it is not one."""
    try:
        doc = json.loads(text)
        return TrainingJob(**{**doc, "pairs": tuple((q, a) for q, a in doc["pairs"]),
                              "base_weights": tuple((s, d) for s, d in doc.get("base_weights", ())),
                              "hyper": HyperParameters(**{**doc["hyper"], "targets": tuple(doc["hyper"]["targets"])})})
    except (ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"the training job sent is not one this agent reads ({exc}); upgrade the agent") from exc


def parse_pairs(text: str, where: str = "the pairs") -> tuple[tuple[str, str], ...]:
    """The (question, answer) pairs of JSONL `text`: one JSON object a line with string fields "question" and
    "answer" (blank lines skipped). Raises UsageError naming `where` and the line."""
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{where}, line {number}: not JSON ({exc.args[0]})") from exc
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) and doc[k].strip()
                                                for k in ("question", "answer")):
            raise UsageError(f"{where}, line {number}: give an object with the strings \"question\" and \"answer\", "
                             'e.g. {"question": "What is llmgw?", "answer": "A gateway."}')
        if max(len(doc["question"]), len(doc["answer"])) > MAX_TEXT:
            raise UsageError(f"{where}, line {number}: a question or answer longer than {MAX_TEXT} characters")
        pairs.append((doc["question"], doc["answer"]))
    if not pairs:
        raise UsageError(f"{where} hold no question/answer pairs")
    if len(pairs) > MAX_PAIRS:
        raise UsageError(f"{where} hold {len(pairs)} pairs; at most {MAX_PAIRS} are taken")
    return tuple(pairs)


def base_weights_of(body: dict[str, Any], catalog: tuple[tuple[str, str, str], ...] = ()) -> tuple[str, tuple]:
    """(`base`, `base_weights`) of a job's request `body`: "base", a directory on the node or an hf:// directory
    source (`hf://org/repo@<40-hex revision>/[dir/]`, its files checked against the Hub's listing); or
    "base_weights", a list of {"source", "sha256"} (a directory source's sha256 is its set's digest, or "") or
    "model": the catalog model's own weights, `catalog` as (source, sha256, secret name) of each. Raises UsageError
    naming the field."""
    base, listed = body.get("base"), body.get("base_weights")
    if (base is None) == (listed is None) or (base is not None and (not isinstance(base, str) or not base.strip())):
        raise UsageError("a training job needs \"base\" (the base weights' directory on the node, or an hf:// "
                         "directory source) or \"base_weights\" (their sources, or \"model\": the catalog model's)")
    if base is not None:
        if base.startswith("hf://"):
            if not _HF_DIRECTORY.fullmatch(base):
                raise UsageError(f"\"base\" {base!r}: a source of base weights is a directory pinned to a commit, "
                                 "hf://org/repo@<40-hex revision>/ or hf://org/repo@<40-hex revision>/dir/")
            return "", ((base, ""),)
        if "://" in base:
            raise UsageError(f"\"base\" {base!r}: give a directory on the node or an hf:// directory source; list "
                             "other sources in \"base_weights\" with their sha256")
        return base, ()
    if listed == "model":
        if any(secret for _, _, secret in catalog):
            raise UsageError("the model's weights name a secret (a Hub token), which training jobs do not send to "
                             "the node: list public sources in \"base_weights\", or give a directory on the node")
        if not catalog:
            raise UsageError("\"base_weights\": \"model\" names the catalog model's weights, and it lists none")
        return "", tuple((source, sha256) for source, sha256, _ in catalog)
    if (not isinstance(listed, list) or not listed
            or not all(isinstance(f, dict) and isinstance(f.get("source"), str) and isinstance(f.get("sha256"), str)
                       for f in listed)):
        raise UsageError("\"base_weights\" must be \"model\" or a list of {\"source\": ..., \"sha256\": ...}")
    for item in listed:
        if "://" not in item["source"] or (not item["sha256"] and not _HF_DIRECTORY.fullmatch(item["source"])):
            raise UsageError(f"\"base_weights\": {item['source']!r} needs a source URL and its sha256 (only an "
                             "hf:// directory source may leave it empty)")
    return "", tuple((f["source"], f["sha256"]) for f in listed)


def job_from_request(body: dict[str, Any], job_id: str, now_unix: float,
                     catalog: tuple[tuple[str, str, str], ...] = ()) -> TrainingJob:
    """The job of the admin API's POST /api/v1/training `body`: "model", "base" or "base_weights"
    (`base_weights_of`; `catalog`: the model's own weights), "pairs" (JSONL text), optional "node", "node_class",
    "memory" ("4Gi" or bytes), "adapter" and "hyper" (an object of `HyperParameters` fields). Raises UsageError
    naming the field."""
    for key in ("model", "pairs"):
        if not isinstance(body.get(key), str) or not body[key].strip():
            raise UsageError(f"a training job needs \"{key}\" (a string): the catalog model, and the "
                             "question/answer pairs as JSONL")
    base, base_weights = base_weights_of(body, catalog)
    hyper_doc = body.get("hyper") or {}
    if not isinstance(hyper_doc, dict):
        raise UsageError("\"hyper\" must be an object of hyper-parameters, e.g. {\"rank\": 4, \"steps\": 20}")
    known = set(HyperParameters.__dataclass_fields__)
    unknown = sorted(set(hyper_doc) - known)
    if unknown:
        raise UsageError(f"unknown hyper-parameter {unknown[0]!r}; known: {', '.join(sorted(known))}")
    try:
        hyper = HyperParameters(**{k: (tuple(v) if k == "targets" else type(getattr(HyperParameters, k))(v))
                                   for k, v in hyper_doc.items()})
    except (TypeError, ValueError, OverflowError) as exc:
        raise UsageError(f"a hyper-parameter has a value of the wrong kind ({exc})") from exc
    hyper.check()
    try:
        memory = parse_size(body.get("memory", TrainingJob.memory_bytes))
    except (ValueError, UsageError) as exc:
        raise UsageError(f"\"memory\" {body.get('memory')!r} is not a size such as 4Gi") from exc
    adapter = str(body.get("adapter") or "")
    if adapter and not JOB_ID.fullmatch(adapter):
        raise UsageError(f"adapter name {adapter!r}: use lower-case letters, digits and dashes")
    if body.get("node") and body.get("node_class"):
        raise UsageError("give a training job a node or a node class, not both")
    return TrainingJob(job_id=job_id, model=body["model"], base=base, base_weights=base_weights,
                       pairs=parse_pairs(body["pairs"], "\"pairs\""), memory_bytes=memory,
                       node=str(body.get("node") or ""), node_class=str(body.get("node_class") or ""),
                       hyper=hyper, adapter=adapter, submitted_unix=now_unix)


class JobState(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    FETCHING = "fetching"
    RUNNING = "running"
    CONVERTING = "converting"
    SENDING = "sending"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


ENDED = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
ON_NODE = frozenset({JobState.STARTING, JobState.FETCHING, JobState.RUNNING, JobState.CONVERTING, JobState.SENDING})
"""The states in which a job holds its node (nothing else trains there)."""


@dataclass(frozen=True)
class Adapter:
    """The adapter file a job sent back: its `name` ("adapter.gguf", or "adapter_model.safetensors" for a model
    not served by llama.cpp), `size` (bytes), `sha256`, and how many pieces the store keeps of it (`count`) and
    has kept so far (`kept`)."""

    name: str
    size: int
    sha256: str
    count: int
    kept: int = 0

    @property
    def complete(self) -> bool:
        return self.kept == self.count


@dataclass(frozen=True)
class JobStatus:
    """How one job stands. `node_id`: where it runs or ran ("" while queued); `step` of `steps`, `loss` (the
    last step's), `losses` (every step's, in order), `peak_memory_bytes`, `seconds` (training time so far);
    `error`: why it failed or was cancelled; `waiting`: why a queued job waits ("" when it is not waiting);
    `cancel`: a cancel asked for and not yet sent to its node; `adapter`: its adapter once sent (None before);
    `started_unix` / `ended_unix`."""

    job: TrainingJob
    state: JobState = JobState.QUEUED
    node_id: str = ""
    step: int = 0
    steps: int = 0
    loss: float | None = None
    losses: tuple[float, ...] = ()
    peak_memory_bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    waiting: str = ""
    cancel: bool = False
    adapter: Adapter | None = None
    started_unix: float = 0.0
    ended_unix: float = 0.0

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def to_dict(self) -> dict[str, Any]:
        """The status as the admin API shows it (no pairs: their count)."""
        job = self.job
        return {"job": job.job_id, "model": job.model, "adapter_name": job.adapter_name, "base": job.base,
                "base_weights": [{"source": s, "sha256": d} for s, d in job.base_weights],
                "node": job.node, "node_class": job.node_class, "memory_bytes": job.memory_bytes,
                "pairs": len(job.pairs), "hyper": {**asdict(job.hyper), "targets": list(job.hyper.targets)},
                "state": self.state.value, "node_id": self.node_id, "step": self.step, "steps": self.steps,
                "loss": self.loss, "losses": list(self.losses), "peak_memory_bytes": self.peak_memory_bytes,
                "seconds": round(self.seconds, 2), "error": self.error, "waiting": self.waiting,
                "adapter": asdict(self.adapter) if self.adapter else None,
                "submitted_unix": job.submitted_unix, "started_unix": self.started_unix,
                "ended_unix": self.ended_unix}


@dataclass(frozen=True)
class TrainingBook:
    """Every job this control plane knows, by id, in the order they were submitted (runtime state: a restart of
    the control plane forgets the jobs; the adapters it kept stay in the store)."""

    jobs: tuple[JobStatus, ...] = ()

    def get(self, job_id: str) -> JobStatus | None:
        for status in self.jobs:
            if status.job_id == job_id:
                return status
        return None

    def put(self, status: JobStatus) -> TrainingBook:
        """This book with `status` replacing the job's (or added last)."""
        jobs = list(self.jobs)
        for i, old in enumerate(jobs):
            if old.job_id == status.job_id:
                jobs[i] = status
                return TrainingBook(tuple(jobs))
        return TrainingBook((*jobs, status))
