"""A review as Markdown for a pull-request comment (GitHub, GitLab and Gitea flavours all render it). Pure.

The first line is a hidden marker, `<!-- llmgw-review base=<commit> head=<commit> fleet=<revision> -->`: a CI
job finds its earlier comment by the `<!-- llmgw-review` prefix and edits it in place, and anyone can see which
base commit and fleet revision the comment was computed against (and so whether it went stale).
"""

from __future__ import annotations

import re

from llmgw.cli.review_forecast import forecast_markdown
from llmgw.cli.server_cmds import counted
from llmgw.plan.headroom import Headroom
from llmgw.plan.reviewing import Review
from llmgw.units import format_size

MARKER = "<!-- llmgw-review"
_VERBS = {"install": "to install", "start": "to start", "restart": "to restart", "stop": "to stop",
          "move in": "moving in", "move out": "moving out"}
_VERDICT = {"fits": "fits: every replica can be placed", "no change": "no change",
            "does not fit": "does not fit: some replicas cannot be placed"}


def _cell(text: str) -> str:
    """`text` safe inside a table cell: pipes escaped, newlines as spaces."""
    return text.replace("|", "\\|").replace("\n", " ") or " "


def fenced(text: str, info: str = "") -> list[str]:
    """`text` as a fenced code block whose fence is longer than any run of backticks in it (CommonMark: a fence
    closes only on one at least as long), so no text, however written, ends the block early and renders as
    Markdown (a pull request's author writes the settings it quotes)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, text, fence]


def _code(text: str | None) -> str:
    return f"`{text}`" if text else "(a directory)"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _cores(value: float) -> str:
    return f"{value:g}"


def _header(review: Review) -> list[str]:
    lines = [f"{MARKER} base={review.base_commit or '-'} head={review.head_commit or '-'} "
             f"fleet={review.fleet_revision} -->",
             f"## llmgw review: {_VERDICT[review.verdict]}", "",
             f"- **Base** `{review.base_ref}` at {_code((review.base_commit or '')[:12])}, "
             f"**head** `{review.head_ref}` at {_code((review.head_commit or '')[:12])}",
             f"- **Fleet** {review.fleet_source}, taken {review.fleet_taken_at or '(time unknown)'}, "
             f"revision `{review.fleet_revision[:19]}`"
             + (f", running settings {_code(review.fleet_settings_commit[:12])}"
                if review.fleet_settings_commit else ""),
             f"- Exit code {review.exit_code}. Computed against this base commit and this fleet: when either moves, "
             f"run `llmgw review` again (`--check REVIEW.json` says whether a stored review still holds)."]
    if review.head_commit:
        lines.append(f"- Apply what was reviewed: `llmgw apply --expect {review.head_commit}` (refused, naming the "
                     f"commits since, when the settings branch then holds other settings).")
    return lines


def _unplaced(review: Review) -> list[str]:
    if not review.unplaced:
        return []
    lines = ["", f"### Cannot be placed ({len(review.unplaced)})", "", "| replica | node | why not |",
             "| --- | --- | --- |"]
    for item in review.unplaced:
        label = f"`{item.replica_id}`" + ("" if item.new else " (already under base)")
        reasons = item.reasons or (("(no nodes)", "no alive node"),)
        for i, (node, why) in enumerate(reasons):
            lines.append(f"| {label if i == 0 else ''} | {_cell(node)} | {_cell(why)} |")
    return lines


def _nodes(review: Review) -> list[str]:
    changed = [n for n in review.nodes if n.steps]
    lines = ["", "### Plan per node", ""]
    if not changed:
        kept = sum(n.kept for n in review.nodes)
        return lines + [f"No replica starts, stops or moves ({_count(kept, 'shard')} kept as they are)."]
    for node in changed:
        counts = {}
        for step in node.steps:
            counts[step.verb] = counts.get(step.verb, 0) + 1
        summary = ", ".join(f"{n} {_VERBS[verb]}" for verb, n in counts.items())
        lines.append(f"**{node.node_id}** ({summary}; {node.kept} kept)")
        lines.append("")
        for step in node.steps:
            text = f"- {step.verb} `{step.subject}`"
            if step.verb == "move in":
                text += f" from {step.other_node}"
            elif step.verb == "move out":
                text += f" to {step.other_node}"
            if step.where:
                text += f" on {step.where}"
            if step.reason:
                text += f": {step.reason}"
            lines.append(text)
        lines.append("")
    return lines[:-1]


def _headroom(room: Headroom) -> list[str]:
    lines = ["", "### Headroom", "", "| capacity | total | free now | free after | most free on one node, now / after |",
             "| --- | --- | --- | --- | --- |"]
    for g in room.gpus:
        lines.append(f"| GPU {_cell(g.gpu_class)} | {g.devices} | {g.free_before} | {g.free_after} | "
                     f"{g.largest_before} / {g.largest_after} |")
    cpu = room.cpu
    lines.append(f"| CPU cores | {_cores(cpu.cores)} | {_cores(cpu.cores_free_before)} | "
                 f"{_cores(cpu.cores_free_after)} | |")
    lines.append(f"| memory | {format_size(cpu.memory_bytes)} | {format_size(cpu.memory_free_before)} | "
                 f"{format_size(cpu.memory_free_after)} | |")
    return lines


def _settings(review: Review) -> list[str]:
    lines = ["", "### Settings diff", ""]
    if not review.settings_diff:
        return lines + ["The settings of base and head mean the same."]
    return lines + fenced(review.settings_diff.to_text().rstrip("\n"), "diff")


def _projects(review: Review) -> list[str]:
    if not review.projects and not review.gpu_hour_cost:
        return []
    lines = ["", "### Quotas and prices per project", "", "| project | what | before | after |",
             "| --- | --- | --- | --- |"]
    for project in review.projects:
        label = f"`{project.project}`" + ("" if project.action == "changed" else f" ({project.action})")
        rows = [(f"{c.subject}: {c.key}", c.old, c.new) for c in project.quotas]
        rows += [(f"may use {m}", "no", "yes") for m in project.models_added]
        rows += [(f"may use {m}", "yes", "no") for m in project.models_removed]
        rows += [(f"{c.subject}: {c.key}", c.old, c.new) for c in project.prices]
        for i, (what, old, new) in enumerate(rows or [("(nothing else)", "", "")]):
            lines.append(f"| {label if i == 0 else ''} | {_cell(what)} | {_cell(old)} | {_cell(new)} |")
    for change in review.gpu_hour_cost:
        lines.append(f"| (every project) | {_cell(change.subject)}: {_cell(change.key)} | {_cell(change.old)} | "
                     f"{_cell(change.new)} |")
    return lines


def _warnings(review: Review) -> list[str]:
    if not review.warnings:
        return []
    lines = ["", f"### Warnings ({len(review.warnings)})", ""]
    for warning in review.warnings:
        lines.append(f"- {'**new** ' if warning.new else ''}{warning.kind}: {warning.text}")
    return lines


def _drift(review: Review) -> list[str]:
    if not review.base_drift:
        return []
    return ["", "<details><summary>The fleet has not converged to base: without this change the control plane "
            f"would still do {counted(len(review.base_drift), 'thing')}</summary>", "",
            *[f"- {line}" for line in review.base_drift], "", "</details>"]


def _expected_speeds(review: Review) -> list[str]:
    """The decode speed expected of each replica HEAD places on a probed CPU node (nothing when none)."""
    if not review.expected_speeds:
        return []
    lines = ["", "### Expected speed on CPU nodes", "",
             "From the weights' size and the node's memory bandwidth (its agent's probe; docs/capacity.md), for one "
             "request at a time.", "", "| replica | node | threads | weights | read bandwidth | decode |",
             "| --- | --- | --- | --- | --- | --- |"]
    for speed in review.expected_speeds:
        lines.append(f"| `{speed.replica_id}` | {_cell(speed.node_id)} | {speed.threads} | "
                     f"{format_size(speed.weight_bytes)} | {speed.bandwidth_bytes_per_second / 1e9:.1f} GB/s | "
                     f"about {speed.decode_tokens_per_second:.0f} tokens/s |")
    return lines


def review_markdown(review: Review) -> str:
    """The whole review as one Markdown document (ends with a newline): marker, verdict, commits and fleet,
    what cannot be placed, the plan per node, headroom, expected CPU speeds, the forecast, the settings diff, projects,
    warnings, base drift."""
    lines = (_header(review) + _unplaced(review) + _nodes(review) + _headroom(review.headroom)
             + _expected_speeds(review) + forecast_markdown(review) + _settings(review) + _projects(review)
             + _warnings(review) + _drift(review))
    return "\n".join(lines) + "\n"
