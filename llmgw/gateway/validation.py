"""Checking an OpenAI request body before anything else looks at it: bounded JSON, then OpenAI's own schema.

Two steps, each refusing with a 400 in OpenAI's error shape (`problems.ApiError`, with `param` and `code`):

1. `parse_body(raw)`: JSON with bounds of our own, stated here. NaN, Infinity and -Infinity are refused (the standard
   library would accept them), and so is a decimal that overflows to infinity (`1e999`). Integers lie in
   [INTEGER_MIN, INTEGER_MAX] (signed 64-bit low end, unsigned 64-bit high end: what engines written in C++ and Rust
   can hold). Arrays and objects nest at most MAX_JSON_DEPTH deep. The body is a JSON object.
2. `validate_request(endpoint, body)`: OpenAI's request schema for the endpoint (`CreateChatCompletionRequest`,
   `CreateCompletionRequest`, `CreateEmbeddingRequest`, `CreateResponse`, `TokenCountsBody`, vendored from openai-openapi in `openapi/`), compiled once
   by jsonschema-rs (native: about 1 µs for a typical chat body here, where fastjsonschema took 50 µs and jsonschema
   700 µs; bench/request_validation.py), plus an overlay of our own bounds (`BOUNDS`): model names up to
   MAX_MODEL_NAME_CHARS characters, `max_tokens`/`max_completion_tokens` up to MAX_TOKENS_CAP (and at least 1 for
   chat, as OpenAI answers), `n` up to MAX_CHOICES, `max_output_tokens` up to MAX_TOKENS_CAP, and a `model` on
   /v1/responses (OpenAI's schema leaves it optional for its stored prompts, which the gateway does not serve). One rule OpenAI states only in prose is checked too:
   `stream_options` only with `stream: true`. Fields the schema does not define pass untouched.

Only a refused body is explained in detail (`explaining.explain`, from jsonschema-rs's error tree), so a valid request
pays for the compiled check alone: bench/request_validation.py measures it (µs per request).
"""

from __future__ import annotations

import json
import math
from functools import cache
from importlib import resources

import jsonschema_rs

from llmgw.gateway.explaining import Problem, explain
from llmgw.gateway.problems import ApiError, bad_request

MAX_JSON_DEPTH = 64
INTEGER_MIN = -(2**63)
INTEGER_MAX = 2**64 - 1
MAX_MODEL_NAME_CHARS = 256
MAX_TOKENS_CAP = 1_048_576
MAX_CHOICES = 128

SCHEMA_FILE = "openai-requests.json"
ENDPOINTS = {
    "/v1/chat/completions": "CreateChatCompletionRequest",
    "/v1/completions": "CreateCompletionRequest",
    "/v1/embeddings": "CreateEmbeddingRequest",
    "/v1/responses": "CreateResponse",
    "/v1/responses/input_tokens": "TokenCountsBody",
}
_MODEL = {"model": {"maxLength": MAX_MODEL_NAME_CHARS}}
BOUNDS = {
    "CreateChatCompletionRequest": {"properties": {
        **_MODEL, "max_tokens": {"minimum": 1, "maximum": MAX_TOKENS_CAP},
        "max_completion_tokens": {"minimum": 1, "maximum": MAX_TOKENS_CAP}, "n": {"maximum": MAX_CHOICES}}},
    "CreateCompletionRequest": {"properties": {
        **_MODEL, "max_tokens": {"maximum": MAX_TOKENS_CAP}, "n": {"maximum": MAX_CHOICES}}},
    "CreateEmbeddingRequest": {"properties": {**_MODEL}},
    "CreateResponse": {"required": ["model"], "properties": {
        **_MODEL, "max_output_tokens": {"maximum": MAX_TOKENS_CAP}}},
    "TokenCountsBody": {"required": ["model"], "properties": {**_MODEL}},
}


class _Refused(ValueError):
    """A JSON value outside our bounds, found while parsing (carries the ApiError to answer)."""

    def __init__(self, error: ApiError):
        super().__init__(error.message)
        self.error = error


