"""Fixtures of the settings tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from settings_trees import copy_example


@pytest.fixture
def example_tree(tmp_path: Path) -> Path:
    """A fresh, valid copy of the example settings repository (a plain directory)."""
    return copy_example(tmp_path / "settings")
