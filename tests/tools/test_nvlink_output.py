"""`nvidia-smi nvlink -s` and `-e` on real captures (sources: tests/fixtures/README.md)."""

from __future__ import annotations

import pytest

from fixture_files import fixture
from llmgw.tools import ParseError, parse_nvlink_errors, parse_nvlink_status


@pytest.mark.parametrize("path, cards, links, speed", [
    ("gpud/nvlink-s-8xa100.txt", 8, 12, 25.0),
    ("nvidia_gpu_exporter/nvlink-s-h100-590.txt", 1, 18, 26.562),
    ("nvidia-h200/nvidia-smi-nvlink-s.txt", 0, 0, None),
])
def test_link_speeds_of_each_capture(path, cards, links, speed):
    found = parse_nvlink_status(fixture(path))
    assert len(found) == cards
    for card in found:
        assert len(card.links) == links and {link.speed_gbytes for link in card.links} == {speed}
        assert card.uuid.startswith("GPU-") and all(link.active for link in card.links)


def test_an_inactive_link_has_no_speed():
    text = fixture("gpud/nvlink-s-8xa100.txt").replace("Link 3: 25 GB/s", "Link 3: <inactive>", 1)
    links = parse_nvlink_status(text)[0].links
    assert [link.link for link in links if not link.active] == [3]


def test_error_counters_per_link_by_their_printed_names():
    (card,) = parse_nvlink_errors(fixture("ml-engineering/nvlink-e-h100-excerpt.txt"))
    assert [link.link for link in card.links] == [0, 1, 17]
    assert card.links[0].counters == {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
    assert all(link.errors == 0 for link in card.links)
    assert parse_nvlink_errors(fixture("nvidia-h200/nvidia-smi-nvlink-e.txt")) == ()


def test_counters_that_grew_are_summed_and_placeholders_read_none():
    text = fixture("ml-engineering/nvlink-e-h100-excerpt.txt").replace("Link 1: CRC Errors: 0",
                                                                       "Link 1: CRC Errors: 1523")
    text = text.replace("Link 17: Replay Errors: 0", "Link 17: Replay Errors: N/A")
    (card,) = parse_nvlink_errors(text)
    assert card.links[1].errors == 1523 and card.links[2].counters["Replay Errors"] is None


@pytest.mark.parametrize("text", ["Link 0: 25 GB/s", "GPU 0: X (UUID: GPU-1)\nsomething else entirely"])
def test_lines_outside_the_format_raise_parse_error_with_the_line(text):
    with pytest.raises(ParseError, match="line"):
        parse_nvlink_status(text)
