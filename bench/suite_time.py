"""Where the suite's time goes: the `--durations=0` lines of a `make test TEST_DURATIONS=0` log (or of any pytest
run's), summed per area, with the slowest tests (issue 40; docs/testing.md, "The suite's time").

    python bench/suite_time.py LOG [--top 10]

An area is the directory under tests/ (tests/control -> control), except that a test whose id names vLLM or Slurm
counts under "real vLLM" or "real Slurm" (they dominate and are budgeted apart). Each line `12.34s call
tests/x/test_y.py::test_z` counts once; a test's set-up, call and teardown add up. Prints a table of seconds per
area (and the share of the total) and the `--top` slowest phases.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(?:> )?\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(tests/\S+)")


def area_of(test_id: str) -> str:
    """The area of a test id (module docstring)."""
    lowered = test_id.lower()
    if "vllm" in lowered:
        return "real vLLM"
    if "slurm" in lowered:
        return "real Slurm"
    parts = test_id.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 else "(top level)"


def durations(text: str) -> list[tuple[float, str, str]]:
    """[(seconds, phase, test id)] of every durations line in `text`."""
    return [(float(m.group(1)), m.group(2), m.group(3)) for m in map(LINE.match, text.splitlines()) if m]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    rows = durations(args.log.read_text(errors="replace"))
    if not rows:
        print(f"{args.log}: no durations lines (run with --durations=0, e.g. make test TEST_DURATIONS=0)",
              file=sys.stderr)
        return 2
    per_area: dict[str, float] = defaultdict(float)
    for seconds, _phase, test_id in rows:
        per_area[area_of(test_id)] += seconds
    total = sum(per_area.values())
    print(f"{'area':<16} {'seconds':>9} {'share':>6}")
    for area, seconds in sorted(per_area.items(), key=lambda kv: -kv[1]):
        print(f"{area:<16} {seconds:>9.1f} {seconds / total:>6.1%}")
    print(f"{'total':<16} {total:>9.1f}")
    print(f"\nthe {args.top} slowest:")
    for seconds, phase, test_id in sorted(rows, reverse=True)[:args.top]:
        print(f"{seconds:>8.1f}s {phase:<8} {test_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
