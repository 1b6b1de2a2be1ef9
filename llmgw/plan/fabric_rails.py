"""`llmgw fabric-test A B`'s decisions: which adapters face each other, and how each rail is graded. Pure.

Rails are paired as NCCL pairs them on rail-aligned fabrics: node A's i-th active adapter port with node B's i-th,
both in adapter-name order (mlx5_0 with mlx5_0, mlx5_1 with mlx5_1, ...), from the ports the agents report in their
fabric discovery (sysfs / `ibstat`, `llmgw.tools.IbPort`). A rail is graded against its link's rate, the slower of
the two ports' (sysfs `rate`, "400 Gb/sec (4X NDR)": Gb/s): `ok` at `OK_FRACTION` of it or more, `degraded` below,
`failed` when the run gave no result (the tool is missing, failed, or printed no table), `unknown` when a port did
not say its rate. The measured figure is the best "BW average" of perftest's table, read by its headings
(`llmgw.tools.parse_perftest_bw`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.tools import IbPort
from llmgw.tools.perftest import parse_perftest_bw
from llmgw.tools.values import ParseError

OK_FRACTION = 0.9
"""A rail carrying at least this fraction of its link rate is ok (ib_write_bw reaches about 97 % on a healthy link)."""


@dataclass(frozen=True)
class Rail:
    """Rail `index` (0-based): node A's adapter `a` and node B's `b` ("mlx5_0"), each None when that node has no
    such rail; `rate_gbps` the slower port's rate in Gb/s (None: unknown)."""

    index: int
    a: str | None
    b: str | None
    rate_gbps: float | None


@dataclass(frozen=True)
class RailGrade:
    """One rail's verdict: `grade` "ok", "degraded", "failed" or "unknown", `measured_gbps` (None: no result),
    `percent` of the rate (None when either is unknown), `reason` a sentence ("" when ok)."""

    rail: Rail
    grade: str
    measured_gbps: float | None = None
    percent: float | None = None
    reason: str = ""


def active_rails(ports: Sequence[IbPort]) -> list[IbPort]:
    """The node's rails: its Active ports in (adapter, port) order."""
    return sorted((p for p in ports if p.state.lower() == "active"), key=lambda p: (p.ca, p.port))


def pair_rails(a_ports: Sequence[IbPort], b_ports: Sequence[IbPort]) -> list[Rail]:
    """Rail i of A with rail i of B (`active_rails`); a rail only one node has is listed with None on the other."""
    a, b = active_rails(a_ports), active_rails(b_ports)
    rails = []
    for index in range(max(len(a), len(b))):
        left = a[index] if index < len(a) else None
        right = b[index] if index < len(b) else None
        rate = (min(left.rate_gbps, right.rate_gbps) if left is not None and right is not None
                and left.rate_gbps is not None and right.rate_gbps is not None else None)
        rails.append(Rail(index, left.ca if left else None, right.ca if right else None, rate))
    return rails


def grade_rail(rail: Rail, output: str, error: str = "") -> RailGrade:
    """Grade one rail from the client's stdout (`output`) or the run's `error` sentence (which wins)."""
    if rail.a is None or rail.b is None:
        missing = "A" if rail.a is None else "B"
        return RailGrade(rail, "failed", reason=f"node {missing} has no active adapter for rail {rail.index}")
    if error:
        return RailGrade(rail, "failed", reason=error)
    try:
        measured = parse_perftest_bw(output).best_average_gbps
    except ParseError as exc:
        return RailGrade(rail, "failed", reason=f"ib_write_bw printed no result: {exc}")
    if measured is None:
        return RailGrade(rail, "failed", reason="ib_write_bw's table has no rows")
    if not rail.rate_gbps:
        return RailGrade(rail, "unknown", measured, reason="the link rate is unknown (sysfs rate unreadable)")
    percent = 100.0 * measured / rail.rate_gbps
    if percent >= OK_FRACTION * 100:
        return RailGrade(rail, "ok", measured, percent)
    return RailGrade(rail, "degraded", measured, percent,
                     reason=f"below {OK_FRACTION * 100:g} % of the {rail.rate_gbps:g} Gb/s link: check the cable, its "
                            "port counters (perfquery) and the adapter's PCIe link")
