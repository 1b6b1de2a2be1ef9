"""tests/support/leftovers.py: a test's `finally` ends the processes that name its tmp_path (engines outlive their
agent), and only those."""

from __future__ import annotations

import subprocess
import sys

from support.leftovers import kill_processes_naming

SLEEPER = "import sys, time; time.sleep(60)"


def test_only_the_processes_naming_the_path_are_killed(tmp_path) -> None:
    mine = subprocess.Popen([sys.executable, "-c", SLEEPER, str(tmp_path / "weights" / "model.gguf")])
    other = subprocess.Popen([sys.executable, "-c", SLEEPER, "/elsewhere/model.gguf"])
    try:
        assert kill_processes_naming(tmp_path) == [mine.pid]
        assert mine.wait(timeout=10) == -9
        assert other.poll() is None
    finally:
        for process in (mine, other):
            process.kill()
            process.wait()
