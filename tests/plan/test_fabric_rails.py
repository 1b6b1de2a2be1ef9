"""`llmgw fabric-test`'s pure decisions: rail i with rail i, and each rail graded against its link's rate from
perftest's documented tables (tests/fixtures/hand-made/perftest-*.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.plan import Rail, grade_rail, pair_rails
from llmgw.tools import IbPort

HAND_MADE = Path(__file__).resolve().parents[1] / "fixtures" / "hand-made"


def port(ca: str, rate: float | None = 200.0, state: str = "Active") -> IbPort:
    return IbPort(ca, 1, state, rate, "InfiniBand")


def test_rails_pair_in_adapter_order_over_active_ports_and_take_the_slower_rate():
    a = [port("mlx5_1", 400.0), port("mlx5_0", 200.0), port("mlx5_2", state="Down")]
    b = [port("mlx5_0", 400.0), port("mlx5_3", 400.0), port("mlx5_4", None)]
    assert pair_rails(a, b) == [Rail(0, "mlx5_0", "mlx5_0", 200.0), Rail(1, "mlx5_1", "mlx5_3", 400.0),
                                Rail(2, None, "mlx5_4", None)]


@pytest.mark.parametrize(("fixture", "rate", "grade", "measured", "percent"), [
    ("perftest-write-bw-gbits.txt", 200.0, "ok", 196.38, 98.19),
    ("perftest-write-bw-gbits.txt", 400.0, "degraded", 196.38, 49.095),
    ("perftest-write-bw-mib-degraded.txt", 200.0, "degraded", 98.17, 49.09),
    ("perftest-write-bw-mib-degraded.txt", 100.0, "ok", 98.17, 98.17),
    ("perftest-write-bw-gbits.txt", None, "unknown", 196.38, None),
])
def test_a_rail_is_graded_by_the_best_average_against_its_link_rate(fixture, rate, grade, measured, percent):
    result = grade_rail(Rail(0, "mlx5_0", "mlx5_0", rate), (HAND_MADE / fixture).read_text())
    assert result.grade == grade
    assert result.measured_gbps == pytest.approx(measured, abs=0.01)
    assert (result.percent is None) if percent is None else result.percent == pytest.approx(percent, abs=0.01)
    assert (result.reason == "") == (grade == "ok")


def test_a_rail_without_a_table_or_a_partner_fails_with_the_reason():
    failed = grade_rail(Rail(0, "mlx5_0", "mlx5_0", 200.0), (HAND_MADE / "perftest-failed.txt").read_text())
    assert failed.grade == "failed" and failed.reason.startswith("ib_write_bw printed no result")
    assert failed.measured_gbps is None
    alone = grade_rail(Rail(2, None, "mlx5_4", None), "")
    assert alone.grade == "failed" and alone.reason == "node A has no active adapter for rail 2"
    told = grade_rail(Rail(0, "mlx5_0", "mlx5_0", 200.0), "", "on ib1: exited with status 1")
    assert told.grade == "failed" and told.reason == "on ib1: exited with status 1"
