"""`make test`'s two pytest-xdist workers run each test module whole on one worker (tests/conftest.py,
`pytest_xdist_make_scheduler`): run for real on two small modules of this suite, as a subprocess."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("tests/core/test_units.py", "tests/core/test_suite_time.py")


def test_each_module_runs_whole_on_one_of_two_workers():
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider", *MODULES],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module in re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", done.stdout, re.M):
        workers[module].add(worker)
    assert set(workers) == set(MODULES), done.stdout[-3000:]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)  # split before: 27 tests on both


def test_the_machine_wide_modules_are_found_from_their_text():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)  # by path: another conftest may be the module `conftest` now
    spec.loader.exec_module(conftest)
    MACHINE_WIDE, wide = conftest.MACHINE_WIDE, conftest.machine_wide_modules(ROOT)
    assert {"tests/gateway/test_real_vllm.py", "tests/gateway/test_lora_vllm_real.py", "tests/up/test_up.py",
            "tests/control/test_slurm_fleet.py", "tests/slurm/test_real_slurm.py"} <= wide
    assert "tests/control/test_precise_routing_fleet.py" not in wide  # names fake_vllm_server, a stand-in
    assert MACHINE_WIDE == "machine-wide"
