"""Fixtures of the install tests."""

from __future__ import annotations

import pytest

from support.releases import build_signed_release


@pytest.fixture(scope="session")
def full_release(tmp_path_factory):
    """A signed release of this checkout with every dependency wheel for this machine (support.releases), built once
    per session for the tests that install it on hosts or only read it (a module that defines its own
    `full_release` uses that one)."""
    return build_signed_release(tmp_path_factory.mktemp("full-release"))
