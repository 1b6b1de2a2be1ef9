"""Mutation kill rate of the pure cores (issue 41): mutmut over each module, against that module's own fast tests.

    .venv/bin/python bench/mutation.py [--module quotas --module xid ...] [--budget 3600] [--timeout 900]
                                       [--workers 1] [--keep]

For each target below, mutmut (PyPI `mutmut`, pinned in constraints.txt) makes its mutants of ONE source file
(operators swapped, constants changed, arguments dropped, ...) and runs, for each mutant, the tests of that
target's own test files that execute the mutated function (mutmut's per-function selection), in a process forked
from one that has imported them (so a mutant costs its tests only). A mutant is *killed* when a test fails,
*survived* when every test passes, *timeout* when the tests run past mutmut's CPU limit (15x their clean time,
plus 1 s, twice: an endless loop, so caught), *no tests* when no test of the target runs the function.

Nothing in the working tree changes: the tracked and untracked (not ignored) files are copied into a temporary
directory, where mutmut writes its `mutants/` copy, and the directory is removed at the end (`--keep` keeps it).
Each target runs at most `--timeout` seconds and all of them at most `--budget` seconds: a target stopped there
keeps the mutants it had checked; the rest are counted as *unchecked* (not in the kill rate).

Prints one row per target: mutants, killed, survived (no tests included), timeout, unchecked, kill rate =
(killed + timeout) / (mutants - unchecked), and a total; each surviving mutant (file:line and its diff) is printed
as its target ends.
Figures and the explanation of each survivor: docs/testing.md "Mutation kill rate". Several minutes per target on
one worker; `--workers 2` on a machine nobody else uses.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    """One source file to mutate, the test files that guard it, and optionally which functions to mutate.

    `functions`: fnmatch patterns on the function's name (`Class.method` for a method); empty means all of them.
    """

    source: str
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()


TARGETS: dict[str, Target] = {
    "quotas": Target("llmgw/store/quotas.py",
                     ("tests/store/test_quotas.py", "tests/store/test_quota_properties.py",
                      "tests/store/test_group_commit.py")),
    "grouping": Target("llmgw/store/grouping.py",
                       ("tests/store/test_group_limits.py", "tests/store/test_group_commit.py")),
    "deciding": Target("llmgw/control/deciding.py",
                       ("tests/control/test_decide_invariants.py", "tests/control/test_control_loop.py",
                        "tests/control/test_plan_reuse.py", "tests/control/test_effects.py")),
    "kv_events": Target("llmgw/tools/vllm_kv_events.py",
                        ("tests/tools/test_vllm_kv_events.py", "tests/tools/test_kv_mirror_properties.py")),
    "kv_blocks": Target("llmgw/control/kv_blocks.py",
                        ("tests/control/test_kv_block_rules.py", "tests/agent/test_kv_forwarding.py")),
    "validation": Target("llmgw/gateway/validation.py", ("tests/gateway/test_request_validation.py",)),
    "routing": Target("llmgw/control/routing.py",
                      ("tests/control/test_ready_routes.py", "tests/control/test_route_table_properties.py",
                       "tests/control/test_route_table.py", "tests/control/test_adapter_routes.py")),
    "routing_policies": Target("llmgw/gateway/routing_policies.py", ("tests/gateway/test_routing_policies.py",)),
    "redaction_refs": Target("llmgw/settings/refs.py",
                             ("tests/settings/test_refs.py", "tests/core/test_redaction_properties.py"),
                             ("redact_url", "_password_free")),
    "redaction_postgres": Target("llmgw/store/postgres.py",
                                 ("tests/store/test_redact_url.py", "tests/core/test_redaction_properties.py"),
                                 ("redact_url", "url_password")),
    "slurm_conf": Target("llmgw/plan/slurm_conf.py",
                         ("tests/plan/test_slurm_rendering.py", "tests/plan/test_slurm_roles.py",
                          "tests/plan/test_conf_lines.py")),
    "xid": Target("llmgw/tools/xid.py", ("tests/tools/test_xids_from_kernel_log.py",)),
}

# mutmut's exit codes per mutant (mutmut/stats.py `status_by_exit_code`, mutmut 3.8): the pytest exit code of the
# mutant's test run, or one of mutmut's own (33 no tests, 34 skipped, 36 timeout, 37 type check) or a signal.
KILLED_CODES = {1, 3, 37}
SURVIVED_CODES = {0, 5, 33}
TIMEOUT_CODES = {36, 24, -24, 152, 255}


@dataclass
class Tally:
    """The outcome of one target's mutants. `survivors`: mutant names, sorted; `other`: segfaults, suspicious."""

    mutants: int = 0
    killed: int = 0
    survived: int = 0
    timeout: int = 0
    unchecked: int = 0
    other: int = 0
    survivors: list[str] = field(default_factory=list)

    @property
    def checked(self) -> int:
        return self.mutants - self.unchecked

    @property
    def kill_rate(self) -> float | None:
        """(killed + timeout) / checked mutants, in [0, 1]; None when none was checked."""
        return (self.killed + self.timeout) / self.checked if self.checked else None

    def add(self, other: Tally) -> Tally:
        return Tally(*(getattr(self, name) + getattr(other, name)
                       for name in ("mutants", "killed", "survived", "timeout", "unchecked", "other")),
                     survivors=self.survivors + other.survivors)


