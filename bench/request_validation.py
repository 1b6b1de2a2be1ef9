"""CPU per request of checking an OpenAI request body: jsonschema vs fastjsonschema vs jsonschema-rs, and our parse.

    .venv/bin/python bench/request_validation.py [--rounds 2000]

Same schema for both validators (OpenAI's vendored request schemas plus the gateway's bounds,
`llmgw.gateway.validation.request_schema`); bodies typical of each endpoint (a chat with a system prompt, a user
turn and a tool; a completion; an embeddings batch). Prints µs of CPU (process time) per request for: the bounded
parse alone (`parse_body`), jsonschema's Draft7Validator, fastjsonschema (Python code generated from the schema),
jsonschema-rs (native), and what the gateway runs (`parse_body` + `validate_request`, i.e. parse + jsonschema-rs).
Target (issue 19): the gateway's validation <= 50 µs per request; it uses jsonschema-rs, the fastest here.
A few seconds; no network, no engine.
"""

from __future__ import annotations

import argparse
import json
import time

import fastjsonschema
import jsonschema
import jsonschema_rs

from llmgw.gateway.validation import ENDPOINTS, parse_body, request_schema, validate_request

BODIES = {
    "/v1/chat/completions": {
        "model": "gemma", "temperature": 0.2, "max_tokens": 256, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": "You are a helpful assistant. Answer briefly. " * 4},
                     {"role": "user", "content": "What is the weather like in Paris today, and should I take an "
                                                 "umbrella when I go out this afternoon?"},
                     {"role": "assistant", "content": "Let me look that up."},
                     {"role": "user", "content": [{"type": "text", "text": "Please use the tool."}]}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    },
    "/v1/completions": {"model": "gemma", "prompt": "Once upon a time, in a land far away, " * 8,
                        "max_tokens": 64, "temperature": 0.7, "stop": ["\n\n"], "seed": 7},
    "/v1/embeddings": {"model": "gemma", "input": [f"sentence number {i} about something" for i in range(16)]},
}


def per_request(function, rounds: int) -> float:
    """µs of process CPU time per call, best of 3 runs of `rounds` calls."""
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        for _ in range(rounds):
            function()
        best = min(best, (time.process_time() - began) / rounds * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    print(f"{'endpoint':22} {'bytes':>5} {'parse':>6} {'jsonschema':>10} {'fastjsonschema':>14} {'jsonschema-rs':>13} "
          f"{'gateway':>8}  (µs CPU per request)")
    for endpoint, body in BODIES.items():
        raw = json.dumps(body).encode()
        schema = request_schema(ENDPOINTS[endpoint])
        slow = jsonschema.Draft7Validator(schema)
        fast = fastjsonschema.compile(schema, use_default=False, use_formats=False)
        native = jsonschema_rs.Draft7Validator(schema)
        parsed = parse_body(raw)
        assert slow.is_valid(parsed) and native.is_valid(parsed)
        fast(parsed)
        validate_request(endpoint, parsed)
        parse_us = per_request(lambda: parse_body(raw), args.rounds)
        slow_us = per_request(lambda: slow.validate(parsed), max(100, args.rounds // 10))
        fast_us = per_request(lambda: fast(parsed), args.rounds)
        native_us = per_request(lambda: native.is_valid(parsed), args.rounds)
        gateway_us = per_request(lambda: validate_request(endpoint, parse_body(raw)), args.rounds)
        print(f"{endpoint:22} {len(raw):5d} {parse_us:6.1f} {slow_us:10.1f} {fast_us:14.1f} {native_us:13.1f} "
              f"{gateway_us:8.1f}")
    plain = json.dumps(BODIES["/v1/chat/completions"]).encode()
    print(f"(json.loads without our bounds, chat body: {per_request(lambda: json.loads(plain), args.rounds):.1f} µs)")


if __name__ == "__main__":
    main()
