"""The import contracts of pyproject.toml (what `lint-imports` checks), run with import-linter's own contract
classes on llmgw's real import graph (grimp): they hold today, every package and top-level module of llmgw is in
the layers contract, and an import that closes a cycle anywhere (between two packages, or between two modules of
one package) breaks at least one contract; so does the console importing a module of the control plane other
than its view."""

from __future__ import annotations

import itertools
import pkgutil
from copy import deepcopy
from pathlib import Path

import grimp
import pytest
from importlinter import api
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.contracts.protected import ProtectedContract

import llmgw

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
CONTRACT_TYPES = {c.type_name: c for c in (AcyclicSiblingsContract, ForbiddenContract, IndependenceContract,
                                           LayersContract, ProtectedContract)}
CONSOLE_CONTRACT = "The console reads the control plane through its view only (llmgw.control.view)"


@pytest.fixture(scope="module")
def configuration() -> dict:
    return api.read_configuration(str(PYPROJECT))


@pytest.fixture(scope="module")
def graph(configuration) -> grimp.ImportGraph:
    session = configuration["session_options"]
    return grimp.build_graph(*session["root_packages"], include_external_packages=True, cache_dir=None)


def broken_contracts(configuration: dict, graph: grimp.ImportGraph) -> list[str]:
    """The names of the contracts `graph` breaks (each checked on its own copy, as `lint-imports` does)."""
    broken = []
    for options in configuration["contracts_options"]:
        contract = CONTRACT_TYPES[options["type"]](name=options["name"],
                                                   session_options=configuration["session_options"],
                                                   contract_options=options)
        if not contract.check(deepcopy(graph), verbose=False).kept:
            broken.append(options["name"])
    return broken


def top_level() -> set[str]:
    """Every package and top-level module of llmgw, as `llmgw.<name>`."""
    return {f"llmgw.{m.name}" for m in pkgutil.iter_modules(llmgw.__path__)}


def layered(configuration: dict) -> set[str]:
    """The modules the layers contracts name, as `llmgw.<name>`."""
    named = set()
    for options in configuration["contracts_options"]:
        if options["type"] != "layers":
            continue
        containers = options.get("containers") or [""]
        for layer, container in itertools.product(options["layers"], containers):
            for name in layer.replace(":", "|").split("|"):
                named.add(f"{container}.{name.strip()}" if container else name.strip())
    return named


def test_the_contracts_hold_on_llmgw_as_it_is(configuration, graph):
    assert broken_contracts(configuration, graph) == []
    assert {o["type"] for o in configuration["contracts_options"]} <= set(CONTRACT_TYPES)


def test_every_package_and_top_level_module_of_llmgw_is_in_the_layers_contract(configuration):
    packages = top_level()
    assert {"llmgw.cli", "llmgw.console", "llmgw.control", "llmgw.errors", "llmgw.routes"} <= packages
    assert sorted(packages - layered(configuration)) == [], "put each new package or module in a layer"
    assert sorted(layered(configuration) - packages) == [], "a layer names a package that does not exist"


def test_a_cycle_between_any_two_packages_breaks_a_contract(configuration, graph):
    # every pair, whether or not one imports the other today: both directions added, so a cycle in any case
    unbroken = []
    for a, b in itertools.combinations(sorted(top_level()), 2):
        cyclic = deepcopy(graph)
        cyclic.add_import(importer=a, imported=b)
        cyclic.add_import(importer=b, imported=a)
        if not broken_contracts(configuration, cyclic):
            unbroken.append((a, b))
    assert unbroken == []


def test_a_cycle_between_two_modules_of_any_package_breaks_a_contract(configuration, graph):
    packages = sorted(p for p in graph.modules if p.startswith("llmgw") and graph.find_children(p))
    checked = []
    for package in packages:
        children = sorted(graph.find_children(package))
        pairs = [(a, b) for a, b in itertools.permutations(children, 2)
                 if graph.direct_import_exists(importer=a, imported=b)]
        if not pairs:
            continue
        importer, imported = pairs[0]
        cyclic = deepcopy(graph)
        cyclic.add_import(importer=imported, imported=importer)
        assert broken_contracts(configuration, cyclic), f"{imported} -> {importer} closes a cycle in {package}"
        checked.append(package)
    assert {"llmgw.control", "llmgw.gateway", "llmgw.agent", "llmgw.console", "llmgw.cli"} <= set(checked)


def test_the_console_imports_of_the_control_plane_only_its_view(configuration, graph):
    console = {"llmgw.console", *graph.find_descendants("llmgw.console")}
    control = {"llmgw.control", *graph.find_descendants("llmgw.control")}
    imported = {m for c in console for m in graph.find_modules_directly_imported_by(c) if m in control}
    assert imported == {"llmgw.control.view"}
    assert not graph.chain_exists(importer="llmgw.control", imported="llmgw.console", as_packages=True)
    reaching = deepcopy(graph)
    reaching.add_import(importer="llmgw.console.views", imported="llmgw.control.state")
    assert broken_contracts(configuration, reaching) == [CONSOLE_CONTRACT]
