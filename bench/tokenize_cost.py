"""What precise prefix routing costs the gateway per request (issue 13): the prompt's tokens from a running vLLM's
`POST /tokenize` (what llmgw does), against a local `tokenizers` tokenizer of the same model with the chat template
rendered by jinja2 (the alternative), and hashing the tokens as vLLM does (`llmgw.tools.vllm_hashing`).

Needs a running vLLM (`--url`, `--key`, `--model`; e.g. the one tests/gateway/test_real_vllm.py starts) and, for the
local side, the converted model's directory (`--model-dir`, holding tokenizer.json and chat_template.jinja) and a
Python that has `tokenizers` and `jinja2` (`--local-python`, e.g. the vLLM venv's). Prints medians and the ratio of
the two ways, measured in the same run. Run sparingly: the machine is shared.

    .venv/bin/python bench/tokenize_cost.py --url http://127.0.0.1:PORT --key KEY --model gemma-3-270m \
        --model-dir ~/.cache/llmgw/models/gemma-3-270m-hf-... --local-python ~/.cache/llmgw/engines/vllm/0.32.0/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import httpx

from llmgw.tools.vllm_hashing import block_hashes

MESSAGES = [{"role": "system", "content": "You answer questions about lighthouses, briefly and kindly. " * 60},
            {"role": "user", "content": "How many waves does the keeper count each night?"}]

_LOCAL = r'''
import json, statistics, sys, time
from pathlib import Path
import jinja2
from tokenizers import Tokenizer
directory, runs, messages = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
began = time.perf_counter()
tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
template = jinja2.Environment().from_string((directory / "chat_template.jinja").read_text())
load = time.perf_counter() - began
times, count = [], 0
for _ in range(runs):
    began = time.perf_counter()
    text = template.render(messages=messages, add_generation_prompt=True, bos_token="<bos>")
    count = len(tokenizer.encode(text, add_special_tokens=False).ids)
    times.append(time.perf_counter() - began)
print(json.dumps({"load_s": load, "median_s": statistics.median(times), "tokens": count}))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", default="")
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-dir")
    parser.add_argument("--local-python")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    body = {"model": args.model, "messages": MESSAGES, "add_generation_prompt": True}
    times, tokens = [], []
    with httpx.Client(headers=headers, timeout=30) as client:
        client.post(args.url + "/tokenize", json=body).raise_for_status()  # warm
        for _ in range(args.runs):
            began = time.perf_counter()
            answer = client.post(args.url + "/tokenize", json=body)
            times.append(time.perf_counter() - began)
            tokens = answer.json()["tokens"]
    remote = statistics.median(times)
    hashing = []
    for _ in range(args.runs):
        began = time.perf_counter()
        block_hashes(tokens, 128)
        hashing.append(time.perf_counter() - began)
    print(f"prompt: {len(tokens)} tokens ({len(tokens) // 128} blocks of 128)")
    print(f"engine /tokenize round trip: median {remote * 1e3:.2f} ms over {args.runs}")
    print(f"hashing the blocks (sha256_cbor): median {statistics.median(hashing) * 1e3:.3f} ms")
    if args.model_dir and args.local_python:
        out = subprocess.run([args.local_python, "-c", _LOCAL, args.model_dir, str(args.runs), json.dumps(MESSAGES)],
                             capture_output=True, text=True, check=True)
        local = json.loads(out.stdout)
        print(f"local tokenizers + jinja2: median {local['median_s'] * 1e3:.2f} ms ({local['tokens']} tokens), "
              f"loading the tokenizer once {local['load_s']:.2f} s")
        print(f"ratio engine /tokenize / local: {remote / local['median_s']:.1f}")


if __name__ == "__main__":
    main()
