"""The agent's footprint at steady state: CPU share of one core and resident memory.

Runs a real `llmgw agent` process against a minimal control plane (gRPC on 127.0.0.1) in this process, has it
start a real llama-server shard with Gemma 3 270M (the cached build and mirror that the tests use), waits for the
shard to be ready and for the agent to settle, then measures the agent process alone (not the engine) over
`--seconds`: CPU time from /proc/<pid>/stat (utime + stime) and VmRSS / VmHWM from /proc/<pid>/status.
Heartbeats (with node and shard telemetry) every `--heartbeat` seconds (default 10).

GPU telemetry goes through the NVML stand-in built from the real H200 captures (tests/agent/discovery/fake_nvml.py:
one H200 under load, GPM supported), installed in the agent process before the `llmgw agent` command runs, so every
heartbeat also samples a GPU as it would on an H200 node (`--real-nvml` uses the installed pynvml instead: on a
node without NVIDIA driver that is a CPU node).

    .venv/bin/python bench/agent_footprint.py [--seconds 60] [--heartbeat 10] [--real-nvml] [--json]

Targets (issue 3): under 0.5% of a core and under 80 MB resident.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmgw.agent import procfs  # noqa: E402
from llmgw.engines import demo  # noqa: E402
from llmgw.wire import control_message, pb, serve_agents  # noqa: E402

GEMMA_SHA256 = demo.GEMMA_SHA256
CPU_TARGET_PERCENT = 0.5
RSS_TARGET_BYTES = 80 * 1000 * 1000
REPO = Path(__file__).resolve().parents[1]
# Runs `llmgw agent ARGS` with the H200 NVML stand-in in place of pynvml (argv[1:] are the command's arguments).
FAKE_NVML_ENTRY = f"""
import sys
sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests" / "agent" / "discovery")!r}]
from fake_nvml import FakeNvml, load_readings
import llmgw.agent.runtime as runtime
nvml = FakeNvml.h200(readings=load_readings()["under_load"])
runtime.load_nvml = lambda: nvml
from llmgw.cli.main import main
main(sys.argv[1:])
"""


def _status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _cpu_seconds(pid: int) -> float:
    stat = procfs.read_proc_stat(pid)
    if stat is None:
        raise SystemExit(f"the agent process {pid} is gone; see its log")
    return (stat.utime + stat.stime) / procfs.CLOCK_TICKS


async def measure(seconds: float, heartbeat: float, work: Path, binary: Path, mirror: Path,
                  fake_nvml: bool = True) -> dict:
    links_send, links = trio.open_memory_channel(2)
    beats = 0
    gpu_samples = 0

    async def handler(link, peer):
        await links_send.send(link)
        await trio.sleep_forever()

    log = (work / "agent.log").open("wb")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_agents, handler, "127.0.0.1", 0)
        entry = [sys.executable, "-c", FAKE_NVML_ENTRY] if fake_nvml else [sys.executable, "-m", "llmgw.cli"]
        agent = subprocess.Popen(
            [*entry, "agent", "--control-plane", f"127.0.0.1:{port}",
             "--node-id", "bench", "--state-dir", str(work / "state"), "--mirror", str(mirror),
             "--heartbeat-interval", f"{heartbeat}s", "--engine-binary", f"llama.cpp@b11434={binary}",
             "--stop-shards-on-exit"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            link = await links.receive()
            first = await link.receive()
            gpus = [f"{g.name} ({g.gpu_class})" for g in first.register.gpus]
            await link.send(control_message(command_id="start", start_shard=pb.StartShard(
                shard_id="gemma-0/0", replica_id="gemma-0", model="gemma", engine="llama.cpp",
                engine_version="b11434", weights=[pb.WeightsFile(source="file:///gemma.gguf", sha256=GEMMA_SHA256)],
                cpu_cores=2, context_size=2048, replica_key="k", served_name="gemma",
                engine_args=["--no-jinja", "--chat-template", "gemma"])))

            async def drain():
                nonlocal beats, gpu_samples
                async for message in link:
                    if message.WhichOneof("body") == "heartbeat":
                        beats += 1
                        gpu_samples += len(message.heartbeat.gpus)

            with trio.fail_after(180):
                while True:
                    message = await link.receive()
                    if message.WhichOneof("body") == "shard_status" and message.shard_status.state == "ready":
                        engine_pid = message.shard_status.pid
                        break
                    if message.WhichOneof("body") == "command_result" and not message.command_result.ok:
                        raise SystemExit(f"the shard did not start: {message.command_result.error}")
            nursery.start_soon(drain)
            await trio.sleep(min(15.0, heartbeat * 1.5))  # settle: first heartbeats, readiness checks
            beats = gpu_samples = 0
            cpu0, t0 = _cpu_seconds(agent.pid), time.monotonic()
            await trio.sleep(seconds)
            cpu1, t1 = _cpu_seconds(agent.pid), time.monotonic()
            rss = (_status_kib(agent.pid, "VmRSS") or 0) * 1024
            hwm = (_status_kib(agent.pid, "VmHWM") or 0) * 1024
            threads = _status_kib(agent.pid, "Threads")
            engine_rss = (_status_kib(engine_pid, "VmRSS") or 0) * 1024
        finally:
            agent.send_signal(signal.SIGTERM)
            with trio.move_on_after(20, shield=True):
                while agent.poll() is None:
                    await trio.sleep(0.1)
            if agent.poll() is None:
                agent.kill()
            nursery.cancel_scope.cancel()
    cpu_percent = 100.0 * (cpu1 - cpu0) / (t1 - t0)
    return {
        "window_seconds": round(t1 - t0, 1),
        "heartbeat_seconds": heartbeat,
        "heartbeats_received": beats,
        "nvml": "H200 stand-in (fake_nvml)" if fake_nvml else "installed pynvml",
        "gpus_registered": gpus,
        "gpu_samples_received": gpu_samples,
        "agent_cpu_percent_of_one_core": round(cpu_percent, 3),
        "agent_rss_bytes": rss,
        "agent_peak_rss_bytes": hwm,
        "agent_threads": threads,
        "engine_rss_bytes": engine_rss,
        "cpu_target_met": cpu_percent < CPU_TARGET_PERCENT,
        "rss_target_met": rss < RSS_TARGET_BYTES,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement window (s)")
    parser.add_argument("--heartbeat", type=float, default=10.0, help="heartbeat / telemetry interval (s)")
    parser.add_argument("--real-nvml", action="store_true", help="use the installed pynvml, not the H200 stand-in")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cache = Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    binary = demo.ensure_llama_server(cache)
    mirror = demo.ensure_gemma_mirror(cache)
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as work:
        result = trio.run(measure, args.seconds, args.heartbeat, Path(work), binary, mirror, not args.real_nvml)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"agent CPU: {result['agent_cpu_percent_of_one_core']:.3f}% of one core over "
          f"{result['window_seconds']} s ({result['heartbeats_received']} heartbeats every "
          f"{result['heartbeat_seconds']:g} s, {result['gpu_samples_received']} GPU samples via {result['nvml']}, "
          f"GPUs {', '.join(result['gpus_registered']) or 'none'}); target < {CPU_TARGET_PERCENT}%: "
          f"{'met' if result['cpu_target_met'] else 'NOT met'}")
    print(f"agent RSS: {result['agent_rss_bytes'] / 1e6:.1f} MB (peak {result['agent_peak_rss_bytes'] / 1e6:.1f} MB, "
          f"{result['agent_threads']} threads); target < 80 MB: {'met' if result['rss_target_met'] else 'NOT met'}")
    print(f"(engine RSS, for scale: {result['engine_rss_bytes'] / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
