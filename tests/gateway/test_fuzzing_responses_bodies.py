"""The hypothesis fuzzer of test_fuzzing_openai_bodies.py on /v1/responses and /v1/responses/input_tokens: any
answer but a 2xx or an OpenAI-shaped 4xx is a failure. Near-valid Responses bodies (messages, function calls and
their outputs, reasoning items, tools, store, stream, a previous_response_id that exists or not) with one field
wrong, dropped or unknown, or any JSON at all. The stand-in serves no /tokenize, so input_tokens answers 503 there
(`model_not_ready`), which is accepted as the one 5xx with OpenAI's shape."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzzing_openai_bodies import FAST_EXAMPLES, SLOW_EXAMPLES, _is_openai_error, any_json, bad_values, texts
from test_fuzzing_openai_bodies import served  # noqa: F401 (the module's gateway and stand-in)

import json

models = st.sampled_from(["gemma", "gemma-3"])
parts = st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": texts}), min_size=1, max_size=2)
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]),
                                 "content": texts | parts}, optional={"type": st.just("message")})
call_id = st.sampled_from(["call_1", "call_2"])
items = (message
         | st.fixed_dictionaries({"type": st.just("function_call"), "call_id": call_id, "name": st.just("f"),
                                  "arguments": st.just("{}")})
         | st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": call_id, "output": texts})
         | st.fixed_dictionaries({"type": st.just("reasoning"), "id": st.just("rs_1"),
                                  "summary": st.just([{"type": "summary_text", "text": "why"}])}))
tool = st.fixed_dictionaries({"type": st.just("function"), "name": st.text("abcdefgh_", min_size=1, max_size=8),
                              "strict": st.none() | st.booleans(),
                              "parameters": st.just({"type": "object", "properties": {}})})
valid_response = st.fixed_dictionaries(
    {"model": models, "input": texts | st.lists(items, min_size=1, max_size=4)},
    optional={"instructions": texts, "max_output_tokens": st.integers(16, 40), "temperature": st.floats(0, 2),
              "top_p": st.floats(0, 1), "stream": st.booleans(), "store": st.booleans(),
              "tools": st.lists(tool, max_size=1), "tool_choice": st.sampled_from(["auto", "none"]),
              "previous_response_id": st.just("resp_" + "0" * 32), "top_k": st.integers(1, 50),
              "text": st.just({"format": {"type": "json_object"}})})
fields = st.sampled_from(["model", "input", "instructions", "max_output_tokens", "temperature", "stream", "store",
                          "tools", "tool_choice", "previous_response_id", "text", "reasoning", "include"])


def _mutated(body: dict, field: str, value, drop: bool) -> dict:
    return {k: v for k, v in body.items() if k != field} if drop else {**body, field: value}


paths = st.sampled_from(["/responses", "/responses/input_tokens"])
requests = st.tuples(paths, valid_response | st.builds(_mutated, valid_response, fields, bad_values, st.booleans())
                     | any_json)


def _check(client, path: str, body) -> None:
    raw = json.dumps(body, allow_nan=True).encode()
    answer = client.post(path, content=raw, headers={"content-type": "application/json"})
    if 200 <= answer.status_code < 300:
        return
    if answer.status_code == 503 and path.endswith("input_tokens"):
        assert answer.json()["error"]["code"] == "model_not_ready"
        return
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:500], raw[:500])
    assert _is_openai_error(answer.json()), (answer.text[:500], raw[:500])


@settings(max_examples=FAST_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request=requests)
def test_fuzzed_responses_bodies_get_a_2xx_or_an_openai_shaped_4xx(served, request):  # noqa: F811
    _check(served, *request)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(request=requests)
def test_many_fuzzed_responses_bodies_get_a_2xx_or_an_openai_shaped_4xx(served, request):  # noqa: F811
    _check(served, *request)
