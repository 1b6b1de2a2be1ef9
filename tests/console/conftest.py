"""Fixtures of the console's tests: the control-plane tests' settings repository, weights mirror and engine
stand-in (tests/control/conftest.py), and a real Chromium driven by selenium (Debian's chromium and
chromium-driver, installed by `make chromium` (part of `make venv`); a test that needs it fails, never skips, without it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from control.conftest import fake_engine, settings_repo, weights_mirror, write_seed  # noqa: F401

CHROMIUM = os.environ.get("LLMGW_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("LLMGW_CHROMEDRIVER", "/usr/bin/chromedriver")


@pytest.fixture
def artefacts(tmp_path: Path) -> Path:
    """Where screenshots go: $LLMGW_TEST_ARTIFACTS/console when set (CI keeps it), else the test's tmp_path."""
    root = os.environ.get("LLMGW_TEST_ARTIFACTS")
    path = Path(root) / "console" if root else tmp_path / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser():
    """A headless Chromium at 1280 x 800, driven through chromedriver by selenium; quit after the test."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.isfile(p) or shutil.which(p))]
    if missing:
        pytest.fail(f"Chromium is needed for the console's browser tests and {', '.join(missing)} is missing: "
                    f"run `make chromium` (apt-get install chromium chromium-driver)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,800", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console messages, CSP violations included
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
