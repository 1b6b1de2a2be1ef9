"""`llmgw train submit|list|show|cancel|get`: LoRA adapters trained on the fleet's nodes (docs/training.md), through
the control plane's admin API (/api/v1/training). `get JOB` writes the finished job's adapter to a file; with
`--add-to-catalog`, it also adds it to the job's model as an adapter (a settings commit as you, through POST
/api/v1/models/MODEL/adapters, the route `llmgw model adapter add` uses), its source the file written.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import time
from pathlib import Path

import click

from llmgw.cli.model_cmds import _post, _with_author
from llmgw.cli.server_cmds import _client_options, _print_json
from llmgw.errors import UsageError
from llmgw.units import format_size

HYPER = ("rank", "alpha", "steps", "batch_size", "learning_rate", "max_length", "seed", "dropout")


def _line(job: dict) -> str:
    """One job in one line: id, model, state, node, step, loss, peak memory."""
    loss = f"loss {job['loss']:.4f}" if job.get("loss") is not None else "loss -"
    where = job["node_id"] or job["waiting"] or "-"
    text = (f"{job['job']:<20} {job['model']:<16} {job['state']:<10} {where:<12} step {job['step']}/{job['steps']} "
            f"{loss} peak {format_size(job['peak_memory_bytes'])}")
    return text + (f"  {job['error']}" if job["error"] else "")


def register(group: click.Group) -> None:
    """Add the `train` group."""

    @group.group("train")
    def train_group() -> None:
        """Train LoRA adapters on the fleet's nodes from question/answer pairs (docs/training.md)."""

    @train_group.command("submit")
    @click.option("--model", required=True, help="The catalog model the adapter is for.")
    @click.option("--base", default=None, help="The base weights (Hugging Face format: config.json, *.safetensors, "
                  "tokenizer): a directory on the node, or a Hub directory hf://org/repo@<40-hex revision>/[dir/] the "
                  "node fetches.")
    @click.option("--base-file", "base_files", nargs=2, multiple=True, metavar="SOURCE SHA256",
                  help="A file of the base weights the node fetches (repeat for each; hf://, https:// or file://).")
    @click.option("--base-from-model", is_flag=True, help="The node fetches the catalog model's own weights "
                  "(safetensors) as the base.")
    @click.option("--pairs", "pairs_file", required=True, type=click.Path(exists=True, dir_okay=False),
                  help="Question/answer pairs, JSONL: {\"question\": ..., \"answer\": ...} a line.")
    @click.option("--node", default="", help="Train on this node only.")
    @click.option("--node-class", default="", help="Train on a node of this class (its label `class`, or a GPU "
                  "class).")
    @click.option("--memory", default="2Gi", show_default=True, help="Memory the job needs free on the node.")
    @click.option("--job", "job_id", default="", help="The job's id [default: train-<8 hex>].")
    @click.option("--adapter", default="", help="The adapter's name [default: the job id].")
    @click.option("--rank", type=int, default=None, help="LoRA rank [default: 8].")
    @click.option("--alpha", type=float, default=None, help="LoRA alpha [default: 16].")
    @click.option("--steps", type=int, default=None, help="Optimizer steps [default: 60].")
    @click.option("--batch-size", type=int, default=None, help="Pairs per step [default: 4].")
    @click.option("--learning-rate", type=float, default=None, help="AdamW's learning rate [default: 2e-4].")
    @click.option("--max-length", type=int, default=None, help="Tokens of one pair at most [default: 256].")
    @click.option("--seed", type=int, default=None, help="Seed [default: 0].")
    @click.option("--dropout", type=float, default=None, help="LoRA dropout [default: 0].")
    @click.option("--targets", default=None, help="Comma-separated projections to adapt [default: q_proj,v_proj].")
    @click.option("--wait", is_flag=True, help="Follow the job until it ends, one line per change.")
    @_client_options
    def submit_command(client, as_json, model, base, base_files, base_from_model, pairs_file, node, node_class,
                       memory, job_id, adapter, targets, wait, **hyper_values) -> None:
        """Queue a training job; it starts once a node has room and nothing else trains there."""
        hyper = {k: v for k, v in hyper_values.items() if v is not None}
        if targets:
            hyper["targets"] = [t.strip() for t in targets.split(",") if t.strip()]
        if sum((base is not None, bool(base_files), base_from_model)) != 1:
            raise UsageError("give the base weights once: --base, --base-file (repeated) or --base-from-model")
        bases = ({"base": base} if base is not None else {"base_weights": "model"} if base_from_model
                 else {"base_weights": [{"source": s, "sha256": d} for s, d in base_files]})
        body = {"model": model, **bases, "pairs": Path(pairs_file).read_text(), "node": node,
                "node_class": node_class, "memory": memory, "hyper": hyper, "adapter": adapter, "job": job_id}
        job = client.post("/api/v1/training", body)
        if as_json and not wait:
            _print_json(job)
            return
        click.echo(_line(job))
        if wait:
            job = _follow(client, job)
            if as_json:
                _print_json(job)

    @train_group.command("list")
    @_client_options
    def list_command(client, as_json) -> None:
        """The training jobs this control plane knows, in the order submitted."""
        jobs = client.get("/api/v1/training")
        if as_json:
            _print_json(jobs)
            return
        for job in jobs["jobs"]:
            click.echo(_line(job))

    @train_group.command("show")
    @click.argument("job_id")
    @click.option("--wait", is_flag=True, help="Follow the job until it ends.")
    @_client_options
    def show_command(client, as_json, job_id, wait) -> None:
        """One job: state, node, step, loss (every step's), peak memory, why it waits or failed."""
        job = client.get(f"/api/v1/training/{job_id}")
        if wait:
            job = _follow(client, job)
        if as_json:
            _print_json(job)
            return
        click.echo(_line(job))
        if job["losses"]:
            click.echo("losses: " + " ".join(f"{x:.3f}" for x in job["losses"]))

    @train_group.command("cancel")
    @click.argument("job_id")
    @_client_options
    def cancel_command(client, as_json, job_id) -> None:
        """Cancel a job: its node stops training it."""
        job = client.post(f"/api/v1/training/{job_id}/cancel")
        _print_json(job) if as_json else click.echo(_line(job))

    @train_group.command("get")
    @click.argument("job_id")
    @click.option("-o", "--output", type=click.Path(), default=None,
                  help="Where to write the adapter [default: ./<adapter name>.gguf for llama.cpp, else the "
                  "directory ./<adapter name>/ with PEFT's adapter_config.json and adapter_model.safetensors].")
    @click.option("--add-to-catalog", "add", is_flag=True, help="Also add it to the job's model as an adapter "
                  "named as the job says (a settings commit as you; its source is the file written, file://).")
    @_with_author
    @_client_options
    def get_command(client, as_json, job_id, output, add, author_name, author_email, preview) -> None:
        """Download a finished job's adapter (checked against its sha256)."""
        job = client.get(f"/api/v1/training/{job_id}")
        doc = client.get(f"/api/v1/training/{job_id}/adapter")
        data = base64.b64decode(doc["data_base64"])
        if hashlib.sha256(data).hexdigest() != doc["sha256"]:
            raise UsageError(f"the adapter of {job_id} arrived damaged (sha256 differs); run the command again")
        if doc["name"].endswith(".tar"):
            files = _unpack_peft(data, Path(output or job["adapter_name"]).resolve())
        else:
            path = Path(output or f"{job['adapter_name']}{Path(doc['name']).suffix}").resolve()
            path.write_bytes(data)
            files = [path]
        weights = []
        for path in files:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            weights.append({"source": f"file://{path}", "sha256": digest})
            click.echo(f"{path}: {format_size(path.stat().st_size)}, sha256 {digest}")
        if add:
            _post(client, as_json, f"/api/v1/models/{job['model']}/adapters",
                  {"action": "add", "name": job["adapter_name"], "weights": weights},
                  author_name, author_email, preview, f"{job['model']}: adapter {job['adapter_name']} added")


def _unpack_peft(data: bytes, directory: Path) -> list[Path]:
    """PEFT's two files from the tar the agent sent, written into `directory`; their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            try:
                member = tar.extractfile(name)
            except KeyError:
                member = None
            if member is None:
                raise UsageError(f"the adapter sent holds no {name}; train it again")
            (directory / name).write_bytes(member.read())
            out.append(directory / name)
    return out


def _follow(client, job: dict) -> dict:
    """Poll the job until it ends, echoing a line whenever it changed; return its last status."""
    last = _line(job)
    while job["state"] not in ("done", "failed", "cancelled"):
        time.sleep(1.0)
        job = client.get(f"/api/v1/training/{job['job']}")
        if _line(job) != last:
            last = _line(job)
            click.echo(last)
    return job
