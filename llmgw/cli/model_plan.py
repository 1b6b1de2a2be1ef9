"""`llmgw model plan SOURCE`: the model explorer. What a model is (size, architecture, quantisations) from its
files' headers only (`llmgw.agent.model_metadata`: HTTP Range reads, no weights fetched), and where it would fit in
the fleet (`llmgw.plan.plan_model`): per GPU class, fits or not and the tensor parallel it needs; per CPU node,
fits or not and the expected decode tokens/s; the engines that can run it. The fleet is the live one (the admin
API's GET /api/v1/fleet) or a snapshot file (`--fleet`, from `llmgw fleet snapshot`). docs/capacity.md.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import click
import trio

from llmgw.agent.model_metadata import check_source, read_source
from llmgw.errors import UsageError, WeightsError
from llmgw.plan.model_fit import ModelFit
from llmgw.units import format_size


def render_fit(fit: ModelFit) -> str:
    """The explorer's answer as text: the model, then a line per GPU class and per CPU node."""
    facts = fit.facts
    quant = ", ".join(f"{q.type} {q.tensors} tensor(s) {format_size(q.bytes)}" for q in facts.quantisations[:6])
    lines = [f"{facts.source}",
             f"  {facts.format}, architecture {facts.architecture or 'unknown'}"
             + (f", {facts.file_type}" if facts.file_type else "")
             + f", {facts.parameters / 1e9:.2f}B parameters, {format_size(facts.weight_bytes)} of weights"
             + (f" in {facts.files} files" if facts.files > 1 else ""),
             f"  tensors: {quant}",
             f"  needs {format_size(fit.needed_bytes)}: the weights and the KV cache of {fit.context} tokens"
             + ("" if facts.kv_bytes_per_token() else " (the metadata gives no KV cache size)"),
             f"  read {format_size(facts.header_bytes)} of headers, no weights", ""]
    if fit.classes:
        lines.append(f"{'GPU class':<28} {'nodes':>5} {'card':>10} {'TP':>3}  {'fits':<4}  engines / why")
        for c in fit.classes:
            lines.append(f"{c.gpu_class:<28} {c.nodes:>5} {format_size(c.card_bytes):>10} "
                         f"{c.tensor_parallel or '-':>3}  {'yes' if c.fits else 'no':<4}  "
                         f"{', '.join(c.engines) or '-'}: {c.why}")
    else:
        lines.append("no GPU in the fleet")
    lines.append("")
    if fit.cpu_nodes:
        lines.append(f"{'CPU node':<28} {'memory':>10} {'threads':>7} {'tokens/s':>8}  {'fits':<4}  engines / why")
        for n in fit.cpu_nodes:
            speed = f"{n.decode_tokens_per_second:.1f}" if n.decode_tokens_per_second is not None else "-"
            lines.append(f"{n.node_id:<28} {format_size(n.memory_bytes):>10} {n.threads:>7} {speed:>8}  "
                         f"{'yes' if n.fits else 'no':<4}  {', '.join(n.engines) or '-'}: {n.why}")
    else:
        lines.append("no CPU node in the fleet")
    return "\n".join(lines)


@click.command("plan")
@click.argument("source")
@click.option("--fleet", "fleet_file", type=click.Path(path_type=Path), default=None,
              help="A fleet snapshot (JSON, from `llmgw fleet snapshot`) instead of the live fleet.")
@click.option("--admin", "url", default=None, help="Admin API to read the live fleet from "
              "[default: $LLMGW_ADMIN_URL or <state>/admin-url].")
@click.option("--token", default=None, help="Token for --admin [default: $LLMGW_ADMIN_TOKEN or <state>/admin-token].")
@click.option("--state", "state_dir", type=click.Path(path_type=Path), default=None,
              help="State directory of a local `llmgw up` / `llmgw server` [default: $LLMGW_STATE or .state].")
@click.option("--hf-endpoint", default=None, help="The Hub [default: $HF_ENDPOINT or https://huggingface.co].")
@click.option("--hf-token-file", type=click.Path(path_type=Path), default=None,
              help="A file holding a Hub token, for a gated model [default: $HF_TOKEN].")
@click.option("--context", type=click.IntRange(1), default=None,
              help="Tokens of KV cache to count [default: 8192, at most the model's context].")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
def plan_command(source: str, fleet_file: Path | None, url: str | None, token: str | None, state_dir: Path | None,
                 hf_endpoint: str | None, hf_token_file: Path | None, context: int | None, as_json: bool) -> None:
    """Where SOURCE would fit, read from its metadata only: hf://org/repo@revision/file.gguf, an https:// GGUF,
    or hf://org/repo@revision/ (a repository of safetensors and config.json)."""
    from llmgw.cli.review_cmds import _fleet
    from llmgw.plan.model_fit import plan_model

    hub_token = os.environ.get("HF_TOKEN") or None
    if hf_token_file is not None:
        try:
            hub_token = hf_token_file.read_text().strip() or None
        except OSError as exc:
            raise UsageError(f"cannot read the Hub token file {hf_token_file}: {exc.strerror}") from exc
    try:
        check_source(source)  # a source written wrong is named before the fleet is asked for
    except WeightsError as exc:
        raise UsageError(f"{exc}") from exc
    snapshot, _ = _fleet(fleet_file, url, token, state_dir)
    try:
        facts = trio.run(partial(read_source, source, token=hub_token, endpoint=hf_endpoint))
    except WeightsError as exc:
        raise UsageError(f"{exc}") from exc
    fit = plan_model(facts, snapshot.fleet, context)
    click.echo(json.dumps(fit.to_json(), indent=2) if as_json else render_fit(fit))
