"""What the client and gateway hosts of tests/agent/test_engine_relay_other_hosts.py run inside their network
namespaces: `python other_host_calls.py COMMAND JSON`, one JSON object in, one JSON line out on stdout.

    knock    {"base": URL, "paths": [...], "methods": [...], "headers": [{...}, ...], "ports": [[host, port], ...]}
             -> {"answers": [[method, path, header set index, status, error type or null], ...],
                 "ports": [[host, port, outcome, seconds], ...]}
             every path with every method and every header set (a JSON body with POST, PUT and PATCH), then a TCP
             connect to each of `ports`: outcome "refused", "timeout" (3 s), "connected" or the error's name.
    gateway  {"store": PATH, "table": PATH, "host": H, "port": P}
             serves llmgw's gateway (`llmgw.gateway.Gateway`, as `llmgw server` runs it with `workers: 1`) on H:P
             with the SQLite store at PATH and the routing table in the JSON file (`llmgw.gateway.feed`'s
             `table_to_json`, as the control plane feeds its worker processes); prints nothing, runs until killed.
    ask      {"url": BASE/v1, "api_key": K, "model": M}
             -> {"content": str, "completion_tokens": int, "streamed": str}: once the gateway accepts connections
             (within 30 s), one chat completion and one streamed, with the official openai SDK.
"""

from __future__ import annotations

import json
import socket
import sys
import time


def knock(spec: dict) -> dict:
    import httpx

    answers = []
    with httpx.Client(base_url=spec["base"], timeout=10) as client:
        for path in spec["paths"]:
            for method in spec["methods"]:
                for index, headers in enumerate(spec["headers"]):
                    body = b'{"model":"gemma","prompt":"hi","max_tokens":1}' if method in ("POST", "PUT",
                                                                                            "PATCH") else None
                    reply = client.request(method, path, headers=headers, content=body)
                    kind = None
                    if method != "HEAD":
                        try:
                            kind = reply.json()["error"]["type"]
                        except (ValueError, KeyError, TypeError):
                            kind = reply.text[:200]
                    answers.append([method, path, index, reply.status_code, kind])
    return {"answers": answers, "ports": [[host, port, *_connect(host, port)] for host, port in spec["ports"]]}


def _connect(host: str, port: int) -> tuple[str, float]:
    began = time.monotonic()
    try:
        socket.create_connection((host, port), timeout=3).close()
        outcome = "connected"
    except ConnectionRefusedError:
        outcome = "refused"
    except TimeoutError:
        outcome = "timeout"
    except OSError as exc:
        outcome = type(exc).__name__
    return outcome, round(time.monotonic() - began, 3)


def gateway(spec: dict) -> None:
    import trio

    from llmgw.gateway import Gateway
    from llmgw.gateway.feed import table_from_json
    from llmgw.store import open_store

    with open(spec["table"]) as file:
        table = table_from_json(json.load(file))
    store = open_store(spec["store"])
    trio.run(Gateway(store, table).serve, spec["host"], spec["port"])


def ask(spec: dict) -> dict:
    import httpx
    import openai

    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(spec["url"].removesuffix("/v1") + "/health", timeout=5)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    sdk = openai.OpenAI(base_url=spec["url"], api_key=spec["api_key"], max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Say hello."}]
    reply = sdk.chat.completions.create(model=spec["model"], max_tokens=4, temperature=0, messages=messages)
    chunks = sdk.chat.completions.create(model=spec["model"], max_tokens=4, temperature=0, messages=messages,
                                         stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return {"content": reply.choices[0].message.content, "completion_tokens": reply.usage.completion_tokens,
            "streamed": streamed}


if __name__ == "__main__":
    command, argument = sys.argv[1], json.loads(sys.argv[2])
    if command == "gateway":
        gateway(argument)
    else:
        print(json.dumps({"knock": knock, "ask": ask}[command](argument)))
