"""`POST /v1/rerank` and `/v1/score` for catalog models that rerank (`rerank: true`), after the key and the body
(`dialects.serve_dialect`).

Rerank (Jina/Cohere shape, as llama-server and vLLM serve it): `{"model", "query", "documents": [str, ...],
"top_n"?, "return_documents"?}`; answered `{"model", "results": [{"index", "relevance_score"}, ...], "usage"}`.
Score (vLLM only): `{"model", "text_1", "text_2"}`, each a string or a list of strings; answered with vLLM's
`data` of scores. Bodies are checked against RERANK_SCHEMA / SCORE_SCHEMA (OpenAI-shaped 400s, as every other
llmgw refusal outside the Messages API); unknown fields pass to the engine.

A model whose catalog entry does not say `rerank: true` is refused with a 400 (code `model_cannot_rerank`), and
`/v1/score` on an engine other than vLLM with a 400 naming `/v1/rerank` instead (llama-server has no /v1/score):
both recorded as refusals, after the project's allowlist (a model the project may not use stays a 403).
Admission is chat's, as a request that generates nothing (the embeddings path): model, allowlist, serving
stopped?, a ready replica, the quota reservation of the prompt's bound (query and document of each pair). The
engine's answer is relayed whole (`proxying.relay_whole`: `model` the client's name; usage `prompt_tokens`, or
`total_tokens` where vLLM counts only that, billed as prompt tokens).
"""

from __future__ import annotations

import dataclasses
from functools import cache

import jsonschema_rs

from llmgw.gateway.explaining import Problem, explain
from llmgw.gateway.problems import bad_request
from llmgw.gateway.dialect_request import Incoming
from llmgw.gateway.validation import MAX_MODEL_NAME_CHARS

RERANK_PATH = "/v1/rerank"
SCORE_PATH = "/v1/score"
MAX_DOCUMENTS = 1000
"""Documents (or texts of a score) one request may carry; llmgw's bound, stated."""

_MODEL = {"type": "string", "maxLength": MAX_MODEL_NAME_CHARS}
_TEXTS = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "maxItems": MAX_DOCUMENTS,
                                         "items": {"type": "string"}}]}
RERANK_SCHEMA = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                 "required": ["model", "query", "documents"],
                 "properties": {"model": _MODEL, "query": {"type": "string"},
                                "documents": {"type": "array", "minItems": 1, "maxItems": MAX_DOCUMENTS,
                                              "items": {"type": "string"}},
                                "top_n": {"type": "integer", "minimum": 1},
                                "return_documents": {"type": "boolean"}}}
SCORE_SCHEMA = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                "required": ["model", "text_1", "text_2"],
                "properties": {"model": _MODEL, "text_1": _TEXTS, "text_2": _TEXTS}}


@cache
def _validator(path: str) -> jsonschema_rs.Draft7Validator:
    return jsonschema_rs.Draft7Validator(RERANK_SCHEMA if path == RERANK_PATH else SCORE_SCHEMA)


def check_request(path: str, body: dict) -> None:
    """Check a parsed rerank (`path` RERANK_PATH) or score body. Raises ApiError 400 naming the field."""
    validator = _validator(path)
    if not validator.is_valid(body):
        problem = explain(validator, RERANK_SCHEMA if path == RERANK_PATH else SCORE_SCHEMA, body) or Problem(
            None, "invalid_value", f"The request body does not match {path}'s shape.")
        raise bad_request(problem.message, problem.code, problem.param)


def pair_texts(path: str, body: dict) -> list[str]:
    """The text of each (query, document) pair the engine scores: what the quota reservation counts."""
    if path == RERANK_PATH:
        return [body["query"] + " " + document for document in body["documents"]]
    first, second = ([t] if isinstance(t, str) else t for t in (body["text_1"], body["text_2"]))
    if len(first) == 1:
        return [first[0] + " " + text for text in second]
    return [a + " " + b for a, b in zip(first, second, strict=False)]


def not_served(route, path: str) -> str | None:
    """Why `route` (an `llmgw.routes.ModelRoute`) cannot answer `path`, or None when it can."""
    if not route.rerank:
        return (f"The model '{route.name}' does not rerank (its catalog entry does not say `rerank: true`); "
                "GET /v1/models lists the models, the catalog says which rerank.")
    if path == SCORE_PATH and route.engine != "vllm":
        return (f"The model '{route.name}' runs on {route.engine or 'an external endpoint'}, which serves "
                f"{RERANK_PATH} but not {SCORE_PATH}; send the query and documents to {RERANK_PATH}.")
    return None


async def rerank(gateway, incoming: Incoming, send, receive) -> None:
    """Serve a rerank or score request (module docstring). Raises ApiError for a refusal before the forward."""
    caller, table, path, body, raw = incoming.caller, incoming.table, incoming.path, incoming.body, incoming.raw
    check_request(path, body)
    route = table.resolve(body["model"]) if body["model"] else None
    allowed = route is not None and (caller.project.models is None or route.name in caller.project.models)
    why = not_served(route, path) if allowed else None
    if why is not None:
        await gateway.admission.refused(caller, route.name, 400)
        raise bad_request(why, "model_cannot_rerank", "model")
    view = {"model": body["model"], "input": pair_texts(path, body)}
    admitted = await gateway.admission.admit(caller, table, "/v1/embeddings", view, raw)
    ctx = dataclasses.replace(admitted, path=path, body=body, raw=raw, stream=False, include_usage=False,
                              overrides={})
    await gateway._run(ctx, send, receive)
