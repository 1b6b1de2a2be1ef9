"""`make test`'s two pytest-xdist workers run each test module whole on one worker, the longest first by the last
runs' seconds (tests/conftest.py, `pytest_xdist_make_scheduler`; tests/support/suite_scheduling.py): run for real
on small modules of this suite, as a subprocess."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from support.suite_scheduling import PER_TEST, REAL_PART, SECONDS_FILE, LongestFirst, estimate, known_seconds, record

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("tests/core/test_units.py", "tests/core/test_suite_time.py")


def test_each_module_runs_whole_on_one_of_two_workers_and_the_run_records_each_modules_seconds(tmp_path):
    cache = tmp_path / "cache"
    recorded = cache / "v" / "llmgw" / "module-seconds"
    recorded.parent.mkdir(parents=True)
    recorded.write_text(json.dumps({MODULES[0]: 100.0, MODULES[1]: 300.0, "tests/gone.py": 7.0}))
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", "-o", f"cache_dir={cache}", *MODULES],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module in re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", done.stdout, re.M):
        workers[module].add(worker)
    assert set(workers) == set(MODULES), done.stdout[-3000:]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)  # split before: 27 tests on both
    after = json.loads(recorded.read_text())  # this run's seconds (a few ms each), the module not run kept
    assert after["tests/gone.py"] == 7.0 and all(0 <= after[m] < 60 for m in MODULES), after


def test_the_machine_wide_and_shared_engine_modules_are_found_from_their_text():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)  # by path: another conftest may be the module `conftest` now
    spec.loader.exec_module(conftest)
    MACHINE_WIDE, wide = conftest.MACHINE_WIDE, conftest.machine_wide_modules(ROOT)
    assert {"tests/gateway/test_real_vllm.py", "tests/gateway/test_lora_vllm_real.py", "tests/up/test_up.py",
            "tests/control/test_slurm_fleet.py", "tests/slurm/test_real_slurm.py"} <= wide
    assert "tests/control/test_precise_routing_fleet.py" not in wide  # names fake_vllm_server, a stand-in
    assert "tests/core/test_suite_scheduling.py" not in wide  # names the constant, not marked with it
    assert MACHINE_WIDE == "machine-wide"
    scopes = conftest.module_scopes(ROOT)  # the shared llama-servers' modules, one scope per engine
    assert {module: scopes[module] for module in (
        "tests/gateway/test_real_llama_server.py", "tests/gateway/test_batches_real_llama_server.py",
        "tests/gateway/test_native_dialects_real_llama_server.py", "tests/gateway/test_anthropic_real_llama_server.py",
        "tests/gateway/test_real_vllm.py")} == {
        "tests/gateway/test_real_llama_server.py": "llama-server:gemma",
        "tests/gateway/test_batches_real_llama_server.py": "llama-server:gemma",
        "tests/gateway/test_native_dialects_real_llama_server.py": "llama-server:smollm2",
        "tests/gateway/test_anthropic_real_llama_server.py": "llama-server:smollm2",
        "tests/gateway/test_real_vllm.py": MACHINE_WIDE}
    assert "tests/engines/test_llama_server_real.py" not in scopes  # starts its own engine: a scope of its own


def test_the_queue_hands_out_the_longest_scope_left_and_estimates_an_untimed_module_from_its_text(tmp_path):
    guessed = []

    def guess(module, tests):
        guessed.append((module, tests))
        return 5.0

    queue = LongestFirst({"a.py": 2.0, "w1.py": 4.0, "b.py": 5.0, "c.py": 5.0}, guess)
    for scope, ids in (("a.py", ["a.py::x", "a.py::y"]), ("wide", ["w1.py::x", "w2.py::x", "w2.py::y"]),
                       ("b.py", ["b.py::x"]), ("c.py", ["c.py::x"])):
        queue[scope] = dict.fromkeys(ids, False)
    first, work = queue.popitem(last=False)
    assert (first, work) == ("wide", {"w1.py::x": False, "w2.py::x": False, "w2.py::y": False})  # 4 + 5 guessed
    queue["late"] = {"late.py::x": False}  # a worker's scopes put back (xdist: a worker lost)
    assert [queue.popitem(last=False)[0] for _ in range(4)] == ["b.py", "c.py", "late", "a.py"]  # b, c: in order
    assert not queue and guessed == [("w2.py", 2), ("late.py", 1)]
    plain, real = tmp_path / "test_plain.py", tmp_path / "test_real.py"
    plain.write_text("def test_x():\n    assert 1\n")
    real.write_text("def test_x(llama_server_binary):\n    pass\n")
    assert estimate(plain, 10) == pytest.approx(10 * PER_TEST)
    assert estimate(real, 10) == pytest.approx(10 * PER_TEST + REAL_PART)
    assert estimate(tmp_path / "missing.py", 0) == REAL_PART


def test_a_runs_record_replaces_the_seconds_of_the_modules_it_ran_and_keeps_the_others():
    durations = [("t/a.py::x", 1.25), ("t/a.py::x", 0.5), ("t/a.py::y[1]", 1.0), ("t/b.py::z", 0.125)]
    assert record({"t/a.py": 99.0, "t/c.py": 3.0}, durations) == {"t/a.py": 2.75, "t/b.py": 0.12, "t/c.py": 3.0}


def test_a_clean_clone_orders_by_the_seconds_kept_in_the_repository_and_a_cache_of_its_own_comes_first(tmp_path):
    (tmp_path / "tests").mkdir()
    assert known_seconds(tmp_path, {}) == {}  # no file: the estimate orders the run
    (tmp_path / SECONDS_FILE).write_text(json.dumps({"tests/a.py": 30.0, "tests/b.py": 5, "tests/c.py": "x"}))
    assert known_seconds(tmp_path, {}) == {"tests/a.py": 30.0, "tests/b.py": 5.0}  # a value not a number left out
    assert known_seconds(tmp_path, {"tests/b.py": 50.0}) == {"tests/a.py": 30.0, "tests/b.py": 50.0}
    (tmp_path / SECONDS_FILE).write_text("not json")
    assert known_seconds(tmp_path, {"tests/b.py": 1.0}) == {"tests/b.py": 1.0}


def test_the_seconds_kept_in_the_repository_name_modules_that_exist():
    kept = known_seconds(ROOT, {})
    assert kept, f"{SECONDS_FILE} is missing or empty: `make suite-seconds` after a whole run writes it"
    missing = sorted(m for m in kept if not (ROOT / m).is_file())
    assert len(missing) <= len(kept) // 10, f"{SECONDS_FILE} names modules that are gone: {missing[:10]} (rewrite it)"
