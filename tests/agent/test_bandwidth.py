"""The memory-bandwidth probe on this machine: bounded in time (about twice the seconds asked, plus the buffers'
first touch), its figures present and plausible for a machine of this century, and run once per boot."""

from __future__ import annotations

import json
import time

from llmgw.agent.bandwidth import RECORD_NAME, bandwidth_this_boot, probe_memory_bandwidth, usable_cores


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


def test_the_node_is_measured_once_per_boot_and_again_after_a_reboot(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("1c4f0a3e-boot-one\n")
    state = tmp_path / "agent"
    state.mkdir()
    measured = bandwidth_this_boot(state, 0.02, boot_id=boot)
    assert measured.one_core_bytes_per_second > 0.5e9 and (state / RECORD_NAME).is_file()

    def no_probe(seconds: float):
        raise AssertionError("measured twice in one boot")

    # an agent started again in the same boot (an upgrade, a restart) reports the same figures without a probe
    assert bandwidth_this_boot(state, 0.02, boot_id=boot, probe=no_probe) == measured
    boot.write_text("77aa01b2-boot-two\n")
    again = bandwidth_this_boot(state, 0.02, boot_id=boot)
    assert again != measured and json.loads((state / RECORD_NAME).read_text())["boot_id"] == "77aa01b2-boot-two"
    (state / RECORD_NAME).write_text("{not json")  # a damaged record is measured again, never an error
    assert bandwidth_this_boot(state, 0.02, boot_id=boot).threads == usable_cores()
