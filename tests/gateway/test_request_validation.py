"""OpenAI request validation as pure functions: bounded JSON, OpenAI's schema, OpenAI's error words (issue 19 item 1).

Regression tests for issue 19 defect 3 (request bodies went to the engine unchecked) and the quota part of defect 4.
"""

from __future__ import annotations

import json

import pytest

from llmgw.gateway.limits import CompletionLimit, completion_limit, enforced_fields, limits_tokens
from llmgw.gateway.openapi.update import convert
from llmgw.gateway.problems import ApiError
from llmgw.gateway.validation import (
    INTEGER_MAX,
    INTEGER_MIN,
    MAX_JSON_DEPTH,
    MAX_TOKENS_CAP,
    parse_body,
    source,
    validate_request,
)
from llmgw.routes import ProjectPolicy, Quota

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
USER = [{"role": "user", "content": "hi"}]


def chat(**fields) -> dict:
    return {"model": "gemma", "messages": USER, **fields}


REFUSED = [
    # (endpoint, body, param, code): each class of issue 19 defect 3, as OpenAI answers it
    (CHAT, {"model": "gemma", "messages": []}, "messages", "empty_array"),
    (CHAT, {"model": "gemma"}, "messages", "missing_required_parameter"),
    (CHAT, {"messages": USER}, "model", "missing_required_parameter"),
    (CHAT, chat(messages=[{"content": "no role"}]), "messages[0].role", "missing_required_parameter"),
    (CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role", "invalid_value"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), "messages[0].content", "invalid_type"),
    (CHAT, chat(messages=["hi"]), "messages[0]", "invalid_type"),
    (CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content[0].image_url",
     "missing_required_parameter"),
    (CHAT, chat(max_tokens=40.5), "max_tokens", "invalid_type"),
    (CHAT, chat(max_tokens="40"), "max_tokens", "invalid_type"),
    (CHAT, chat(max_tokens=-3), "max_tokens", "integer_below_min_value"),
    (CHAT, chat(max_tokens=0), "max_tokens", "integer_below_min_value"),
    (CHAT, chat(max_tokens=10**19), "max_tokens", "integer_above_max_value"),
    (CHAT, chat(max_completion_tokens=MAX_TOKENS_CAP + 1), "max_completion_tokens", "integer_above_max_value"),
    (CHAT, chat(n=0), "n", "integer_below_min_value"),
    (CHAT, chat(n=129), "n", "integer_above_max_value"),
    (CHAT, chat(temperature=3), "temperature", "decimal_above_max_value"),
    (CHAT, chat(temperature=-0.5), "temperature", "decimal_below_min_value"),
    (CHAT, chat(top_p="high"), "top_p", "invalid_type"),
    (CHAT, chat(stream_options={"include_usage": True}), "stream_options", None),
    (CHAT, chat(stream=False, stream_options={"include_usage": True}), "stream_options", None),
    (CHAT, chat(tools={"type": "function"}), "tools", "invalid_type"),
    (CHAT, chat(tools=[{"type": "function", "function": {}}]), "tools[0].function.name", "missing_required_parameter"),
    (CHAT, chat(stop=["a", "b", "c", "d", "e"]), "stop", "array_above_max_length"),
    (CHAT, chat(stream="yes"), "stream", "invalid_type"),
    (CHAT, {"model": "m" * 257, "messages": USER}, "model", "string_above_max_length"),
    (CHAT, {"model": 7, "messages": USER}, "model", "invalid_type"),
    (COMPLETIONS, {"model": "gemma"}, "prompt", "missing_required_parameter"),
    (COMPLETIONS, {"model": "gemma", "prompt": "x", "max_tokens": -1}, "max_tokens", "integer_below_min_value"),
    (COMPLETIONS, {"model": "gemma", "prompt": "x", "max_tokens": MAX_TOKENS_CAP + 1}, "max_tokens",
     "integer_above_max_value"),
    (COMPLETIONS, {"model": "gemma", "prompt": "x", "max_tokens": 10**19}, "max_tokens", "integer_above_max_value"),
    (COMPLETIONS, {"model": "gemma", "prompt": "x", "n": 129}, "n", "integer_above_max_value"),
    (COMPLETIONS, {"model": "gemma", "prompt": {"text": "x"}}, "prompt", "invalid_type"),
    (EMBEDDINGS, {"model": "gemma"}, "input", "missing_required_parameter"),
    (EMBEDDINGS, {"model": "gemma", "input": []}, "input", "empty_array"),
    (EMBEDDINGS, {"model": "gemma", "input": 3.5}, "input", "invalid_type"),
]


@pytest.mark.parametrize(("endpoint", "body", "param", "code"), REFUSED)
def test_each_malformed_request_class_is_refused_with_openais_param_and_code(endpoint, body, param, code):
    with pytest.raises(ApiError) as info:
        validate_request(endpoint, body)
    error = info.value
    assert (error.status, error.error_type, error.param, error.code) == (400, "invalid_request_error", param, code)
    assert error.message.endswith(".") and (code in (None, "invalid_value") or param in error.message)


def test_openais_own_words_for_the_commonest_mistakes():
    def message(endpoint, body):
        with pytest.raises(ApiError) as info:
            validate_request(endpoint, body)
        return info.value.message

    assert message(CHAT, chat(max_tokens="40")) == \
        "Invalid type for 'max_tokens': expected an integer, but got a string instead."
    assert message(CHAT, {"model": "gemma", "messages": []}) == ("Invalid 'messages': empty array. Expected an array "
                                                                  "with minimum length 1, but got an empty array "
                                                                  "instead.")
    assert message(CHAT, chat(messages=[{"content": "x"}])) == "Missing required parameter: 'messages[0].role'."
    assert message(CHAT, chat(messages=[{"role": "wizard", "content": "x"}])).startswith(
        "Invalid value: 'wizard'. Supported values are: ")
    assert message(CHAT, chat(stream_options={})) == \
        "The 'stream_options' parameter is only allowed when 'stream' is enabled."


@pytest.mark.parametrize(("endpoint", "body"), [
    (CHAT, chat(temperature=None, n=None, max_tokens=None, stop=None, stream_options=None)),
    (CHAT, chat(stream=True, stream_options={"include_usage": True}, seed=7, logprobs=True, top_logprobs=2)),
    (CHAT, chat(messages=[{"role": "system", "content": "s"}, {"role": "developer", "content": "d"},
                          {"role": "user", "content": [{"type": "text", "text": "t"}]},
                          {"role": "assistant", "content": None, "tool_calls": [
                              {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                          {"role": "tool", "tool_call_id": "c1", "content": "42"}])),
    (CHAT, chat(max_tokens=40.0)),  # JSON Schema counts 40.0 as an integer
    (CHAT, chat(top_k=40, repetition_penalty=1.1, chat_template_kwargs={"enable_thinking": False}, cache_prompt=True,
                messages=[{"role": "user", "content": "x", "engine_extension": [1, {"a": None}]}])),
    (COMPLETIONS, {"model": "gemma", "prompt": [[1, 2], [3]], "max_tokens": 0, "echo": True, "n_probs": 3}),
    (COMPLETIONS, {"model": "gemma", "prompt": "x", "max_tokens": MAX_TOKENS_CAP, "n": 128}),  # at the bounds
    (CHAT, chat(max_tokens=MAX_TOKENS_CAP, max_completion_tokens=MAX_TOKENS_CAP, n=128)),
    (EMBEDDINGS, {"model": "gemma", "input": [[1, 2, 3]], "encoding_format": "float", "truncate": True}),
    # the stream_options rule is for completions: embeddings, which never stream, pass it untouched
    (EMBEDDINGS, {"model": "gemma", "input": "x", "stream_options": {"include_usage": True}}),
])
def test_valid_requests_and_fields_openai_does_not_define_pass_untouched(endpoint, body):
    before = json.dumps(body, sort_keys=True)
    validate_request(endpoint, body)
    assert json.dumps(body, sort_keys=True) == before


@pytest.mark.parametrize("raw", [b'{"model": "gemma", "temperature": NaN}', b'{"temperature": Infinity}',
                                 b'{"temperature": -Infinity}', b'{"temperature": 1e999}',
                                 b'{"seed": 123456789012345678901234567890}', b'{"seed": -9223372036854775809}'])
def test_nan_infinity_and_oversized_numbers_are_refused(raw):
    with pytest.raises(ApiError) as info:
        parse_body(raw)
    assert (info.value.status, info.value.code) == (400, "invalid_number")


_RANGE = f"is out of range; integers here lie between {INTEGER_MIN} and {INTEGER_MAX}."


@pytest.mark.parametrize("raw, message", [
    ('{"t": NaN}', "The request body contains NaN, which JSON does not allow; send a finite number."),
    ('{"t": -Infinity}', "The request body contains -Infinity, which JSON does not allow; send a finite number."),
    ('{"t": 1e999}', "The number 1e999 is too large; send a finite number."),
    ('{"t": ' + "1" * 45 + 'e999}', f"The number {'1' * 40} is too large; send a finite number."),
    ('{"seed": 18446744073709551616}', f"The integer 18446744073709551616 {_RANGE}"),
    ('{"seed": ' + "9" * 40 + "}", f"The integer {'9' * 40} {_RANGE}"),  # 40 characters: shown whole
    ('{"seed": ' + "9" * 41 + "}", f"The integer {'9' * 40}... {_RANGE}"),  # more: the first 40 and "..."
    ('{"seed": -' + "9" * 41 + "}", f"The integer -{'9' * 39}... {_RANGE}"),
    ("[1]", "The request body must be a JSON object."),
    ('{"x": ' + "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH + "}",
     f"The request body nests arrays and objects more than {MAX_JSON_DEPTH} deep, the most this gateway takes."),
])
@pytest.mark.parametrize("as_text", [False, True])
def test_a_refused_body_is_told_what_is_wrong_in_bytes_and_in_text_alike(raw, message, as_text):
    """The sentence a client reads, for each bound of parse_body; a str body (json.loads' other input) is held to
    the same bounds as bytes."""
    with pytest.raises(ApiError) as info:
        parse_body(raw if as_text else raw.encode())
    assert (info.value.status, info.value.message) == (400, message)


@pytest.mark.parametrize("as_text", [False, True])
def test_a_body_at_the_bounds_parses_the_same_from_text_and_bytes(as_text):
    raw = ('{"a": -9223372036854775808, "b": 18446744073709551615, "c": 1.5e300, "d": [[["x"]]], "e": 12}')
    assert parse_body(raw if as_text else raw.encode()) == json.loads(raw)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5000, 200_000])
def test_json_nested_past_the_depth_limit_is_a_400_not_a_500(depth):
    raw = b'{"model": "gemma", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    with pytest.raises(ApiError) as info:
        parse_body(raw)
    assert (info.value.status, info.value.code) == (400, "json_too_deep")


def test_json_at_the_depth_limit_and_integers_at_the_int64_edges_are_taken():
    deep = b'{"x": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert parse_body(deep)["x"]
    assert parse_body(b'{"a": -9223372036854775808, "b": 18446744073709551615}')["b"] == 2**64 - 1


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe"])
def test_a_body_that_is_not_a_json_object_is_invalid_json(raw):
    with pytest.raises(ApiError) as info:
        parse_body(raw)
    assert info.value.code == "invalid_json"
    message = info.value.message
    assert message == "The request body must be a JSON object." or (
        message.startswith("The request body is not valid JSON (") and message.endswith("); send a JSON object."))


@pytest.mark.parametrize("raw", [
    json.dumps({"model": "gemma", "messages": USER, "n": 2, "temperature": 0.5}).encode(),
    b"\xef\xbb\xbf" + json.dumps({"model": "caf\u00e9"}).encode(),  # UTF-8 with a byte-order mark
    json.dumps({"model": "gemma", "stop": ["\u00e9"]}).encode("utf-16"),
    json.dumps({"model": "gemma", "seed": 7}).encode("utf-32-le"),
    bytearray(b'{"model": "gemma", "x": "\\ud800"}'),  # a lone surrogate, as json.loads keeps it
    b'{"model": "gemma", "x": "\xed\xa0\x80"}',  # a lone surrogate in UTF-8 bytes, which json.loads takes too
])
def test_a_body_in_any_json_encoding_parses_as_the_standard_library_reads_it(raw):
    assert parse_body(raw) == json.loads(raw)


@pytest.mark.parametrize(("body", "embeddings", "expected"), [
    ({}, False, CompletionLimit(256, 1)),
    ({"max_tokens": 40}, False, CompletionLimit(40, 1)),
    ({"max_tokens": 40.0, "n": 3}, False, CompletionLimit(40, 3)),
    ({"max_tokens": 10, "max_completion_tokens": 30}, False, CompletionLimit(30, 1)),
    ({"max_tokens": 5, "n": 2, "best_of": 4}, False, CompletionLimit(5, 4)),
    ({"max_tokens": None, "n": None}, False, CompletionLimit(256, 1)),
    ({"max_tokens": 40}, True, CompletionLimit(0, 1)),
])
def test_the_reserved_completion_tokens_follow_max_tokens_and_n(body, embeddings, expected):
    assert completion_limit(body, embeddings) == expected


def test_without_max_tokens_the_models_context_is_reserved_per_choice_and_max_tokens_still_wins():
    assert completion_limit({"n": 2}, False, 512) == CompletionLimit(512, 2, by_context=True)
    assert completion_limit({"max_tokens": 40}, False, 512) == CompletionLimit(40, 1)
    assert completion_limit({"max_completion_tokens": 900}, False, 512) == CompletionLimit(900, 1)
    assert completion_limit({"input": "x"}, True, 512) == CompletionLimit(0, 1)
    assert enforced_fields({}, CompletionLimit(512, 1, by_context=True), False) == {}  # the engine stops there


def test_under_token_limits_the_engine_is_sent_the_reserved_max_tokens():
    assert enforced_fields({}, CompletionLimit(256, 1), False) == {"max_tokens": 256}
    assert enforced_fields({"max_completion_tokens": 30}, CompletionLimit(30, 2), False) == {"max_tokens": 30}
    assert enforced_fields({"max_tokens": 40.0}, CompletionLimit(40, 1), False) == {"max_tokens": 40}
    assert enforced_fields({"max_tokens": 40}, CompletionLimit(40, 1), False) == {}
    assert enforced_fields({}, CompletionLimit(0, 1), True) == {}
    tokens = ProjectPolicy("p", "t", "o", quotas=(("project:p", Quota(tokens_per_day=300)),))
    requests_only = ProjectPolicy("p", "t", "o", quotas=(("project:p", Quota(requests_per_minute=5)),))
    assert limits_tokens(tokens) and not limits_tokens(requests_only)


def test_the_vendored_schemas_name_their_source_commit_and_licence():
    from importlib import resources

    origin = source()
    assert origin["repository"] == "https://github.com/openai/openai-openapi" and len(origin["commit"]) == 40
    licence = resources.files("llmgw.gateway.openapi").joinpath("LICENSE-openai-openapi").read_text()
    assert "MIT License" in licence and "OpenAI" in licence


@pytest.mark.parametrize(("openapi", "draft7"), [
    ({"type": "integer", "nullable": True, "description": "d"}, {"type": ["integer", "null"]}),
    ({"type": "string", "enum": ["a"], "nullable": True}, {"type": ["string", "null"], "enum": ["a", None]}),
    ({"oneOf": [{"$ref": "#/components/schemas/A"}], "nullable": True},
     {"anyOf": [{"type": "null"}, {"anyOf": [{"$ref": "#/definitions/A"}]}]}),
    ({"$ref": "#/components/schemas/A", "minimum": 1}, {"allOf": [{"$ref": "#/definitions/A"}, {"minimum": 1}]}),
    ({"type": "object", "additionalProperties": False, "x-oaiMeta": {}, "default": {},
      "properties": {"description": {"type": "string", "format": "uri", "title": "t"}}},
     {"type": "object", "properties": {"description": {"type": "string"}}}),
])
def test_update_converts_openapi_to_draft7_by_its_stated_rules(openapi, draft7):
    assert convert(openapi) == draft7
