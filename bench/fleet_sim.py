"""Simulated agents for bench/fleet_scale.py: many nodes in one process, each on its own real gRPC stream.

    python bench/fleet_sim.py --address 127.0.0.1:PORT --first 0 --count 250 [--interval 5] [--tls-dir DIR]

Each simulated node speaks the protocol as `llmgw agent` does (llmgw.wire.connect, the same code): Register with
8 H200 cards (tests/fixtures/nvidia-h200/nvml-dump.json's shape), a Heartbeat every `--interval` seconds (random
phase) with readings varied per beat (GPU utilisation, memory, power, temperature, clocks; CPU, load, memory) and the
full shard list, and answers commands: StartShard (CommandResult once "spawned", shard `starting`, then `ready`
after `--ready-after` s), StopShard (`stopping`, then gone), AgentSettings and InstallEngine acknowledged,
RequestLogs answered, Restart acknowledged and the stream opened again (shards kept, adopted at Register).
Every shard reports `--engine-port` when given (one mock engine on 127.0.0.1 answers for all, so the gateway can be
measured under the fleet's load), else 40000 + its index on the node.
Prints "READY <count>" once every node registered; runs until killed. `--tls-dir DIR` holds ca.pem, and per node
`<node>.pem` / `<node>.key` (mutual TLS).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from llmgw.errors import WireError
from llmgw.wire import agent_message, connect, connecting, pb
from llmgw.wire import grpc_link
from llmgw.wire.features import ALL as FEATURES

# Each simulated node gets its own TCP connection, as a real agent (one per machine) has. Without this, gRPC shares
# one subchannel between every channel of a process to one address, and HTTP/2 caps the streams of a connection:
# about 100 nodes per process stayed connected and the rest reconnected with CANCELLED in a loop (1,000 agents in 4
# processes: 373 connected, 3,076 reconnects).
_agent_channel_options = connecting.agent_channel_options
connecting.agent_channel_options = lambda: [*_agent_channel_options(), ("grpc.use_local_subchannel_pool", 1)]

ROOT = Path(__file__).resolve().parents[1]
H200 = json.loads((ROOT / "tests/fixtures/nvidia-h200/nvml-dump.json").read_text())["devices"][0]
ENGINES = ("llama.cpp@b11434",)
GPU_COUNT = 8
CPU_CORES = 192
MEMORY = 2048 * 1024**3


@dataclass
class Shard:
    status: pb.ShardStatus
    used_bytes: int


@dataclass
class Node:
    node_id: str
    rng: random.Random
    shards: dict[str, Shard] = field(default_factory=dict)

    def register(self) -> pb.Register:
        gpus = []
        for i in range(GPU_COUNT):
            gpus.append(pb.Gpu(
                index=i, uuid=f"GPU-{self.node_id}-{i}", name=H200["name"], gpu_class="h200-141g", device_id=str(i),
                memory_total_bytes=H200["memory"]["total"], memory_used_bytes=H200["memory"]["used"],
                compute_capability=f"{H200['cc'][0]}.{H200['cc'][1]}", pcie_gen_current=H200["pcie_cur_gen"],
                pcie_gen_max=H200["pcie_max_gen"], pcie_width_current=H200["pcie_cur_width"],
                pcie_width_max=H200["pcie_max_width"], ecc_enabled=bool(H200["ecc_mode"][0]),
                power_limit_watts=H200["power_limit_mw"] / 1000, numa_node=i // 4,
                nvlink_peers=[str(j) for j in range(GPU_COUNT) if j != i]))
        return pb.Register(
            node_id=self.node_id, address="127.0.0.1", os="linux", node_secret=f"{self.node_id:-<43}", arch="x86_64", cpu_model="Intel Xeon Platinum 8480+",
            cpu_cores=CPU_CORES, cpu_flags=["avx2", "avx512f", "amx_tile"], memory_total_bytes=MEMORY,
            disk_free_bytes=4 * 1024**4, gpus=gpus, engines_installed=ENGINES, engines_installable=ENGINES,
            shards=[s.status for s in self.shards.values()], agent_version="sim", labels={"rack": self.node_id[-2:]},
            features=list(FEATURES))

    def heartbeat(self) -> pb.Heartbeat:
        rng, now = self.rng, time.time()
        held: dict[str, int] = {}
        for shard in self.shards.values():
            for device in shard.status.devices:
                held[device] = held.get(device, 0) + shard.used_bytes
        samples = []
        for i in range(GPU_COUNT):
            busy = str(i) in held
            used = H200["memory"]["used"] + held.get(str(i), 0) + rng.randrange(0, 256 * 1024**2)
            samples.append(pb.GpuSample(
                index=i, utilization_percent=rng.uniform(40, 100) if busy else rng.uniform(0, 2),
                memory_used_bytes=used, power_draw_watts=rng.uniform(300, 690) if busy else rng.uniform(70, 90),
                power_limit_watts=H200["power_limit_mw"] / 1000, temperature_celsius=rng.uniform(35, 75),
                sm_clock_mhz=rng.choice((345, 1755, 1980)), clock_event_reasons=H200["throttle"], ecc_uncorrected=0,
                sm_active_percent=rng.uniform(0, 90), sm_occupancy_percent=rng.uniform(0, 60),
                tensor_active_percent=rng.uniform(0, 50), dram_bandwidth_percent=rng.uniform(0, 70)))
        return pb.Heartbeat(
            time=now, sampled_at=now - rng.uniform(0, 1), gpus=samples, cpu_percent=rng.uniform(1, 30),
            load1=rng.uniform(0.5, 20), memory_used_bytes=int(MEMORY * rng.uniform(0.05, 0.3)),
            memory_available_bytes=int(MEMORY * rng.uniform(0.6, 0.9)), disk_free_bytes=4 * 1024**4,
            shards=[pb.ProcessGroupSample(shard_id=k, cpu_cores_used=rng.uniform(0.5, 2),
                                          resident_memory_bytes=rng.randrange(2, 8) * 1024**3) for k in self.shards],
            shard_states=[s.status for s in self.shards.values()], engines_installed=ENGINES)


async def run_node(node: Node, address: str, interval: float, ready_after: float, tls, registered: trio.Event,
                   engine_port: int = 0) -> None:
    """Keep one node connected: connect, register, beat, answer; reconnect after a Restart or a broken stream."""
    while True:
        restart = False
        started, answered = time.monotonic(), None
        try:
            async with connect(address, tls=tls, timeout=60) as link, trio.open_nursery() as nursery:
                await link.send(agent_message(register=node.register()))

                async def send(**body) -> None:
                    await link.send(agent_message(**body))

                async def beat() -> None:
                    await trio.sleep(node.rng.uniform(0, interval))
                    while True:
                        await send(heartbeat=node.heartbeat())
                        await trio.sleep(interval)

                async def become_ready(shard_id: str) -> None:
                    await trio.sleep(ready_after * node.rng.uniform(0.5, 1.5))
                    shard = node.shards.get(shard_id)
                    if shard is not None and shard.status.state == "starting":
                        shard.status.state = "ready"
                        await send(shard_status=shard.status)

                async def stop(command_id: str, shard_id: str) -> None:
                    shard = node.shards.get(shard_id)
                    if shard is not None:
                        shard.status.state = "stopping"
                        await send(shard_status=shard.status)
                        await trio.sleep(0.5)
                        node.shards.pop(shard_id, None)
                        stopped = pb.ShardStatus()
                        stopped.CopyFrom(shard.status)
                        stopped.state = "stopped"
                        await send(shard_status=stopped)
                    await send(command_result=pb.CommandResult(command_id=command_id, ok=True))

                async for message in link:
                    kind = message.WhichOneof("body")
                    command_id = message.command_id
                    if kind == "registered":
                        answered = time.monotonic() - started
                        if not registered.is_set():
                            registered.set()
                            nursery.start_soon(beat)
                    elif kind == "start_shard":
                        start = message.start_shard
                        status = pb.ShardStatus(
                            shard_id=start.shard_id, replica_id=start.replica_id, model=start.model, state="starting",
                            fingerprint=start.fingerprint, settings_commit=start.settings_commit,
                            devices=start.devices, cpu_cores=start.cpu_cores, memory_bytes=start.memory_bytes,
                            port=engine_port or 40000 + len(node.shards), pid=10000 + len(node.shards))
                        node.shards[start.shard_id] = Shard(status, 60 * 1024**3 // max(1, len(start.devices)))
                        await send(shard_status=status)
                        await send(command_result=pb.CommandResult(command_id=command_id, ok=True))
                        nursery.start_soon(become_ready, start.shard_id)
                    elif kind == "stop_shard":
                        nursery.start_soon(stop, command_id, message.stop_shard.shard_id)
                    elif kind == "install_engine":
                        await send(command_result=pb.CommandResult(command_id=command_id, ok=True))
                    elif kind == "request_logs":
                        request = message.request_logs
                        await send(log_lines=pb.LogLines(request_id=request.request_id, shard_id=request.shard_id,
                                                         lines=["simulated"]))
                        await send(command_result=pb.CommandResult(command_id=command_id, ok=True))
                    elif kind == "restart":
                        await send(command_result=pb.CommandResult(command_id=command_id, ok=True))
                        restart = True
                        nursery.cancel_scope.cancel()
                    elif command_id:  # agent_settings and anything newer: acknowledged
                        await send(command_result=pb.CommandResult(command_id=command_id, ok=True))
                    if restart:
                        break
        except* (WireError, trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            # the control plane ended the stream or went away: say so and reconnect, as agents do. How long the
            # stream lived and whether the control plane had answered Register tell a call it never accepted
            # (gRPC's core cancels those after 30 s) from an accepted stream that ended.
            lived = time.monotonic() - started
            said = f"registered after {answered:.1f} s" if answered is not None else "never registered"
            print(f"{node.node_id}: {group.exceptions[0]}; {said}, ended after {lived:.1f} s; connecting again",
                  flush=True)
        if not restart:
            await trio.sleep(1 + node.rng.uniform(0, 2))


async def main(args: argparse.Namespace) -> None:
    if args.keepalive:  # an experiment: agents that ping less often than `llmgw agent` does
        grpc_link.AGENT_KEEPALIVE_SECONDS = args.keepalive
    nodes = [Node(f"sim{n:05d}", random.Random(n)) for n in range(args.first, args.first + args.count)]
    events = [trio.Event() for _ in nodes]
    async with trio.open_nursery() as nursery:
        for node, event in zip(nodes, events):
            tls = None
            if args.tls_dir:
                from llmgw.wire import ClientTls

                d = Path(args.tls_dir)
                tls = ClientTls(ca_pem=(d / "ca.pem").read_bytes(), certificate_pem=(d / f"{node.node_id}.pem").read_bytes(),
                                key_pem=(d / f"{node.node_id}.key").read_bytes())
            nursery.start_soon(run_node, node, args.address, args.interval, args.ready_after, tls, event,
                               args.engine_port)
            await trio.sleep(args.stagger)
        for event in events:
            await event.wait()
        print(f"READY {len(nodes)}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between heartbeats")
    parser.add_argument("--ready-after", type=float, default=2.0, help="seconds from StartShard to ready (+-50%%)")
    parser.add_argument("--stagger", type=float, default=0.005, help="seconds between two nodes' connects")
    parser.add_argument("--tls-dir", default=None)
    parser.add_argument("--keepalive", type=float, default=0.0,
                        help="seconds between the nodes' keepalive pings (0: as `llmgw agent`, 2 s)")
    parser.add_argument("--engine-port", type=int, default=0,
                        help="the port every shard reports (a mock engine there answers the gateway); 0: 40000 + k")
    trio.run(main, parser.parse_args())
