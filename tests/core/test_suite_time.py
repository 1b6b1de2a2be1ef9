"""bench/suite_time.py: a `--durations=0` log summed per area, as CI prints it (lines quoted with "> " too)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "bench_suite_time", Path(__file__).resolve().parents[2] / "bench" / "suite_time.py")
suite_time = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite_time)

LOG = """\
============================= slowest durations ==============================
55.14s setup    tests/gateway/test_real_vllm.py::test_vllm_answers_the_openai_sdk
43.16s call     tests/control/test_slurm_fleet.py::test_lend_run_reclaim
> 20.22s call     tests/agent/test_runtime.py::test_agent_registers_first
2.50s call     tests/control/test_failover.py::test_a_standby_takes_over
0.50s teardown tests/control/test_failover.py::test_a_standby_takes_over
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def test_a_log_is_summed_per_area_with_vllm_and_slurm_apart(tmp_path, capsys):
    log = tmp_path / "ci.log"
    log.write_text(LOG)
    assert suite_time.main([str(log), "--top", "2"]) == 0
    out = capsys.readouterr().out
    table, slowest = out.split("\n\n")
    rows = {line[:16].strip(): line[16:].split()[0] for line in table.splitlines()[1:]}
    assert rows == {"real vLLM": "55.1", "real Slurm": "43.2", "agent": "20.2", "control": "3.0", "total": "121.5"}
    assert [line.split()[0] for line in slowest.splitlines()[1:]] == ["55.1s", "43.2s"]

def test_a_log_without_durations_says_how_to_get_them(tmp_path, capsys):
    log = tmp_path / "ci.log"
    log.write_text("4183 passed in 508.00s\n")
    assert suite_time.main([str(log)]) == 2
    assert "TEST_DURATIONS=0" in capsys.readouterr().err
