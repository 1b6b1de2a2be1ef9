"""A stand-in for `vllm serve` run as one rank of a replica spread over several nodes, for tests (no GPU here).

It writes what it was started with (argv and the NCCL / CUDA variables) to `$FAKE_VLLM_RECORDS/<rank>.json`, then:
rank 0 (no `--headless`) serves like an engine on `--host`/`--port` (the llama-server stand-in, whose `/health`
answers 200 as vLLM's does); a `--headless` rank serves nothing and sleeps until it is stopped, as vLLM's headless
ranks do (vllm/entrypoints/cli/serve.py). The multi-node flags are vLLM's (vllm/engine/arg_utils.py's parallel
group); unknown vLLM flags are accepted and ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="vllm serve stand-in (one rank)")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29501)
    parser.add_argument("--headless", action="store_true")
    args, _ = parser.parse_known_args(argv)
    records = Path(os.environ["FAKE_VLLM_RECORDS"])
    records.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_VISIBLE"))}
    (records / f"{args.node_rank}.json").write_text(json.dumps({"argv": argv, "env": env}))
    if args.headless:
        while True:
            time.sleep(3600)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fake_llama_server

    fake_llama_server.main(["--host", args.host, "--port", str(args.port), "-m", args.model])


if __name__ == "__main__":
    main(sys.argv[1:])
