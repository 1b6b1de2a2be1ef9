"""The pure half of `/v1/batches`: reading a batch's input lines, writing its output and error lines, the Batch
object, and how many of a replica's slots a batch may take now.

Shapes from OpenAI's published API description (openai/openai-openapi: `Batch`, `BatchRequestCounts`,
`BatchError`, and the request input and output lines of the Batch guide): an input line is
`{"custom_id": "...", "method": "POST", "url": "<the batch's endpoint>", "body": {...}}`; an output line
`{"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...", "body": {...}},
"error": null}`; a request the engine or the gateway refused is the same with its status and error body, in the
error file; a line that is not a request at all (not JSON, no custom_id, another url, a custom_id seen before) is an
error line `{"id", "custom_id", "response": null, "error": {"code", "message"}}` in the error file, and the batch
runs the other lines (OpenAI fails the whole batch at validation instead: here one bad line costs only itself).

Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Iterable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from llmgw.identity import Quota
from llmgw.routes import ModelRoute, ProjectPolicy, ReplicaRoute, RouteTable
from llmgw.store import BatchLine, BatchRecord

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
COMPLETION_WINDOW = "24h"
WINDOW_SECONDS = 86400.0
MAX_LINES = 50000
"""The most requests in one batch (OpenAI's limit too)."""
TIMESTAMPS = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
              "cancelled_at")


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(16)


def line_once_key(batch_id: str, line: int) -> str:
    """The engine relay's once key of line `line` of batch `batch_id` (`llmgw.engines.relay_once`): "line_" + 32 hex
    digits, the same on every try of the line, whichever control plane sends it. Pure."""
    return "line_" + hashlib.sha256(f"{batch_id}/{line}".encode()).hexdigest()[:32]


def _line_id() -> str:
    return "batch_req_" + secrets.token_hex(16)


def error_line(custom_id: str | None, code: str, message: str) -> str:
    """An error line of a request that never ran (malformed, expired, cancelled), compact JSON."""
    return json.dumps({"id": _line_id(), "custom_id": custom_id, "response": None,
                       "error": {"code": code, "message": message}}, separators=(",", ":"))


def result_line(custom_id: str | None, request_id: str, status: int, body: Any) -> str:
    """The output (2xx) or error line of a request that was answered with `status` and `body` (JSON, or the text of
    an answer that was not JSON), compact JSON."""
    return json.dumps({"id": _line_id(), "custom_id": custom_id,
                       "response": {"status_code": status, "request_id": request_id, "body": body},
                       "error": None}, separators=(",", ":"))