def function_of(mutant: str) -> str:
    """The mutated function of a mutmut mutant name, as `name` or `Class.method`.

    `llmgw.store.quotas.x_decide__mutmut_12` -> `decide`; `llmgw.tools.vllm_kv_events.xǁKvBlocksǁapply__mutmut_3`
    -> `KvBlocks.apply` (mutmut 3's mangling: `x_` before a function, `xǁClassǁ` before a method).
    """
    mangled = mutant.partition("__mutmut_")[0].rpartition(".")[2]
    if mangled.startswith("xǁ"):
        _, cls, name = mangled.split("ǁ", 2)
        return f"{cls}.{name}"
    return mangled.removeprefix("x_")


def tally(exit_codes: Mapping[str, int | None], functions: Sequence[str] = ()) -> Tally:
    """Count a target's mutants from mutmut's `exit_code_by_key` (the `mutants/<source>.meta` JSON file).

    `functions`: fnmatch patterns (see Target); mutants of other functions are left out. A None code (mutmut had
    not run the mutant: the time ran out) counts as unchecked; an unknown code as other (mutmut's "suspicious").
    """
    result = Tally()
    for name, code in sorted(exit_codes.items()):
        if functions and not any(fnmatch.fnmatchcase(function_of(name), p) for p in functions):
            continue
        result.mutants += 1
        if code is None:
            result.unchecked += 1
        elif code in KILLED_CODES:
            result.killed += 1
        elif code in SURVIVED_CODES:
            result.survived += 1
            result.survivors.append(name)
        elif code in TIMEOUT_CODES:
            result.timeout += 1
        else:
            result.other += 1
    return result


def mutant_line(source: str, function: str, diff: str) -> int | None:
    """The line (1-based) of `source` that a mutant changes, from the diff `mutmut show` prints.

    `function`: as function_of returns. The first removed line of the diff is looked up inside that function's
    lines; None when the function or the line is not found (a diff that only adds lines, say).
    """
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    if not removed:
        return None
    node = _find_function(ast.parse(source), function.split("."))
    if node is None:
        return None
    lines = source.splitlines()
    for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
        if lines[number - 1].strip() == removed[0]:
            return number
    return None


def _find_function(tree: ast.AST, path: list[str]) -> ast.AST | None:
    for node in getattr(tree, "body", ()):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == path[0]:
            return node if len(path) == 1 else _find_function(node, path[1:])
    return None


def format_table(rows: Iterable[tuple[str, Tally]]) -> str:
    """The per-target table and a total row, as text (kill rate in percent, "-" when nothing was checked)."""
    rows = list(rows)
    total = Tally()
    for _, row in rows:
        total = total.add(row)
    out = [f"{'module':20} {'mutants':>7} {'killed':>6} {'survived':>8} {'timeout':>7} {'unchecked':>9} "
           f"{'other':>5} {'kill rate':>9}"]
    for name, row in [*rows, ("total", total)]:
        rate = "-" if row.kill_rate is None else f"{row.kill_rate * 100:.1f} %"
        out.append(f"{name:20} {row.mutants:7} {row.killed:6} {row.survived:8} {row.timeout:7} {row.unchecked:9} "
                   f"{row.other:5} {rate:>9}")
    return "\n".join(out)


