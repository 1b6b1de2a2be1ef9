"""GPU telemetry every `telemetry_interval`: NVML readings per card, and GPM metrics on Hopper and newer.

Per card: utilisation, memory used, power draw and limit, temperature (and the HBM's, where NVML's field
NVML_FI_DEV_MEMORY_TEMP answers), SM clock, clock-event reasons, volatile
uncorrected ECC errors. GPM (NVML's GPU Performance Monitoring: SM active, SM occupancy, tensor activity, DRAM
bandwidth, each 0-100) is computed between two GPM samples a period apart: each call of `sample()` takes a new
GPM sample and reports the metrics since the previous call, so the first call has none (absent, never 0). Cost
measured on the H200: about 9 microseconds for utilisation+memory+power+temperature (nvml-dump.json `sample4_us`).

Node CPU use, load, memory and each shard's process-group CPU and resident memory are measured from /proc by
`llmgw.agent.reporting.Sampler` (over `llmgw.agent.procfs`); this module adds the GPUs beside it.

When NVML is missing but nvidia-smi works, `smi_samples(run)` reads the same values (but GPM) from
`nvidia-smi -q -x` (a process start, about 0.1-1 s: use it only at heartbeat intervals of seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from llmgw.agent.discovery import GpuSample, load_nvml, parse_smi_xml, run_tool
from llmgw.agent.discovery.node import ToolOutput

_LOAD = object()
# nvmlValueType_t -> the member of nvmlValue_t holding the value (nvml.h)
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# (GpuSample field, pynvml constant name) of the GPM metrics reported.
GPM_METRICS = (
    ("sm_active_percent", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_percent", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_percent", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_bandwidth_percent", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)


class GpuTelemetry:
    """Samples every GPU through NVML. Create with `open_gpu_telemetry()`; call `sample()` once per heartbeat
    (blocking, microseconds per card; fine to call from a trio task directly or via `trio.to_thread`), and
    `close()` at the end. With no NVML (a CPU node) `sample()` returns () and `available` is False.

    `warnings` lists each distinct NVML failure once ("nvmlDeviceGetPowerUsage on GPU 0: ..."); unsupported
    readings (NVMLError_NotSupported) are silently absent.
    """

    def __init__(self, nvml: Any | None):
        self._nvml = nvml
        self._handles: list[tuple[int, Any]] = []
        self._gpm_previous: dict[int, Any] = {}
        self._gpm_supported: set[int] = set()
        self.warnings: list[str] = []
        self.available = False
        if nvml is None:
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self.warnings.append(f"NVML: no NVIDIA driver or library here ({exc})")
            self._nvml = None
            return
        self.available = True
        count = self._call("the system", "nvmlDeviceGetCount") or 0
        for index in range(count):
            handle = self._call(f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            self._handles.append((index, handle))
            support = self._call(f"GPU {index}", "nvmlGpmQueryDeviceSupport", handle, quiet=True)
            if support is not None and getattr(support, "isSupportedDevice", 0):
                self._gpm_supported.add(index)

    def _call(self, where: str, function: str, *args: Any, quiet: bool = False) -> Any:
        nvml = self._nvml
        fn: Callable[..., Any] | None = getattr(nvml, function, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            not_supported = getattr(nvml, "NVMLError_NotSupported", ())
            if not quiet and not (not_supported and isinstance(exc, not_supported)):
                message = f"NVML: {function} on {where} failed: {exc}"
                if message not in self.warnings:
                    self.warnings.append(message)
            return None

    def _gpm(self, index: int, handle: Any) -> dict[str, float]:
        """GPM metrics between the previous call's sample and a new one; {} on the first call or when unsupported."""
        nvml = self._nvml
        where = f"GPU {index}"
        if index not in self._gpm_supported:
            return {}
        sample = self._call(where, "nvmlGpmSampleAlloc")
        if sample is None or self._call(where, "nvmlGpmSampleGet", handle, sample) is None:
            return {}
        previous = self._gpm_previous.get(index)
        self._gpm_previous[index] = sample
        if previous is None:
            return {}
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = previous
        request.sample2 = sample
        for slot, (_, constant) in enumerate(GPM_METRICS):
            request.metrics[slot].metricId = getattr(nvml, constant)
        result = self._call(where, "nvmlGpmMetricsGet", request)
        self._call(where, "nvmlGpmSampleFree", previous, quiet=True)
        if result is None:
            return {}
        out = {}
        for slot, (name, _) in enumerate(GPM_METRICS):
            metric = result.metrics[slot]
            if getattr(metric, "nvmlReturn", 0) == 0:
                out[name] = float(metric.value)
        return out

    def _memory_temperature(self, where: str, handle: Any) -> float | None:
        """The card's memory (HBM) temperature in degrees C: NVML's field NVML_FI_DEV_MEMORY_TEMP through
        `nvmlDeviceGetFieldValues` (one c_nvmlFieldValue_t: its own `nvmlReturn`, a `valueType` naming the member of
        its `value` union). None where the card does not measure it (the field's return is not NVML_SUCCESS)."""
        nvml = self._nvml
        field_id = getattr(nvml, "NVML_FI_DEV_MEMORY_TEMP", None)
        if field_id is None:
            return None
        got = self._call(where, "nvmlDeviceGetFieldValues", handle, [field_id])
        if not got or int(got[0].nvmlReturn) != 0:
            return None
        member = _VALUE_MEMBERS.get(int(got[0].valueType))
        return float(getattr(got[0].value, member)) if member is not None else None

    def foreign_pids(self, our_pids: Collection[int], skip: Collection[int] = ()) -> dict[int, tuple[int, ...]]:
        """{card index: processes on it now that llmgw did not start}, for every card not in `skip`. Cheap (one
        NVML process list per card): the agent calls it on every heartbeat, so a card held by another process
        is out of placement only while that process holds it."""
        if self._nvml is None:
            return {}
        out = {}
        for index, handle in self._handles:
            if index in skip:
                continue
            pids: set[int] = set()
            for function in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                for process in self._call(f"GPU {index}", function, handle, quiet=True) or ():
                    pid = getattr(process, "pid", None)
                    if isinstance(pid, int) and pid not in our_pids:
                        pids.add(pid)
            out[index] = tuple(sorted(pids))
        return out

    def sample(self, skip: Collection[int] = ()) -> tuple[GpuSample, ...]:
        """One reading per card, in index order, but for the cards whose index is in `skip` (ignore_gpus: NVML is
        not asked about them at all). Values NVML cannot give are None."""
        if self._nvml is None:
            return ()
        nvml = self._nvml
        samples = []
        for index, handle in self._handles:
            if index in skip:
                continue
            where = f"GPU {index}"
            rates = self._call(where, "nvmlDeviceGetUtilizationRates", handle)
            memory = self._call(where, "nvmlDeviceGetMemoryInfo", handle)
            power = self._call(where, "nvmlDeviceGetPowerUsage", handle)
            limit = self._call(where, "nvmlDeviceGetEnforcedPowerLimit", handle)
            reasons = self._call(where, "nvmlDeviceGetCurrentClocksEventReasons", handle)
            if reasons is None:
                reasons = self._call(where, "nvmlDeviceGetCurrentClocksThrottleReasons", handle, quiet=True)
            ecc = self._call(where, "nvmlDeviceGetTotalEccErrors", handle,
                             nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
            temperature = self._call(where, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
            clock = self._call(where, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)
            memory_temperature = self._memory_temperature(where, handle)
            samples.append(GpuSample(
                index=index,
                utilization_percent=float(rates.gpu) if rates is not None else None,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                power_draw_watts=power / 1000.0 if power is not None else None,
                power_limit_watts=limit / 1000.0 if limit is not None else None,
                temperature_celsius=float(temperature) if temperature is not None else None,
                sm_clock_mhz=int(clock) if clock is not None else None,
                clock_event_reasons=int(reasons) if reasons is not None else None,
                ecc_uncorrected=int(ecc) if ecc is not None else None,
                memory_temperature_celsius=memory_temperature,
                **self._gpm(index, handle),
            ))
        return tuple(samples)

    def close(self) -> None:
        """Free GPM samples and shut NVML down (idempotent)."""
        if self._nvml is None:
            return
        for sample in self._gpm_previous.values():
            self._call("the system", "nvmlGpmSampleFree", sample, quiet=True)
        self._gpm_previous.clear()
        self._call("the system", "nvmlShutdown", quiet=True)
        self._nvml = None

    def __enter__(self) -> GpuTelemetry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_gpu_telemetry(nvml: Any = _LOAD) -> GpuTelemetry:
    """A `GpuTelemetry` over `nvml` (default: the installed `pynvml`; None: no NVML, samples nothing). Blocking
    (nvmlInit, tens of milliseconds). Use as a context manager or call `close()`."""
    return GpuTelemetry(load_nvml() if nvml is _LOAD else nvml)


def smi_samples(run: Callable[[list[str]], ToolOutput | None] = run_tool) -> tuple[GpuSample, ...]:
    """GPU readings from `nvidia-smi -q -x` for nodes without NVML; () when the tool is missing or fails."""
    out = run(["nvidia-smi", "-q", "-x"])
    if out is None or out.exit_code != 0:
        return ()
    return parse_smi_xml(out.text).samples
