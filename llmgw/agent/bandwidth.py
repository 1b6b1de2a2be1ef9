"""A node's memory bandwidth, measured once by a short bounded probe: one core alone, then every core at once.

What a CPU replica's decode speed is bound by: llama.cpp reads every weight once per token, so its tokens/s follow
the rate at which the cores read memory (`llmgw.plan.cpu_speed` estimates it from this). The probe reads, as the
engine does, rather than copies: each thread compares two equal buffers with libc's `memcmp` (through ctypes,
which releases the GIL, so threads run on their cores at once) for `seconds`, and counts both buffers' bytes as
read. Buffers are 64 MiB each (past every core's own caches), fewer bytes per thread on a machine with many cores
so that all of them together hold at most `MAX_TOTAL_BYTES`.

Bounded: each phase stops at the first pass ending after `seconds` (a pass of 64 MiB takes milliseconds); the whole
probe takes about 2 x `seconds` plus the buffers' first touch. Blocking (run it in a thread from trio).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from llmgw.tools.memory_bandwidth import MemoryBandwidth

BUFFER_BYTES = 64 << 20
MAX_TOTAL_BYTES = 1 << 30
DEFAULT_SECONDS = 0.25

_libc = ctypes.CDLL(None)
_memcmp = _libc.memcmp
_memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_memcmp.restype = ctypes.c_int


def _read_for(buffer_bytes: int, seconds: float, start: threading.Barrier, out: list[float], index: int) -> None:
    first = ctypes.create_string_buffer(buffer_bytes)  # zero-filled: every page touched before timing
    second = ctypes.create_string_buffer(buffer_bytes)
    start.wait()
    passes, began = 0, time.perf_counter()
    while True:
        _memcmp(first, second, buffer_bytes)
        passes += 1
        elapsed = time.perf_counter() - began
        if elapsed >= seconds:
            break
    out[index] = 2 * buffer_bytes * passes / elapsed


def _phase(threads: int, seconds: float) -> float:
    buffer_bytes = max(1 << 20, min(BUFFER_BYTES, MAX_TOTAL_BYTES // (2 * threads)))
    out = [0.0] * threads
    start = threading.Barrier(threads)
    workers = [threading.Thread(target=_read_for, args=(buffer_bytes, seconds, start, out, i), daemon=True)
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(out)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; `os.cpu_count()` where there is none), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def probe_memory_bandwidth(seconds: float = DEFAULT_SECONDS, threads: int | None = None) -> MemoryBandwidth:
    """Measure the read bandwidth of one core, then of `threads` cores at once (None: `usable_cores()`), `seconds`
    each. Blocking, for about 2 x `seconds`; never raises for a slow machine (the figures are just low)."""
    count = threads or usable_cores()
    began = time.perf_counter()
    one = _phase(1, seconds)
    every = _phase(count, seconds) if count > 1 else one
    return MemoryBandwidth(one, every, count, time.perf_counter() - began)


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
RECORD_NAME = "memory-bandwidth.json"


def _boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # not Linux: measured at each agent start
        return ""


def bandwidth_this_boot(state_dir: Path, seconds: float = DEFAULT_SECONDS, boot_id: Path = BOOT_ID,
                        probe: Callable[[float], MemoryBandwidth] = probe_memory_bandwidth) -> MemoryBandwidth:
    """The node's memory bandwidth, measured once per boot: what `<state_dir>/memory-bandwidth.json` holds when it
    was written since the machine booted (same kernel boot id), else `probe(seconds)`, written there. An agent that
    starts again (an upgrade, a restart asked over the stream) reports the same figures without reading memory
    beside the engines it adopts. Blocking (run it in a thread from trio); a record that cannot be read or written
    is measured again, never an error."""
    record = Path(state_dir) / RECORD_NAME
    boot = _boot_id(boot_id)
    if boot:
        try:
            kept = json.loads(record.read_text())
            if kept.get("boot_id") == boot:
                return MemoryBandwidth(float(kept["one_core_bytes_per_second"]),
                                       float(kept["all_cores_bytes_per_second"]), int(kept["threads"]),
                                       float(kept["seconds"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    measured = probe(seconds)
    if boot:
        try:
            record.write_text(json.dumps({"boot_id": boot, **measured.to_json()}) + "\n")
        except OSError:
            pass
    return measured
