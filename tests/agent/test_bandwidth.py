"""The memory-bandwidth probe on this machine: bounded in time (about twice the seconds asked, plus the buffers'
first touch) and its figures present and plausible for a machine of this century."""

from __future__ import annotations

import time

from llmgw.agent.bandwidth import probe_memory_bandwidth, usable_cores


def test_the_probe_is_bounded_in_time_and_reads_gigabytes_per_second():
    began = time.perf_counter()
    measured = probe_memory_bandwidth(seconds=0.05, threads=2)
    took = time.perf_counter() - began
    assert took < 3.0 and measured.seconds <= took
    assert measured.threads == 2
    assert 0.5e9 < measured.one_core_bytes_per_second < 2e12
    assert 0.5e9 < measured.all_cores_bytes_per_second < 4e12
    assert set(measured.to_json()) == {"one_core_bytes_per_second", "all_cores_bytes_per_second", "threads", "seconds"}
    assert usable_cores() >= 1