def _refuse_constant(name: str):
    raise _Refused(bad_request(f"The request body contains {name}, which JSON does not allow; send a finite number.",
                               "invalid_number"))


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(bad_request(f"The number {text[:40]} is too large; send a finite number.", "invalid_number"))
    return value


def _bounded_int(text: str) -> int:
    value = int(text)
    if not INTEGER_MIN <= value <= INTEGER_MAX:
        raise _Refused(bad_request(f"The integer {text[:40]}{'...' if len(text) > 40 else ''} is out of range; "
                                   f"integers here lie between {INTEGER_MIN} and {INTEGER_MAX}.", "invalid_number"))
    return value


# one decoder for every request: json.loads(raw, parse_...=...) builds a JSONDecoder and its C scanner per call, which
# cost more than parsing a typical body (bench/request_validation.py). Decoding the bytes as json.loads does.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)


def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object within the module's bounds.

    Raises ApiError 400: `invalid_json` (not JSON, not an object), `invalid_number` (NaN, Infinity, overflowing
    decimals, integers out of range), `json_too_deep` (nesting past MAX_JSON_DEPTH).
    """
    try:
        if isinstance(raw, (bytes, bytearray)):  # as json.loads decodes bytes
            value = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
        else:
            value = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float,
                               parse_int=_bounded_int)
    except _Refused as refused:
        raise refused.error from None
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"The request body is not valid JSON ({exc}); send a JSON object.", "invalid_json") from exc
    if type(value) is not dict:
        raise bad_request("The request body must be a JSON object.", "invalid_json")
    if _deeper_than(value, MAX_JSON_DEPTH):
        raise _too_deep()
    return value


def _too_deep() -> ApiError:
    return bad_request(f"The request body nests arrays and objects more than {MAX_JSON_DEPTH} deep, the most this "
                       "gateway takes.", "json_too_deep")


def _deeper_than(value, limit: int) -> bool:
    """Whether arrays and objects in `value` nest more than `limit` deep (the top object is depth 1)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in (node.values() if type(node) is dict else node):
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
    return False


@cache
def _document() -> dict:
    return json.loads(resources.files("llmgw.gateway.openapi").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


@cache
def request_schema(name: str) -> dict:
    """The draft-07 schema checked for one request type: OpenAI's (`name`, e.g. "CreateChatCompletionRequest") and
    our BOUNDS, with OpenAI's definitions. Source commit and licence: the vendored document's `source`."""
    document = _document()
    return {"$schema": document["$schema"], "definitions": document["definitions"],
            "allOf": [{"$ref": f"#/definitions/{name}"}, BOUNDS[name]]}


@cache
def _compiled(name: str) -> jsonschema_rs.Draft7Validator:
    return jsonschema_rs.Draft7Validator(request_schema(name))


def source() -> dict:
    """Where the vendored schemas come from: repository, commit, file, licence."""
    return dict(_document()["source"])


def validate_request(endpoint: str, body: dict) -> None:
    """Check `body` (from `parse_body`) against OpenAI's schema for `endpoint` (a key of ENDPOINTS) and our bounds.

    Returns None when valid. Raises ApiError 400 shaped as OpenAI answers (`param` as `messages[0].role`, `code` as
    `invalid_type`, `missing_required_parameter`, `empty_array`, `invalid_value`, `integer_above_max_value`, ...).
    """
    name = ENDPOINTS[endpoint]
    if not _compiled(name).is_valid(body):
        problem = explain(_compiled(name), request_schema(name), body) or Problem(
            None, "invalid_value", "The request body does not match OpenAI's schema for this endpoint.")
        raise bad_request(problem.message, problem.code, problem.param)
    if body.get("stream_options") is not None and body.get("stream") is not True and name != "CreateEmbeddingRequest":
        # OpenAI's own answer (code null), captured in BerriAI/litellm#5803
        raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.", None,
                          "stream_options")
