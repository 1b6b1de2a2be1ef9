"""`/v1/files`: upload, list, retrieve, read and delete the files of a project (batch input and batch output).

    POST   /v1/files                 multipart/form-data: `file` (the bytes), `purpose` ("batch"); -> File object
    GET    /v1/files                 ?purpose=&limit=&order=asc|desc&after=   -> list of File objects
    GET    /v1/files/{id}            -> File object
    GET    /v1/files/{id}/content    -> the bytes
    DELETE /v1/files/{id}            -> {"id", "object": "file", "deleted": true}

Shapes from OpenAI's published API description (openai/openai-openapi: `OpenAIFile`, `ListFilesResponse`,
`DeleteFileResponse`). A file belongs to the project of the API key that uploaded it (or of the batch that wrote it):
another project's file is "not found". Files are kept in the store in chunks (`llmgw.store.files`), so every control
plane and gateway process sharing the store serves them, until `store.files_retention` (the table's
`files_retention_seconds`, default 30 days) has passed; expired files are purged every PURGE_INTERVAL seconds.

Limits of our own, stated: an upload is at most the table's `max_file_bytes` (llmgw.yaml `limits.max_file_size`,
default 100 MiB): a bigger one is a 413 (refused from its Content-Length before any of it is read). Clients upload
only purpose "batch" (JSON lines, checked when a batch is made of it); "batch_output" files are written by batches.
The bytes are prompts and answers: nothing here writes them to a log.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from urllib.parse import parse_qs

import trio

from llmgw.errors import LlmgwError
from llmgw.gateway.admission import project_of
from llmgw.gateway.asgi import read_body, send_bytes, send_json
from llmgw.gateway.problems import ApiError, bad_request
from llmgw.gateway.request_ids import RequestIds
from llmgw.store import FileRecord

log = logging.getLogger("llmgw.gateway")
PREFIX = "/v1/files"
PURGE_INTERVAL = 3600.0
"""Seconds between two purges of expired files and batches by one gateway process."""
UPLOAD_PURPOSES = ("batch",)
MULTIPART_OVERHEAD = 64 * 1024
"""Bytes of a multipart body besides the file (headers of its parts, the purpose): read beyond `max_file_bytes`."""
LIST_LIMIT = 10000


def new_file_id() -> str:
    """A new file id: "file-" + 24 hex digits."""
    return "file-" + secrets.token_hex(12)


def file_object(record: FileRecord) -> dict:
    """The File object of `record` (OpenAI's `OpenAIFile`; `status` "processed": a file here is usable at once)."""
    return {"id": record.id, "object": "file", "bytes": record.bytes, "created_at": int(record.created_at),
            "expires_at": int(record.expires_at), "filename": record.filename, "purpose": record.purpose,
            "status": "processed", "status_details": None}


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"The file is larger than this gateway takes ({limit} bytes, llmgw.yaml "
                         "limits.max_file_size); split it into several files and batches.", "invalid_request_error",
                    "file_too_large")


