"""perftest bandwidth tables read by their headings, in Gb/sec and MiB/sec (hand-made from perftest's format
strings; no public capture was found)."""

from __future__ import annotations

import pytest

from fixture_files import fixture
from llmgw.tools import ParseError, parse_perftest_bw


def test_a_report_gbits_run_gives_its_device_link_and_bandwidth():
    result = parse_perftest_bw(fixture("hand-made/perftest-write-bw-gbits.txt"))
    assert result.test == "RDMA_Write BW Test" and result.device == "mlx5_0" and result.unit == "Gb/sec"
    assert result.settings["Link type"] == "IB" and result.settings["Number of qps"] == "1"
    (row,) = result.rows
    assert (row.size_bytes, row.iterations, row.peak_gbps, row.average_gbps) == (65536, 5000, 196.42, 196.38)
    assert row.columns["MsgRate[Mpps]"] == 0.374557


def test_a_mib_per_second_sweep_converts_to_gbits_and_shows_a_rail_at_half_rate():
    result = parse_perftest_bw(fixture("hand-made/perftest-write-bw-mib-degraded.txt"))
    assert result.unit == "MiB/sec" and [r.size_bytes for r in result.rows] == [2, 1024, 65536, 8388608]
    assert result.best_average_gbps == pytest.approx(11702.88 * 1048576 * 8 / 1e9)
    assert 95 < result.best_average_gbps < 100  # half of a 200 Gb/s HDR rail


def test_columns_are_read_by_heading_not_position():
    text = fixture("hand-made/perftest-write-bw-gbits.txt").replace(
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
        " #bytes     #iterations    BW average[Gb/sec]    BW peak[Gb/sec]   MsgRate[Mpps]")
    (row,) = parse_perftest_bw(text).rows
    assert (row.average_gbps, row.peak_gbps) == (196.42, 196.38)


def test_a_failed_run_raises_with_its_first_line():
    with pytest.raises(ParseError, match="Couldn't connect"):
        parse_perftest_bw(fixture("hand-made/perftest-failed.txt"))


def test_an_unknown_unit_raises():
    text = fixture("hand-made/perftest-write-bw-gbits.txt").replace("Gb/sec", "furlongs")
    with pytest.raises(ParseError, match="unit"):
        parse_perftest_bw(text)
