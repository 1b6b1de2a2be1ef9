"""bench/mutation.py's pure parts: counting mutmut's results per module and finding a surviving mutant's line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_mutation", Path(__file__).resolve().parents[2] / "bench" / "mutation.py")
mutation = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = mutation  # its dataclasses look their module up
_spec.loader.exec_module(mutation)

# the shape of mutmut 3.8's mutants/<source>.meta "exit_code_by_key"
META = {
    "llmgw.tools.xid.x_xid_info__mutmut_1": 1,
    "llmgw.tools.xid.x_xid_info__mutmut_2": 0,
    "llmgw.tools.xid.x_classify_xid__mutmut_1": 36,
    "llmgw.tools.xid.x_classify_xid__mutmut_2": None,
    "llmgw.tools.xid.x_classify_xid__mutmut_3": 33,
    "llmgw.tools.xid.xǁXidActionǁtakes_card_out__mutmut_1": 3,
    "llmgw.tools.xid.xǁXidActionǁtakes_card_out__mutmut_2": -11,
}


def test_mutmut_results_are_counted_as_killed_survived_timeout_and_unchecked():
    row = mutation.tally(META)
    assert (row.mutants, row.killed, row.survived, row.timeout, row.unchecked, row.other) == (7, 2, 2, 1, 1, 1)
    assert row.survivors == ["llmgw.tools.xid.x_classify_xid__mutmut_3", "llmgw.tools.xid.x_xid_info__mutmut_2"]
    assert row.kill_rate == pytest.approx(3 / 6)


def test_only_the_named_functions_are_counted_when_a_target_names_some():
    row = mutation.tally(META, ("XidAction.*", "xid_info"))
    assert (row.mutants, row.killed, row.survived, row.other) == (4, 2, 1, 1)
    assert mutation.tally({}, ()).kill_rate is None


@pytest.mark.parametrize("name, function", [
    ("llmgw.store.quotas.x_decide__mutmut_12", "decide"),
    ("llmgw.store.quotas.x_with_reservation__mutmut_3", "with_reservation"),
    ("llmgw.tools.vllm_kv_events.xǁKvBlocksǁapply__mutmut_3", "KvBlocks.apply"),
])
def test_a_mutant_name_gives_its_function(name, function):
    assert mutation.function_of(name) == function


SOURCE = '''\
class Window:
    def edge(self, now):
        return now - 60


def edge(now):
    start = now
    return now - 60
'''


def test_a_survivor_is_placed_on_the_line_its_diff_removes_inside_its_own_function():
    diff = "--- a.py\n+++ a.py\n@@ -1,3 +1,3 @@\n def edge(now):\n     start = now\n-    return now - 60\n+    return now + 60"
    assert mutation.mutant_line(SOURCE, "edge", diff) == 8
    assert mutation.mutant_line(SOURCE, "Window.edge", diff) == 3
    assert mutation.mutant_line(SOURCE, "missing", diff) is None
    assert mutation.mutant_line(SOURCE, "edge", "+    pass") is None


def test_the_table_has_a_row_per_module_and_a_total():
    table = mutation.format_table([("xid", mutation.tally(META)), ("empty", mutation.Tally())])
    lines = table.splitlines()
    assert lines[0].split() == ["module", "mutants", "killed", "survived", "timeout", "unchecked", "other", "kill",
                                "rate"]
    assert lines[1].split() == ["xid", "7", "2", "2", "1", "1", "1", "50.0", "%"]
    assert lines[2].split() == ["empty", "0", "0", "0", "0", "0", "0", "-"]
    assert lines[3].split() == ["total", "7", "2", "2", "1", "1", "1", "50.0", "%"]
