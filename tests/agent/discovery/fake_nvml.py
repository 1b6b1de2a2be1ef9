"""A stand-in for the `pynvml` module, built from what NVML really returned on an H200 (nvml-dump.json) and under
load (load-sample.json). Errors and constants are the real nvidia-ml-py's, so code under test catches the real
exception classes. Only what discovery and telemetry call is provided; anything else is missing, as on an old
nvidia-ml-py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pynvml

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-h200"


def h200_dump() -> dict:
    return json.loads((FIXTURES / "nvml-dump.json").read_text())


def load_readings() -> dict:
    return json.loads((FIXTURES / "load-sample.json").read_text())


class _Handle:
    def __init__(self, card: dict, index: int, parent: _Handle | None = None):
        self.card = card
        self.index = index
        self.parent = parent


class FakeNvml:
    """pynvml-shaped object over a list of card dicts in nvml-dump.json's shape.

    Extra keys a card may have: "mig_devices" (list of dicts with name, uuid, memory, processes), "fail" ({function
    name: NVMLError instance} raised on call), "readings" (list of load-sample.json readings; `advance()` moves to the
    next), "gpm_readings" (list of {metric constant name: value}, one per GPM sample taken).
    """

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    c_nvmlGpuFabricInfo_v3_t = pynvml.c_nvmlGpuFabricInfo_v3_t

    def __init__(self, cards: list[dict], *, driver: str = "580.159.04", cuda: int = 13000,
                 init_error: Exception | None = None):
        self.cards = cards
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.tick = 0
        self.initialised = 0
        self.gpm_samples_taken = 0
        self.gpm_freed = 0
        for name in dir(pynvml):
            if name.startswith("NVML_"):
                setattr(self, name, getattr(pynvml, name))

    @classmethod
    def h200(cls, **card_changes) -> FakeNvml:
        dump = h200_dump()
        card = copy.deepcopy(dump["devices"][0])
        card.update(card_changes)
        return cls([card], driver=dump["driver"], cuda=dump["cuda_driver_version"])

    def advance(self) -> None:
        self.tick += 1

    # -- lifecycle and system
    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= len(self.cards):
            raise pynvml.NVMLError_InvalidArgument()
        return _Handle(self.cards[index], index)

    # -- helpers
    def _check(self, handle: _Handle, function: str):
        error = handle.card.get("fail", {}).get(function)
        if error is not None:
            raise error

    def _reading(self, handle: _Handle) -> dict | None:
        readings = handle.card.get("readings")
        if not readings:
            return None
        return readings[min(self.tick, len(readings) - 1)]

    # -- inventory
    def nvmlDeviceGetName(self, handle):
        self._check(handle, "nvmlDeviceGetName")
        return handle.card["name"]

    def nvmlDeviceGetUUID(self, handle):
        return handle.card["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._check(handle, "nvmlDeviceGetMemoryInfo")
        memory = dict(handle.card["memory"])
        reading = self._reading(handle)
        if reading is not None:
            memory["used"] = reading["used_MiB"] * 1024**2
            memory["free"] = memory["total"] - memory["used"]
        return SimpleNamespace(**memory)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return tuple(handle.card["cc"])

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        self._check(handle, "nvmlDeviceGetEnforcedPowerLimit")
        return handle.card["power_limit_mw"]

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return handle.card["power_limit_mw"]

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=handle.card["pci"]["busId"].encode())

    def nvmlDeviceGetNumaNodeId(self, handle):
        value = handle.card.get("numa_node")
        if isinstance(value, dict):
            raise pynvml.NVMLError_NotSupported()
        return value

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._check(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used"]) for p in handle.card.get("processes", [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return []

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return handle.card["pcie_cur_gen"]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return handle.card["pcie_max_gen"]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle):
        return handle.card["pcie_gpu_max_gen"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return handle.card["pcie_cur_width"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return handle.card["pcie_max_width"]

    def nvmlDeviceGetMigMode(self, handle):
        if handle.parent is not None:
            raise pynvml.NVMLError_NotSupported()
        return list(handle.card["mig_mode"])

    def nvmlDeviceGetEccMode(self, handle):
        return list(handle.card["ecc_mode"])

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return handle.card["max_mig"]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):
        devices = handle.card.get("mig_devices", [])
        if slot >= len(devices) or devices[slot] is None:
            raise pynvml.NVMLError_NotFound()
        return _Handle(devices[slot], handle.index, parent=handle)

    def nvmlDeviceGetNvLinkState(self, handle, link):
        states = handle.card.get("nvlink_states", [])
        if link >= len(states):
            raise pynvml.NVMLError_NotSupported() if not states else pynvml.NVMLError_InvalidArgument()
        return states[link]["active"]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        return SimpleNamespace(busId=handle.card["nvlink_states"][link]["remote"])

    # -- telemetry
    def nvmlDeviceGetUtilizationRates(self, handle):
        reading = self._reading(handle)
        if reading is not None:
            return SimpleNamespace(gpu=reading["gpu"], memory=reading["mem"])
        return SimpleNamespace(**handle.card["utilization"])

    def nvmlDeviceGetPowerUsage(self, handle):
        self._check(handle, "nvmlDeviceGetPowerUsage")
        reading = self._reading(handle)
        return reading["power_mW"] if reading is not None else handle.card["power_usage_mw"]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        reading = self._reading(handle)
        return reading["temp"] if reading is not None else handle.card["temperature_gpu"]

    def nvmlDeviceGetFieldValues(self, handle, field_ids):
        """As nvidia-ml-py returns it: a ctypes array of c_nvmlFieldValue_t, each with its own nvmlReturn. Only the
        memory temperature is known: the card's "memory_temp_c" (default 36, the H200's "Memory Current Temp" in
        nvidia-smi-q.txt of the same capture), None for a card without it (NVML_ERROR_NOT_SUPPORTED in the field)."""
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, field_id in enumerate(field_ids):
            values[slot].fieldId = field_id
            celsius = handle.card.get("memory_temp_c", 36) if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP else None
            if celsius is None:
                values[slot].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                values[slot].nvmlReturn = pynvml.NVML_SUCCESS
                values[slot].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[slot].value.uiVal = celsius
        return values

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        reading = self._reading(handle)
        return reading["sm_clock"] if reading is not None else handle.card["clock_sm"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        reading = self._reading(handle)
        return reading["throttle"] if reading is not None else handle.card["throttle"]

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        if handle.card["ecc_mode"][0] != 1:
            raise pynvml.NVMLError_NotSupported()
        if (error_type, counter_type) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC):
            return handle.card.get("ecc_uncorrected", 0)
        kind = "uncorrected" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        when = "volatile" if counter_type == pynvml.NVML_VOLATILE_ECC else "aggregate"
        return handle.card.get("ecc_counts", {}).get(f"{when}_{kind}", 0)  # the H200's XML: every count 0

    # -- health (llmgw.agent.nvml_health). The H200 capture's answers: remapped_rows [0, 0, 0, 0] (nvml-dump.json);
    # the histogram, retired pages and fabric as its nvidia-smi -q -x prints them (3072 banks, none without a
    # spare; retired pages "N/A" = NotSupported; fabric all "N/A" = NotSupported: the dump's own fabric call
    # failed with a TypeError, the old signature without the struct argument).
    def nvmlDeviceGetRemappedRows(self, handle):
        self._check(handle, "nvmlDeviceGetRemappedRows")
        return tuple(handle.card["remapped_rows"])

    def nvmlDeviceGetRowRemapperHistogram(self, handle):
        values = pynvml.c_nvmlRowRemapperHistogramValues()
        for key, value in handle.card.get("row_remapper_histogram", {"max": 3072}).items():
            setattr(values, key, value)
        return values

    def nvmlDeviceGetRetiredPages(self, handle, cause):
        pages = handle.card.get("retired_pages")
        if pages is None:
            raise pynvml.NVMLError_NotSupported()
        return list(pages[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle):
        if handle.card.get("retired_pages") is None:
            raise pynvml.NVMLError_NotSupported()
        return handle.card.get("retired_pending", 0)

    def nvmlDeviceGetGpuFabricInfoV(self, handle, info_ref):
        fabric = handle.card.get("fabric_info")
        if fabric is None:
            raise pynvml.NVMLError_NotSupported()
        info = info_ref._obj  # ctypes.byref(struct), as the real binding passes it on to the library
        info.state, info.status, info.cliqueId = fabric["state"], fabric.get("status", 0), fabric["cliqueId"]
        info.healthMask = fabric.get("healthMask", 0)
        for i, byte in enumerate(fabric["clusterUuid"]):
            info.clusterUuid[i] = byte
        if hasattr(info, "healthSummary"):
            info.healthSummary = fabric.get("healthSummary", 0)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter):
        errors = handle.card["nvlink_states"][link].get("errors", {})
        names = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
        if counter not in names:
            raise pynvml.NVMLError_InvalidArgument()
        return errors.get(names[counter], 0)

    # -- GPM
    def nvmlGpmQueryDeviceSupport(self, handle):
        support = handle.card.get("gpm_supported")
        if support is None:
            raise pynvml.NVMLError_NotSupported()
        return SimpleNamespace(**support)

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(taken_at=None, card=None)

    def nvmlGpmSampleGet(self, handle, sample):
        sample.taken_at = self.gpm_samples_taken
        sample.card = handle.card
        self.gpm_samples_taken += 1
        return sample

    def nvmlGpmSampleFree(self, sample):
        self.gpm_freed += 1

    class c_nvmlGpmMetricsGet_t:
        def __init__(self):
            self.version = 0
            self.numMetrics = 0
            self.sample1 = None
            self.sample2 = None
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)]

    def nvmlGpmMetricsGet(self, request):
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        card = request.sample2.card
        readings = card.get("gpm_readings")
        values = readings[min(request.sample2.taken_at, len(readings) - 1)] if readings else card["gpm_idle"]
        names = {getattr(pynvml, name): name for name in values}
        for metric in request.metrics[:request.numMetrics]:
            if metric.metricId in names:
                metric.value = values[names[metric.metricId]]
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request