def copy_tree(destination: Path) -> None:
    """Copy the work tree's tracked and untracked, not ignored, files (uncommitted edits included)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def setup_cfg(target: Target, also_copy: Sequence[str]) -> str:
    """mutmut's settings for one target (mutmut reads `[mutmut]` of setup.cfg when pyproject.toml has none).

    `also_copy`: what mutmut copies into `mutants/` beside llmgw/ and tests/ (files the tests read, such as
    examples/cluster-repo)."""
    tests = "\n    ".join(target.tests)
    copied = "".join(f"\n    {name}" for name in also_copy)
    return (f"[mutmut]\nsource_paths = llmgw\nonly_mutate = {target.source}\nalso_copy ={copied}\n"
            f"pytest_add_cli_args_test_selection =\n    {tests}\n"
            f"pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -p\n    no:randomly\n")


def run_target(tree: Path, name: str, target: Target, workers: int, seconds: float, log) -> Tally:
    """Run mutmut over one target in the copied `tree` for at most `seconds`; return its tally."""
    shutil.rmtree(tree / "mutants", ignore_errors=True)
    also_copy = sorted(p.name for p in tree.iterdir() if p.name not in {"llmgw", "tests", "mutants", "setup.cfg",
                                                                         "mutmut.log"})
    (tree / "setup.cfg").write_text(setup_cfg(target, also_copy))
    module = target.source.removesuffix(".py").replace("/", ".")
    patterns = [f"{module}.*"] if not target.functions else [
        f"{module}.{_mangled(f)}__mutmut_*" for f in target.functions]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    process = subprocess.Popen([sys.executable, "-m", "mutmut", "run", "--max-children", str(workers),
                                *(patterns if target.functions else [])],
                               cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if process.wait(timeout=max(seconds, 1)) != 0:
            print(f"  {name}: mutmut exited with {process.returncode} (a test failing on the clean copy?); "
                  "see its output", flush=True)
    except subprocess.TimeoutExpired:
        print(f"  {name}: time is up after {seconds:.0f} s, stopping mutmut", flush=True)
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    meta = tree / "mutants" / (target.source + ".meta")
    if not meta.exists():
        print(f"  {name}: mutmut wrote no results (exit {process.returncode}); see the log", flush=True)
        return Tally()
    return tally(json.loads(meta.read_text())["exit_code_by_key"], target.functions)


def _mangled(function: str) -> str:
    cls, _, name = function.rpartition(".")
    return f"xǁ{cls}ǁ{name}" if cls else f"x_{name}"


# One process prints the diffs of all of a target's survivors (`mutmut show` per mutant walks every file's results):
# mutmut's own diff, as `mutmut show` prints it, from its module mutmut.mutation.diff_apply.
_SHOW = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
path, names = sys.argv[1], sys.argv[2:]
print(json.dumps({name: get_diff_for_mutant(name, path=path) for name in names}))
"""


def show(tree: Path, target: Target, mutants: Sequence[str]) -> list[str]:
    """`file:line  name` and the diff of each surviving mutant."""
    if not mutants:
        return []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    diffs = json.loads(subprocess.run([sys.executable, "-c", _SHOW, target.source, *mutants], cwd=tree, env=env,
                                      capture_output=True, text=True, check=True).stdout)
    source = (ROOT / target.source).read_text()
    shown = []
    for mutant in mutants:
        line = mutant_line(source, function_of(mutant), diffs[mutant])
        shown.append(f"{target.source}:{line if line else '?'}  {mutant}\n{diffs[mutant]}\n")
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", choices=sorted(TARGETS), help="a target (repeat); all if none")
    parser.add_argument("--budget", type=float, default=3600, help="seconds for all targets together")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per target at most")
    parser.add_argument("--workers", type=int, default=1, help="mutants run at once (forked test processes)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = parser.parse_args()
    names = args.module or list(TARGETS)
    deadline = time.monotonic() + args.budget
    tree = Path(tempfile.mkdtemp(prefix="llmgw-mutation-"))
    rows: list[tuple[str, Tally]] = []
    try:
        copy_tree(tree)
        print(f"copy of the work tree: {tree}; mutmut's output: {tree / 'mutmut.log'}", flush=True)
        with open(tree / "mutmut.log", "a") as log:
            for name in names:
                target = TARGETS[name]
                left = deadline - time.monotonic()
                if left < 30:
                    print(f"  {name}: no time left in the budget", flush=True)
                    rows.append((name, Tally()))
                    continue
                began = time.monotonic()
                log.write(f"\n===== {name}: {target.source}\n")
                log.flush()
                row = run_target(tree, name, target, args.workers, min(args.timeout, left), log)
                print(f"  {name}: {row.mutants} mutants, {row.survived} survived, {row.unchecked} unchecked "
                      f"({time.monotonic() - began:.0f} s)", flush=True)
                rows.append((name, row))
                for shown in show(tree, target, row.survivors):
                    print(shown, flush=True)
        print()
        print(format_table(rows))
    finally:
        if args.keep:
            print(f"kept {tree}")
        else:
            shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    main()
