"""Run the tests once seen failing under load, again and again under a CPU burner, and print pass counts per test.

    PYTHONPATH=. .venv/bin/python bench/flaky_repeat.py                     # each test 20 times, 2 burners
    PYTHONPATH=. .venv/bin/python bench/flaky_repeat.py --repeat 5 --burners 2 --logs /tmp/flaky
    PYTHONPATH=. .venv/bin/python bench/flaky_repeat.py tests/x.py::test_y  # other tests

Each run is its own `pytest -q -x -p no:cacheprovider TEST` (a fresh process, as `make test` starts them), the tests
taken in turn (round robin) so that each sees the same mix of load. The burners are `--burners` processes spinning
a busy loop (one per core of a 2-core machine by default); each ends by itself after `--burn-limit` seconds and all
are killed when the runs end, so the load is bounded whatever happens. A failed run's output goes to
`--logs/<test>-<n>.txt` (its last lines are printed too). Issue 43 item 4; the counts measured are in
docs/testing.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLAKY = (
    "tests/control/test_failover.py::"
    "test_a_standby_takes_over_from_a_killed_leader_and_nothing_is_placed_twice_refused_late_or_lost",
    "tests/gateway/test_gateway_workers.py::"
    "test_quotas_are_exact_and_usage_complete_across_two_workers_with_one_killed[postgresql]",
    "tests/gateway/test_real_llama_server.py::test_a_429_for_concurrency_is_retried_by_the_sdk",
    "tests/control/test_server_sigterm.py::test_ctrl_c_while_the_gateway_workers_start_exits_0_without_a_traceback",
    "tests/control/test_rolling_update.py::test_a_changed_model_rolls_without_a_moment_unserved",
)


def burn(until: float) -> None:
    """Spin until `until` (time.monotonic seconds)."""
    while time.monotonic() < until:
        for _ in range(100_000):
            pass


def short_name(test: str) -> str:
    """A file-name-safe short name of a test id: the function's name, with its parameters."""
    name = test.rsplit("::", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]


def run_once(test: str, timeout: float) -> tuple[bool, float, str]:
    """(passed, seconds, output) of one pytest run of `test`; a run past `timeout` seconds counts as failed."""
    began = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        output, passed = done.stdout + done.stderr, done.returncode == 0
    except subprocess.TimeoutExpired as exc:
        output = f"{exc.stdout or ''}{exc.stderr or ''}\n(timed out after {timeout:g} s)"
        passed = False
    return passed, time.monotonic() - began, output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="*", default=list(FLAKY), help="pytest ids (default: issue 43's four and test_rolling_update)")
    parser.add_argument("--repeat", type=int, default=20, help="runs of each test (default 20)")
    parser.add_argument("--burners", type=int, default=2, help="busy-loop processes (default 2; 0: no load)")
    parser.add_argument("--burn-limit", type=float, default=3600.0, help="seconds each burner may run at most")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/flaky_repeat"), help="where failed runs' output goes")
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    until = time.monotonic() + args.burn_limit
    burners = [multiprocessing.Process(target=burn, args=(until,), daemon=True) for _ in range(args.burners)]
    for burner in burners:
        burner.start()
    results: dict[str, list[tuple[bool, float]]] = {test: [] for test in args.tests}
    try:
        for n in range(1, args.repeat + 1):
            for test in args.tests:
                passed, took, output = run_once(test, args.timeout)
                results[test].append((passed, took))
                word = "passed" if passed else "FAILED"
                print(f"run {n}/{args.repeat} {short_name(test)}: {word} in {took:.1f} s", flush=True)
                if not passed:
                    log = args.logs / f"{short_name(test)}-{n}.txt"
                    log.write_text(output)
                    tail = "\n".join(output.splitlines()[-15:])
                    print(f"  output in {log}; its last lines:\n{tail}", flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.join()
    print(f"\n{'test':80} {'passed':>9} {'mean s':>7}")
    for test, runs in results.items():
        passed = sum(ok for ok, _ in runs)
        mean = sum(took for _, took in runs) / len(runs) if runs else 0.0
        print(f"{short_name(test):80} {passed:>4}/{len(runs):<4} {mean:>7.1f}")
    return 0 if all(ok for runs in results.values() for ok, _ in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