def read_lines(data: bytes, endpoint: str) -> list[BatchLine]:
    """The input file `data` as one BatchLine per non-blank line, numbered from 0 in order. A line that is not a
    request for `endpoint` is failed at once with its error line (`error_line`: codes invalid_json_line,
    missing_custom_id, duplicate_custom_id, invalid_method, invalid_url, invalid_body); the others are pending with
    the line's text. Raises ValueError (a sentence) when the file is not UTF-8, has no line, or more than MAX_LINES."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"The input file is not UTF-8 text (byte {exc.start}); write it as JSON lines.") from None
    rows = [row for row in text.splitlines() if row.strip()]
    if not rows:
        raise ValueError("The input file has no request lines.")
    if len(rows) > MAX_LINES:
        raise ValueError(f"The input file has {len(rows)} lines; a batch takes at most {MAX_LINES}.")
    seen: set[str] = set()
    lines = []
    for number, row in enumerate(rows):
        custom_id, problem = None, None
        try:
            request = json.loads(row)
        except ValueError:
            request, problem = None, ("invalid_json_line", f"Line {number + 1} is not JSON.")
        if isinstance(request, dict):
            custom_id = request.get("custom_id") if isinstance(request.get("custom_id"), str) else None
            problem = _problem(request, custom_id, endpoint, seen, number + 1)
        elif problem is None:
            problem = ("invalid_json_line", f"Line {number + 1} is not a JSON object.")
        if problem is None and custom_id is not None:
            seen.add(custom_id)
            lines.append(BatchLine(number, custom_id, row))
        else:
            code, message = problem or ("invalid_json_line", f"Line {number + 1} is not a request.")
            lines.append(BatchLine(number, custom_id, row, "failed", error_line(custom_id, code, message)))
    return lines


def _problem(request: dict, custom_id: str | None, endpoint: str, seen: set[str],
             number: int) -> tuple[str, str] | None:
    if not custom_id:
        return "missing_custom_id", f"Line {number} has no custom_id (a string)."
    if custom_id in seen:
        return "duplicate_custom_id", f"Line {number} repeats the custom_id {custom_id!r}."
    if request.get("method") != "POST":
        return "invalid_method", f"Line {number}: method must be POST."
    if request.get("url") != endpoint:
        return "invalid_url", f"Line {number}: url must be the batch's endpoint {endpoint}."
    if not isinstance(request.get("body"), dict):
        return "invalid_body", f"Line {number}: body must be a JSON object."
    return None


def batch_object(record: BatchRecord) -> dict[str, Any]:
    """The Batch object of `record` (every timestamp present, null until it happened)."""
    counts = record.counts
    body = record.body
    return {"id": record.id, "object": "batch", "endpoint": body.get("endpoint"), "model": body.get("model"),
            "errors": body.get("errors"), "input_file_id": body.get("input_file_id"),
            "completion_window": body.get("completion_window", COMPLETION_WINDOW), "status": record.status,
            "output_file_id": body.get("output_file_id"), "error_file_id": body.get("error_file_id"),
            "created_at": int(record.created_at), "expires_at": body.get("expires_at"),
            **{name: body.get(name) for name in TIMESTAMPS},
            "request_counts": {"total": counts.total, "completed": counts.completed, "failed": counts.failed},
            "usage": body.get("usage"), "metadata": body.get("metadata")}


def usage_of(results: Iterable[BatchLine]) -> dict[str, Any]:
    """The batch's `usage` summed over the answered lines' own `usage` (chat, completions and embeddings name
    prompt/completion tokens, responses input/output tokens)."""
    prompt = completion = cached = 0
    for line in results:
        response = json.loads(line.result or "{}").get("response") or {}
        usage = (response.get("body") or {}).get("usage") if isinstance(response.get("body"), dict) else None
        if not isinstance(usage, dict):
            continue
        prompt += int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
        completion += int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0)
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        cached += int(details.get("cached_tokens", 0) or 0) if isinstance(details, dict) else 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}


def batch_room(slots: int, in_flight: int, batch_in_flight: int, share: float, waiting: int = 0) -> int:
    """How many more batch requests a replica may take now.

    `slots`: requests the replica runs at once (0: unknown, taken as 1). `in_flight`: requests in flight to it through
    the gateway, batch ones included; `batch_in_flight`: the batch ones among them. `share`: the share of the slots
    batches may take (at least one slot when above 0). `waiting`: requests its engine says are queued.
    None while interactive requests queue (the engine's queue, or interactive requests filling every slot); else
    up to the share, and never past the free slots. Pure.
    """
    slots = max(slots, 1)
    interactive = in_flight - batch_in_flight
    if share <= 0 or waiting > 0 or interactive >= slots:
        return 0
    cap = max(1, math.floor(share * slots + 1e-9))
    return max(0, min(cap - batch_in_flight, slots - in_flight))


def batch_table(table: RouteTable, route: ModelRoute, replica: ReplicaRoute, project: ProjectPolicy) -> RouteTable:
    """The table one batch line runs under: `route` with `replica` alone and its batch prices (where the catalog
    sets them), and `project` with its daily tokens and budget limits only (a batch does not count toward
    per-minute, concurrency or request limits: scopes left without a limit are dropped). Pure."""
    priced = replace(route, replicas=(replica,), prompt_price_per_million=(
        route.batch_prompt_price_per_million if route.batch_prompt_price_per_million is not None
        else route.prompt_price_per_million), completion_price_per_million=(
        route.batch_completion_price_per_million if route.batch_completion_price_per_million is not None
        else route.completion_price_per_million))
    daily = tuple((scope, Quota(tokens_per_day=limits.tokens_per_day, budget=limits.budget))
                  for scope, limits in project.quotas if limits.tokens_per_day is not None or limits.budget is not None)
    return replace(table, models=MappingProxyType({**table.models, route.name: priced}),
                   projects=MappingProxyType({**table.projects, project.name: replace(project, quotas=daily)}))
