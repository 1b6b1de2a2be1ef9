"""The agent's readings, taken every `telemetry_interval` and carried by every heartbeat (the latest one).

One reading is: GPU telemetry (NVML, or `nvidia-smi -q -x` where there is no NVML), node CPU use, load and
memory, the machine room's sensors (CPU package temperatures and power, board inlet: `llmgw.agent.sensors`, absent
where not measured), and each shard's CPU cores and resident memory (/proc, see `llmgw.agent.reporting.Sampler`). Rates (CPU
percent, cores, GPM metrics) are over the period since the previous reading. Heartbeats come every
`heartbeat_interval` and carry the latest reading with the time it was taken (`Heartbeat.sampled_at`), so a
reading repeated by two beats is dated, never passed off as new.

GPUs of `ignore_gpus` are not read: `Readings.discovered` is told after each discovery which cards to skip (for
which `ignore_gpus`), and no reading is taken before the first discovery, nor while `ignore_gpus` differs from the
one the last discovery was matched against (the agent registers again, which discovers again).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import trio

from llmgw.agent import reporting
from llmgw.agent.discovery import GpuSample
from llmgw.agent.sensors import SysfsSensors
from llmgw.agent.telemetry import GpuTelemetry, smi_samples
from llmgw.tools.engine_metrics import EngineLoad
from llmgw.tools.sensors import NodeSensors


@dataclass(frozen=True)
class Reading:
    """One reading: /proc `samples`, GPU `gpus` (index order, ignored cards left out), when it was taken:
    `taken_at` on trio's clock and `unix_time` (seconds since the epoch, what `Heartbeat.sampled_at` carries);
    `engines` the engines' own load by shard id (`llmgw.agent.engine_load`; shards whose engine did not answer
    are absent); `sensors` hwmon and RAPL (empty where not measured)."""

    samples: reporting.Samples
    gpus: tuple[GpuSample, ...]
    taken_at: float
    unix_time: float
    engines: Mapping[str, EngineLoad] = field(default_factory=dict)
    sensors: NodeSensors = NodeSensors()


class Readings:
    """The latest reading of this node, renewed every `interval()` seconds by `run()` (one task per agent).

    `process_groups()` gives {shard id: process group id} of the shards to measure; `interval()` the seconds
    between readings (read before each wait, and again whenever `settings_changed()`'s event fires); `ignore()`
    the `ignore_gpus` in force. `engine_loads()`, when given, reads the engines' own load with each reading;
    `sensors` reads hwmon and RAPL (default: this machine's /sys).
    """

    def __init__(self, telemetry: GpuTelemetry, process_groups: Callable[[], dict[str, int]],
                 interval: Callable[[], float], settings_changed: Callable[[], trio.Event],
                 ignore: Callable[[], tuple[str, ...]], smi: Callable[[], tuple[GpuSample, ...]] = smi_samples,
                 engine_loads: Callable[[], Awaitable[Mapping[str, EngineLoad]]] | None = None,
                 sensors: SysfsSensors | None = None):
        self.telemetry = telemetry
        self.sensors = sensors if sensors is not None else SysfsSensors()
        self._engine_loads = engine_loads
        self._process_groups = process_groups
        self._interval = interval
        self._settings_changed = settings_changed
        self._ignore = ignore
        self._ignore_discovered: tuple[str, ...] | None = None
        self._smi = smi
        self.sampler = reporting.Sampler()
        self.gpu_source = "none"  # what discovery found the GPUs with: "nvml", "nvidia-smi" or "none"
        self.skip_cards: frozenset[int] = frozenset()
        self.latest: Reading | None = None
        self.count = 0  # readings taken so far
        self._discovered = trio.Event()
        self._taken = trio.Event()

    def discovered(self, gpu_source: str, skip_cards: frozenset[int], ignore: tuple[str, ...]) -> None:
        """Discovery found the GPUs with `gpu_source`; the cards with index in `skip_cards` (what `ignore` names)
        are not read."""
        self.gpu_source = gpu_source
        self.skip_cards = skip_cards
        self._ignore_discovered = ignore
        self._discovered.set()
        self._discovered = trio.Event()

    async def _wait_discovered(self) -> None:
        """Until the last discovery was matched against the `ignore_gpus` in force."""
        while self._ignore_discovered != self._ignore():
            await self._discovered.wait()

    async def take(self) -> Reading:
        """Read everything now and keep it as the latest. A checkpoint (nvidia-smi runs in a thread)."""
        samples = self.sampler.sample(self._process_groups())
        skip = self.skip_cards
        if self.telemetry.available:
            gpus = self.telemetry.sample(skip)
        elif self.gpu_source == "nvidia-smi":
            gpus = tuple(g for g in await trio.to_thread.run_sync(self._smi) if g.index not in skip)
        else:
            gpus = ()
        engines = await self._engine_loads() if self._engine_loads is not None else {}
        sensors = self.sensors.read(time.monotonic())  # energy over real seconds, whatever trio's clock says
        self.latest = Reading(samples, gpus, trio.current_time(), time.time(), engines, sensors)
        self.count += 1
        self._taken.set()
        return self.latest

    async def current(self) -> Reading:
        """The latest reading; waits for the first one (taken once discovery has run)."""
        await self._taken.wait()
        assert self.latest is not None
        return self.latest

    async def run(self) -> None:
        """Take a reading every `interval()` seconds, forever, starting once discovery has run. A new interval
        from the agent settings applies at once (counted from the last reading)."""
        while True:
            await self._wait_discovered()
            last = await self.take()
            while True:
                changed = self._settings_changed()
                with trio.move_on_at(last.taken_at + self._interval()):
                    await changed.wait()
                    continue  # settings changed: wait again with the interval now in force
                break
