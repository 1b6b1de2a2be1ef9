"""Sizes and durations as operators write them in settings."""

import pytest

from llmgw.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512Mi", 512 * 1024**2),
        ("16Gi", 16 * 1024**3),
        ("16384Mi", 16 * 1024**3),
        ("16GiB", 16 * 1024**3),
        ("1.5T", 1_500_000_000_000),
        ("2k", 2000),
        ("100", 100),
        (4096, 4096),
    ],
)
def test_sizes_are_normalised_to_bytes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "16 Gigs", "-1Gi", "1e3", "Gi", True, -5])
def test_a_value_that_is_not_a_size_is_refused_with_the_value_in_the_message(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500ms", 0.5), ("2s", 2.0), ("5m", 300.0), ("1.5h", 5400.0), ("1d", 86400.0), (3, 3.0)],
)
def test_durations_are_normalised_to_seconds(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "5 minutes", "-2s", "1w", False])
def test_a_value_that_is_not_a_duration_is_refused(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_sizes_and_durations_print_back_readably():
    assert format_size(16 * 1024**3) == "16Gi"
    assert format_size(1536) == "1.5Ki"
    assert format_size(100) == "100"
    assert format_duration(0.25) == "250ms"
    assert format_duration(90) == "1m30s"
    assert format_duration(7200) == "2h"
