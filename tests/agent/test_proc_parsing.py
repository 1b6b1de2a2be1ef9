"""Pure parsers of /proc and /proc/cpuinfo, the shard record format, backoff, and foreign-engine detection."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent import procfs
from llmgw.agent.inventory import CpuInfo, inventory_warnings, parse_cpuinfo
from llmgw.agent.reporting import foreign_status
from llmgw.agent.shards import ShardRecord, ShardSpec, is_same_process, next_backoff, parse_record, save_record
from llmgw.agent.supervisor import ForeignEngine, find_foreign_engines

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-h200"

# A real line (llama-server's) with the fields llmgw reads: pid 4242, comm, state, ppid, pgrp, ..., utime 1500,
# stime 300, ..., start time 98765, ..., rss 20000 pages.
STAT = ("4242 (llama-server) S 1 4242 4242 0 -1 4194560 12345 0 0 0 1500 300 0 0 20 0 9 0 98765 "
        "1234567890 20000 18446744073709551615 1 1 0 0 0 0 0 4096 17475 0 0 0 17 3 0 0 0 0 0")


def test_proc_stat_fields_are_read_after_the_last_parenthesis():
    stat = procfs.parse_proc_stat(STAT.replace("(llama-server)", "(a) b (c)"))
    assert (stat.pid, stat.comm, stat.state, stat.ppid, stat.pgrp) == (4242, "a) b (c", "S", 1, 4242)
    assert (stat.utime, stat.stime, stat.start_time, stat.rss_pages) == (1500, 300, 98765, 20000)


@pytest.mark.parametrize("text", ["", "4242 (x", "4242 (x) S 1 2", "abc (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22"])
def test_truncated_or_garbage_proc_stat_is_none(text):
    assert procfs.parse_proc_stat(text) is None


def test_the_live_process_start_time_is_stable_and_a_missing_pid_has_none():
    import os

    assert procfs.process_start_time(os.getpid()) == procfs.process_start_time(os.getpid()) is not None
    assert procfs.process_start_time(2**22 + 7) is None


def test_group_usage_sums_live_members_of_each_group_only():
    a = procfs.parse_proc_stat(STAT)
    child = procfs.parse_proc_stat(STAT.replace("4242 (llama-server) S 1", "4243 (worker) S 4242"))
    zombie = procfs.parse_proc_stat(STAT.replace("4242 (llama-server) S 1", "4244 (gone) Z 4242"))
    other = procfs.parse_proc_stat(STAT.replace("4242 (llama-server) S 1 4242", "7 (bash) S 1 7"))
    usage = procfs.group_usage([a, child, zombie, other], [4242, 99])
    assert list(usage) == [4242]
    assert usage[4242].cpu_ticks == 3600 and usage[4242].processes == 2
    assert usage[4242].resident_bytes == 40000 * procfs.PAGE_SIZE


def test_node_cpu_percent_comes_from_two_proc_stat_readings():
    before = procfs.NodeSample(*procfs.parse_cpu_times("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4"), None, None, None)
    after = procfs.NodeSample(*procfs.parse_cpu_times("cpu  200 0 150 1000 150 0 0 0 0 0\n"), None, None, None)
    assert procfs.cpu_percent_between(before, after) == pytest.approx(100 * 150 / 500)
    assert procfs.parse_cpu_times("intr 1 2 3") is None


def test_meminfo_and_loadavg_from_the_h200_capture():
    meminfo = procfs.parse_meminfo((H200 / "proc-meminfo.txt").read_text())
    assert meminfo["MemTotal"] == 131981020 * 1024 and meminfo["MemAvailable"] == 131477500 * 1024
    assert procfs.parse_loadavg("0.52 0.58 0.59 1/245 12345") == 0.52
    assert procfs.parse_loadavg("garbage") is None


def test_cpuinfo_of_the_h200_node_lists_its_vector_extensions():
    flags_line = (H200 / "proc-cpuinfo-flags.txt").read_text().splitlines()[1]
    text = "".join(f"processor\t: {n}\nmodel name\t: Intel(R) Xeon(R) Processor\n{flags_line}\n\n" for n in range(16))
    cpu = parse_cpuinfo(text)
    assert cpu.cores == 16 and cpu.model == "Intel(R) Xeon(R) Processor"
    assert {"avx2", "avx512f", "amx_tile", "avx512_bf16"} <= set(cpu.flags) and "fpu" not in cpu.flags
    assert inventory_warnings("x86_64", cpu) == ()


def test_a_cpu_without_avx2_is_a_warning_and_an_arm_cpu_is_not():
    old = parse_cpuinfo("processor : 0\nmodel name : Old Xeon\nflags : fpu sse4_2 avx\n")
    assert inventory_warnings("x86_64", old) == ("this CPU has no AVX2: llama.cpp runs several times slower on it",)
    arm = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve\nCPU part\t: 0xd40\n")
    assert arm.flags == ("asimd", "sve") and inventory_warnings("aarch64", arm) == ()
    assert parse_cpuinfo("\x00garbage") == CpuInfo(0, "", ())


def test_a_shard_record_round_trips_and_torn_files_are_refused(tmp_path):
    spec = ShardSpec("gemma-0/0", ("llama-server", "--port", "5"), 5, env={"LLAMA_API_KEY": "k"}, devices=("0",))
    save_record(tmp_path, ShardRecord(spec, 123, 456, restarts=2))
    path = tmp_path / "shards" / "gemma-0%2F0.json"
    assert parse_record(path.read_text()) == ShardRecord(spec, 123, 456, 2)
    assert parse_record(path.read_text()[:40]) is None and parse_record('{"spec": {}}') is None


def test_adoption_needs_the_same_start_time_not_only_the_same_pid():
    record = ShardRecord(ShardSpec("s", ("x",), 1), pid=77, start_time=1000)
    assert is_same_process(record, 1000)
    assert not is_same_process(record, 1001) and not is_same_process(record, None)


def test_restart_backoff_starts_at_one_second_and_doubles_up_to_a_minute():
    delays, delay = [], 0.0
    for _ in range(9):
        delay = next_backoff(delay)
        delays.append(delay)
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_engines_outside_our_process_groups_are_foreign_once_per_group():
    stats = [procfs.parse_proc_stat(STAT),
             procfs.parse_proc_stat(STAT.replace("4242 (llama-server) S 1 4242", "4300 (llama-server) S 4242 4242")),
             procfs.parse_proc_stat(STAT.replace("4242 (llama-server) S 1 4242", "5000 (python3) S 1 5000")),
             procfs.parse_proc_stat(STAT.replace("4242 (llama-server) S 1 4242", "6000 (llama-server) S 1 6000"))]
    cmdlines = {4242: ["/opt/llama-server", "--port", "8081", "-m", "/m.gguf", "--alias", "qwen"],
                4300: ["/opt/llama-server"],
                5000: ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"],
                6000: ["/opt/llama-server", "--port", "9"]}
    found = find_foreign_engines(stats, cmdlines, managed_groups={6000}, own_pid=1)
    assert [f.pid for f in found] == [4242, 5000]
    status = foreign_status(found[0])
    assert (status.shard_id, status.foreign, status.port, status.model, status.state) == (
        "foreign/4242", True, 8081, "qwen", "ready")
    assert foreign_status(ForeignEngine(1, ("x",))).port == 0
