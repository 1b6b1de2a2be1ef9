"""`/v1/batches`: create, retrieve, list and cancel the batches of a project (`batch_runner` runs them).

    POST /v1/batches                  {"input_file_id", "endpoint", "completion_window": "24h", "metadata"}
    GET  /v1/batches                  ?after=&limit=         -> list of Batch objects, newest first
    GET  /v1/batches/{id}             -> Batch object
    POST /v1/batches/{id}/cancel      -> Batch object ("cancelling", then "cancelled" once its running lines end)

Shapes and statuses from OpenAI's published API description (openai/openai-openapi: `CreateBatchRequest`, `Batch`,
`ListBatchesResponse`). Endpoints: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses. A batch is
read from its input file when it is made (`batch_lines.read_lines`: a malformed line is an error line at once, the
batch runs the others) and kept in the store (`llmgw.store.batches`) with one row per line, so that any control plane
sharing the store answers for it and the one that runs it can be replaced. A batch, like a file, belongs to the
project of the API key that made it and is kept for `store.files_retention`. Made "in_progress" at once (nothing to
validate later); "failed" when the file has no line, is not UTF-8, or has more than `batch_lines.MAX_LINES` lines.
"""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qs

import trio

from llmgw.gateway.admission import project_of
from llmgw.gateway.asgi import send_json
from llmgw.gateway.batch_lines import (
    COMPLETION_WINDOW, ENDPOINTS, WINDOW_SECONDS, batch_object, new_batch_id, read_lines,
)
from llmgw.gateway.problems import ApiError, bad_request
from llmgw.gateway.request_context import Caller
from llmgw.gateway.request_ids import RequestIds
from llmgw.gateway.validation import parse_body
from llmgw.store import BatchRecord

PREFIX = "/v1/batches"
LIST_LIMIT = 100
METADATA_KEYS = 16


class BatchesApi:
    """The `/v1/batches` endpoints of one `Gateway` (`gateway`: its admission, accounting, table and files).
    `changed` is set (and replaced) whenever a batch is made or cancelled here: a runner in this process waits on it."""

    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self.changed = trio.Event()

    def _news(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def serve(self, scope, receive, send, headers: dict[bytes, bytes], ids: RequestIds) -> None:
        """Answer one request under PREFIX. Raises ApiError for a refusal (answered by the caller)."""
        path, method = scope["path"], scope["method"]
        key = await self.gateway.admission.authenticate(headers)
        policy = project_of(self.gateway.table, key)
        project = policy.name
        rest = path[len(PREFIX):].strip("/")
        batch_id, _, tail = rest.partition("/")
        if rest == "" and method == "POST":
            caller = Caller(key, policy, ids, None, time.perf_counter())
            raw = await self.gateway.admission.receive_body(caller, self.gateway.table, receive, headers)
            answer = await self._create(parse_body(raw), project, key.key_id)
        elif rest == "" and method == "GET":
            answer = await self._list(scope.get("query_string", b""), project)
        elif batch_id and tail == "" and method == "GET":
            answer = batch_object(await self._find(batch_id, project))
        elif batch_id and tail == "cancel" and method == "POST":
            answer = batch_object(await self._cancel(batch_id, project))
        else:
            raise ApiError(404, f"There is no {method} {path} here.", "invalid_request_error", "unknown_url")
        await send_json(send, 200, answer, ids.headers())

    async def _find(self, batch_id: str, project: str) -> BatchRecord:
        record = await self.gateway.files.store_call(self.gateway.accounting.store.batch, batch_id, project,
                                                     time.time())
        if record is None:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", "invalid_request_error", "not_found")
        return record

    async def _create(self, body: dict, project: str, key_id: str) -> dict:
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        if not isinstance(file_id, str) or not file_id:
            raise bad_request("Name the input file: `input_file_id` (from POST /v1/files).", "missing_input_file",
                              "input_file_id")
        if endpoint not in ENDPOINTS:
            raise bad_request(f"`endpoint` must be one of {', '.join(ENDPOINTS)}.", "invalid_endpoint", "endpoint")
        if body.get("completion_window") != COMPLETION_WINDOW:
            raise bad_request("`completion_window` must be '24h'.", "invalid_completion_window", "completion_window")
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= METADATA_KEYS
                                         and all(isinstance(v, str) for v in metadata.values())):
            raise bad_request(f"`metadata` must be an object of at most {METADATA_KEYS} string values.",
                              "invalid_metadata", "metadata")
        store = self.gateway.accounting.store
        now = time.time()
        record = await self.gateway.files.store_call(store.file_record, file_id, project, now)
        if record is None or record.purpose != "batch":
            raise bad_request(f"No file with id '{file_id}' and purpose 'batch' in this project; upload one first.",
                              "invalid_input_file", "input_file_id")
        data = await self.gateway.files.store_call(store.file_content, file_id, project, now)
        fields = {"endpoint": endpoint, "input_file_id": file_id, "completion_window": COMPLETION_WINDOW,
                  "expires_at": int(now + WINDOW_SECONDS), "metadata": metadata, "errors": None}
        try:
            lines = read_lines(data or b"", endpoint)
        except ValueError as problem:
            status, lines = "failed", []
            fields.update(failed_at=int(now), errors={"object": "list", "data": [
                {"code": "invalid_input_file", "message": str(problem), "param": "input_file_id", "line": None}]})
        else:
            status = "in_progress"
            fields["in_progress_at"] = int(now)
            fields["model"] = _first_model(lines)
        batch = BatchRecord(new_batch_id(), project, key_id, status, now, now + self.gateway.table.files_retention_seconds,
                            fields)
        await self.gateway.files.store_call(store.create_batch, batch, lines)
        self._news()
        return batch_object(await self._find(batch.id, project))

    async def _cancel(self, batch_id: str, project: str) -> BatchRecord:
        record = await self._find(batch_id, project)
        if record.status in ("validating", "in_progress"):
            body = {**record.body, "cancelling_at": int(time.time())}
            await self.gateway.files.store_call(self.gateway.accounting.store.update_batch, batch_id,
                                                ("validating", "in_progress"), "cancelling", body)
            self._news()
            return await self._find(batch_id, project)
        if record.status in ("cancelling", "cancelled"):
            return record
        raise ApiError(409, f"The batch '{batch_id}' is {record.status}: it cannot be cancelled.",
                       "invalid_request_error", "batch_not_cancellable")

    async def _list(self, query: bytes, project: str) -> dict:
        args = {name: values[-1] for name, values in parse_qs(query.decode("latin-1")).items()}
        try:
            limit = min(max(int(args.get("limit", 20)), 1), LIST_LIMIT)
        except ValueError:
            raise bad_request("`limit` must be an integer.", "invalid_limit", "limit") from None
        records = await self.gateway.files.store_call(self.gateway.accounting.store.list_batches, project,
                                                      args.get("after"), limit + 1, time.time())
        data = [batch_object(r) for r in records[:limit]]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": len(records) > limit}


def _first_model(lines) -> str | None:
    """The `model` of the batch's first well-formed line (the Batch object's `model`), None when none names one."""
    for line in lines:
        if line.state == "pending":
            model = json.loads(line.request)["body"].get("model")
            return model if isinstance(model, str) else None
    return None
