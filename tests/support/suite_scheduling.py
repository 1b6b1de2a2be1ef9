"""The order in which `make test`'s pytest-xdist workers take the test modules (issue 40; tests/conftest.py,
`pytest_xdist_make_scheduler`): the longest first, so that neither worker is left alone with a long module at the end.

A worker takes the next scope (a module, or the `MACHINE_WIDE` group of modules) when it has at most two tests left,
so a run's end is set by the last scopes handed out: with the longest first (LPT), the last ones are short and both
workers finish about together. pytest-xdist's own order (most tests first) handed out the real-part modules last:
they have few tests each (tests/install/test_node_add.py: 7 tests, over a minute).

A scope's seconds are those the last runs measured (`record`, kept in pytest's cache under `CACHE_KEY` by the
controller at the end of each run); on a clean clone (CI's), which has no cache, those of `SECONDS_FILE`, a record
kept in the repository (`make suite-seconds` writes it from this checkout's cache after a whole run); a module
neither has timed is estimated from its text (`estimate`): `PER_TEST` seconds a test, `REAL_PART` more when it
names a real part (a process, an engine, hosts). Pure, but for `estimate` and `known_seconds`, which read files.
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

SECONDS_FILE = "tests/module-seconds.json"
"""The module seconds kept in the repository (relative to its root): {module path: seconds}, as `record` makes
them, for runs without a cache of their own."""
CACHE_KEY = "llmgw/module-seconds"
"""pytest's cache key (`config.cache`) of {module path: seconds of set-up, call and teardown in its last run}."""
PER_TEST = 0.02
"""Seconds a test of a module no run has timed counts for."""
REAL_PART = 20.0
"""Seconds more a module no run has timed counts for when its text names a real part (`_REAL_PART`)."""

_REAL_PART = re.compile(r"Popen|open_process|subprocess\.run|sys\.executable|llama_server_binary|ssh_hosts|netns_lab|"
                        r"ControlPlane|postgres|UpProcess|serving_process|llmgw_processes|mark\.slow|vllm_|"
                        r"fake_engine|settings_repo|weights_mirror")


def known_seconds(root: Path, cached: Mapping[str, float] | None) -> dict[str, float]:
    """{module: seconds} to order a run by: `SECONDS_FILE` under `root` (when it is there and reads as such),
    overridden by `cached` (this checkout's own last runs). A file that does not read is left out (the order is
    then the estimate's, never an error)."""
    import json

    try:
        kept = json.loads((root / SECONDS_FILE).read_text())
    except (OSError, ValueError):
        kept = {}
    if not isinstance(kept, dict):
        kept = {}
    kept = {str(k): float(v) for k, v in kept.items() if isinstance(v, (int, float))}
    return {**kept, **(cached or {})}


def estimate(path: Path, tests: int) -> float:
    """Seconds a module no run has timed is taken to need: `PER_TEST` per test, plus `REAL_PART` when its text names
    a real part. A file that cannot be read counts as real-part (first is the safe side)."""
    try:
        real = bool(_REAL_PART.search(path.read_text(errors="replace")))
    except OSError:
        real = True
    return PER_TEST * tests + (REAL_PART if real else 0.0)


class LongestFirst(OrderedDict):
    """pytest-xdist's work queue ({scope: {test id: done}}) that hands out the longest scope left: xdist takes the
    next with `popitem(last=False)`. A scope's seconds are the sum over its modules of `seconds[module]` (the last
    runs' record) where known, else `guess(module, its number of tests)`; worked out once per scope. Equals go in
    collection order."""

    def __init__(self, seconds: Mapping[str, float], guess: Callable[[str, int], float]) -> None:
        super().__init__()
        self._seconds, self._guess, self._known = seconds, guess, {}

    def scope_seconds(self, scope: str) -> float:
        if scope not in self._known:
            tests = Counter(nodeid.split("::", 1)[0] for nodeid in self[scope])
            self._known[scope] = sum(self._seconds[m] if m in self._seconds else self._guess(m, n)
                                     for m, n in tests.items())
        return self._known[scope]

    def popitem(self, last: bool = True) -> tuple[str, dict[str, bool]]:
        scope = max(self, key=self.scope_seconds)
        return scope, self.pop(scope)


def record(previous: Mapping[str, float], durations: Iterable[tuple[str, float]]) -> dict[str, float]:
    """`previous` ({module: seconds}) with each module of `durations` ([(test id, seconds of one phase)]) replaced by
    the sum of its phases this run; modules not run this time keep their seconds."""
    measured: dict[str, float] = {}
    for nodeid, duration in durations:
        module = nodeid.split("::", 1)[0]
        measured[module] = measured.get(module, 0.0) + duration
    return {**previous, **{module: round(total, 2) for module, total in measured.items()}}
