"""A replica that sleeps instead of stopping: llama-server b11434's ways of unloading a model in place and loading it
again, measured against a cold start of the same model (issue 34, item 2).

    .venv/bin/python bench/engine_sleep.py [--rounds 5] [--cache DIR] [--json FILE]

Gemma 3 270M Q4_K_M (`llmgw.engines.demo`'s mirror) on the real llama-server b11434, with the arguments an llmgw
replica of `bench/autoscale.py` gets (`-c 2048 -t 1 --metrics --no-jinja --chat-template gemma`). Each round times
the three ways one after the other, so that they share the machine's load of the moment, each from the moment the
wake begins to the first streamed token of a one-token chat completion:

- cold: a new llama-server process for the model (what scale to zero does now: the agent starts the engine),
  with the time until `/health` answers 200 beside it;
- router: llama-server in router mode (`--models-dir`, the model a `.gguf` file in it) after
  `POST /models/unload` unloaded the model (`GET /models` says `unloaded`); the request itself loads it again
  (`--models-autoload`, the default);
- sleep: a llama-server of the model with `--sleep-idle-seconds 1`, once `GET /props` says `is_sleeping`; the
  request wakes it;
- warm: a request to a loaded model, for scale.

It also reads the resident memory (VmRSS, a router's model process included) loaded and asleep or unloaded. It prints the
median and range of each and writes them as JSON with --json. Nothing of llmgw runs: this measures the engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmgw.engines import demo  # noqa: E402

MODEL = "gemma-3-270m"
ARGS = ["-c", "2048", "-t", "1", "--metrics", "--no-jinja", "--chat-template", "gemma"]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server(argv: list[str], log: Path):
    """A llama-server process group on a free port: (process, base URL); stopped at the end."""
    port = free_port()
    with log.open("ab") as out:
        process = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port)], stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, 15)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def wait_for(check, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def first_token(base: str, model: str | None, timeout: float = 120) -> float:
    """Seconds from now to the first content chunk of a streamed one-token chat completion (connection refusals,
    as while the process starts, retried)."""
    began = time.monotonic()
    body = {"stream": True, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]}
    if model is not None:
        body["model"] = model
    while True:
        try:
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=timeout) as reply:
                if reply.status_code == 503:  # single-model server still loading
                    reply.read()
                    time.sleep(0.02)
                    continue
                reply.raise_for_status()
                for line in reply.iter_lines():
                    if line.startswith("data: {"):
                        choices = json.loads(line[6:]).get("choices") or [{}]
                        if (choices[0].get("delta") or {}).get("content"):
                            return time.monotonic() - began
                raise SystemExit(f"{base}: no content streamed")
        except httpx.ConnectError:
            if time.monotonic() - began > timeout:
                raise
            time.sleep(0.02)


def rss_mib(pid: int) -> float:
    """VmRSS of `pid` and its descendants, MiB."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():  # a child started by any thread
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return total / 1024


def model_status(base: str) -> str:
    models = httpx.get(f"{base}/models", timeout=10).json()
    for entry in models.get("data", []):
        if entry.get("id") == MODEL:
            status = entry.get("status")
            return status.get("value") if isinstance(status, dict) else str(status)
    return "absent"


def measure(binary: Path, gguf: Path, rounds: int, work: Path) -> dict[str, list[float]]:
    """Each round, one after the other (so the three share the machine's load of the moment): a cold start, a
    reload in the router after an unload, and a wake from sleep. The router and the sleeping server stay up
    between rounds, idle."""
    out: dict[str, list[float]] = {key: [] for key in (
        "cold_first_token", "cold_health", "router_first_token", "router_cold_first_token", "sleep_first_token",
        "warm_first_token", "rss_loaded", "rss_router_loaded", "rss_router_unloaded", "rss_sleeping")}
    log = work / "llama-server.log"
    models = work / "models"
    models.mkdir(exist_ok=True)
    (models / f"{MODEL}.gguf").symlink_to(gguf)
    with server([str(binary), "--models-dir", str(models), "--models-max", "1", *ARGS], log) as (router, routed), \
            server([str(binary), "-m", str(gguf), "--sleep-idle-seconds", "1", *ARGS], log) as (sleeper, asleep):
        wait_for(lambda: httpx.get(f"{routed}/health", timeout=5).status_code == 200, 60, "the router's health")
        wait_for(lambda: httpx.get(f"{asleep}/health", timeout=5).status_code == 200, 120, "health")
        first_token(asleep, None)
        out["router_cold_first_token"].append(first_token(routed, MODEL))  # the model's first load in the router
        for number in range(rounds):
            began = time.monotonic()
            with server([str(binary), "-m", str(gguf), *ARGS], log) as (process, base):
                wait_for(lambda: httpx.get(f"{base}/health", timeout=5).status_code == 200, 120, "health")
                out["cold_health"].append(time.monotonic() - began)
                out["cold_first_token"].append(out["cold_health"][-1] + first_token(base, None))
                out["warm_first_token"].append(first_token(base, None))
                out["rss_loaded"].append(rss_mib(process.pid))

            out["rss_router_loaded"].append(rss_mib(router.pid))
            httpx.post(f"{routed}/models/unload", json={"model": MODEL}, timeout=30).raise_for_status()
            wait_for(lambda: model_status(routed) == "unloaded", 60, "the model unloaded")
            time.sleep(0.3)
            out["rss_router_unloaded"].append(rss_mib(router.pid))
            out["router_first_token"].append(first_token(routed, MODEL))

            wait_for(lambda: httpx.get(f"{asleep}/props", timeout=5).json().get("is_sleeping") is True, 60, "sleep")
            time.sleep(0.3)
            out["rss_sleeping"].append(rss_mib(sleeper.pid))
            out["sleep_first_token"].append(first_token(asleep, None))
            print(f"round {number + 1}: cold {out['cold_first_token'][-1]:.2f} s (health "
                  f"{out['cold_health'][-1]:.2f} s), router reload {out['router_first_token'][-1]:.2f} s, wake from "
                  f"sleep {out['sleep_first_token'][-1]:.2f} s, warm {out['warm_first_token'][-1] * 1000:.0f} ms; "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cache = args.cache or Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    binary = demo.ensure_llama_server(cache)
    gguf = demo.ensure_gemma_mirror(cache) / "sha256" / demo.GEMMA_SHA256
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M')}; "
          f"{gguf.stat().st_size / 2**20:.0f} MiB GGUF", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        out = measure(binary, gguf, args.rounds, Path(scratch))
    print()
    print(f"{'wake (to the first token)':<44} {'median':>8} {'min':>8} {'max':>8}  n")
    labels = {"cold_first_token": "cold start: new process", "cold_health": "  of which until /health 200",
              "router_first_token": "router mode: reload after /models/unload",
              "router_cold_first_token": "router mode: first load (router up)",
              "sleep_first_token": "--sleep-idle-seconds: wake from sleep",
              "warm_first_token": "warm: model loaded"}
    for key, label in labels.items():
        values = out[key]
        print(f"{label:<44} {statistics.median(values):>7.2f}s {min(values):>7.2f}s {max(values):>7.2f}s  {len(values)}")
    for key, label in (("rss_loaded", "memory, one model's server, loaded"),
                       ("rss_sleeping", "memory, one model's server, asleep"),
                       ("rss_router_loaded", "memory, router and model, loaded"),
                       ("rss_router_unloaded", "memory, router, model unloaded")):
        print(f"{label:<44} {statistics.median(out[key]):>6.0f}MiB")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