def parse_multipart(content_type: bytes, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The parts of a multipart/form-data `body`: field name -> (file name or None, bytes). Raises ApiError 400 when
    the content type is not multipart/form-data with a boundary, or the body is not well formed.
    Format: RFC 7578 (the boundary, each part's Content-Disposition with `name` and `filename`)."""
    kind, _, params = content_type.decode("latin-1").partition(";")
    boundary = re.search(r'boundary="?([^";]+)"?', params)
    if kind.strip().lower() != "multipart/form-data" or boundary is None:
        raise bad_request("Upload a file as multipart/form-data with the fields `file` and `purpose`.",
                          "invalid_content_type")
    delimiter = b"--" + boundary.group(1).encode("latin-1")
    parts: dict[str, tuple[str | None, bytes]] = {}
    for chunk in body.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break
        head, separator, content = chunk.partition(b"\r\n\r\n")
        if not separator:
            raise bad_request("The multipart body has a part without headers.", "invalid_multipart")
        disposition = next((line for line in head.decode("utf-8", "replace").split("\r\n")
                            if line.lower().startswith("content-disposition:")), "")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', disposition))
        if "name" in fields:
            parts[fields["name"]] = (fields.get("filename"), content[:-2] if content.endswith(b"\r\n") else content)
    return parts


class FilesApi:
    """The `/v1/files` endpoints of one `Gateway` (`gateway`: its admission, accounting and table)."""

    def __init__(self, gateway) -> None:
        self.gateway = gateway

    async def serve(self, scope, receive, send, headers: dict[bytes, bytes], ids: RequestIds) -> None:
        """Answer one request under PREFIX. Raises ApiError for a refusal (answered by the caller)."""
        path, method = scope["path"], scope["method"]
        rest = path[len(PREFIX):].strip("/")
        if rest == "" and method == "POST":
            declared = headers.get(b"content-length")
            limit = self.gateway.table.max_file_bytes
            if declared is not None and declared.isdigit() and int(declared) > limit + MULTIPART_OVERHEAD:
                raise too_large(limit)  # before the key: a client that sends too much is told at once
        key = await self.gateway.admission.authenticate(headers)
        project = project_of(self.gateway.table, key).name
        file_id, _, tail = rest.partition("/")
        if rest == "" and method == "POST":
            answer = await self._upload(receive, headers, project)
        elif rest == "" and method == "GET":
            answer = await self._list(scope.get("query_string", b""), project)
        elif file_id and tail == "" and method == "GET":
            answer = file_object(await self._find(file_id, project))
        elif file_id and tail == "content" and method == "GET":
            data = await self.store_call(self.gateway.accounting.store.file_content, file_id, project, time.time())
            if data is None:
                raise not_found(file_id)
            await send_bytes(send, 200, data, b"application/octet-stream", ids.headers())
            return
        elif file_id and tail == "" and method == "DELETE":
            if not await self.store_call(self.gateway.accounting.store.delete_file, file_id, project):
                raise not_found(file_id)
            answer = {"id": file_id, "object": "file", "deleted": True}
        else:
            raise ApiError(404, f"There is no {method} {path} here.", "invalid_request_error", "unknown_url")
        await send_json(send, 200, answer, ids.headers())

    async def store_call(self, function, *args):
        """A store call in a worker thread; a store failure is a 503 (`guarded_call`)."""
        return await guarded_call(self.gateway.accounting, "files", function, *args)

    async def _find(self, file_id: str, project: str) -> FileRecord:
        record = await self.store_call(self.gateway.accounting.store.file_record, file_id, project, time.time())
        if record is None:
            raise not_found(file_id)
        return record

    async def _upload(self, receive, headers: dict[bytes, bytes], project: str) -> dict:
        table = self.gateway.table
        limit = table.max_file_bytes
        try:
            raw = await read_body(receive, headers, limit + MULTIPART_OVERHEAD,
                                  grace_seconds=self.gateway.admission.body_grace_seconds,
                                  min_bytes_per_second=self.gateway.admission.body_min_bytes_per_second)
        except ApiError as error:
            if error.code == "request_too_large":
                raise too_large(limit) from None
            raise
        parts = parse_multipart(headers.get(b"content-type", b""), raw)
        purpose = parts.get("purpose", (None, b""))[1].decode("utf-8", "replace").strip()
        if purpose not in UPLOAD_PURPOSES:
            raise bad_request(f"The purpose {purpose!r} is not one this gateway takes; upload with purpose 'batch' "
                              "(batch_output files are written by batches).", "invalid_purpose", "purpose")
        if "file" not in parts:
            raise bad_request("The upload has no `file` field.", "missing_file", "file")
        filename, data = parts["file"]
        if len(data) > limit:
            raise too_large(limit)
        now = time.time()
        record = FileRecord(new_file_id(), project, purpose, filename or "upload.jsonl", len(data), now,
                            now + table.files_retention_seconds)
        await self.store_call(self.gateway.accounting.store.save_file, record, data)
        return file_object(record)

    async def _list(self, query: bytes, project: str) -> dict:
        args = {name: values[-1] for name, values in parse_qs(query.decode("latin-1")).items()}
        try:
            limit = min(max(int(args.get("limit", LIST_LIMIT)), 1), LIST_LIMIT)
        except ValueError:
            raise bad_request("`limit` must be an integer.", "invalid_limit", "limit") from None
        order = args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise bad_request("`order` must be 'asc' or 'desc'.", "invalid_order", "order")
        records = await self.store_call(self.gateway.accounting.store.list_files, project, args.get("purpose"),
                                        args.get("after"), limit + 1, order == "desc", time.time())
        data = [file_object(r) for r in records[:limit]]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": len(records) > limit}

    async def purge_expired_periodically(self, interval: float = PURGE_INTERVAL) -> None:
        """Delete expired files and batches now and every `interval` seconds, until cancelled; a store failure is
        logged and tried again at the next interval."""
        store = self.gateway.accounting.store
        while True:
            try:
                files = await self.gateway.accounting.boundary.call(store.purge_files, None, time.time())
                batches = await self.gateway.accounting.boundary.call(store.purge_batches, None, time.time())
                if files or batches:
                    log.info("files: purged %d expired files and %d expired batches", files, batches)
            except LlmgwError as error:
                log.warning("files: the purge of expired files failed: %s", error)
            await trio.sleep(interval)


async def guarded_call(accounting, what: str, function, *args):
    """`function(*args)`, a store call, in a worker thread (`accounting.boundary`); a store failure is logged (its
    kind only: nothing of the request) and raised as ApiError 503 with Retry-After, naming `what` is stored there."""
    try:
        return await accounting.boundary.call(function, *args)
    except LlmgwError as error:
        log.warning("%s: the store failed: %s", what, type(error).__name__)
        raise ApiError(503, f"The store of {what} cannot be reached now; try again.", "server_error",
                       "store_unavailable", headers=[(b"retry-after", b"5")]) from error


def not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No file found with id '{file_id}'.", "invalid_request_error", "not_found")
