"""People in a real Chromium against a real control plane (issue 36): a project member logs in with their e-mail
and password and lands on their projects' usage, and five wrong passwords lock an operator's login out (the right
one is then refused too). The member's one day of usage is one column on labelled axes (issue 42: not a block).
Screenshots of the login form and the member's page are artefacts, checked non-empty and free of browser console
errors."""

from __future__ import annotations

import time

import pytest
import trio
from selenium.webdriver.common.by import By

from control.test_people_on_the_admin_api import PASSWORD, people_repo
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane
from llmgw.store import UsageRecord

from .test_console_in_chromium import css, wait_until

pytestmark = pytest.mark.slow


def log_in(driver, base: str, email: str, password: str) -> None:
    """Send the console's login form at `base` (…/console) with an account's e-mail and password."""
    driver.get(f"{base}/login")
    css(driver, "#email").send_keys(email)
    css(driver, "#password").send_keys(password)
    css(driver, "#login-account").click()


async def test_a_member_logs_in_with_a_password_and_five_failures_lock_a_login_out(
    tmp_path, weights_mirror, browser, artefacts,
):
    repo = people_repo(tmp_path, weights_mirror[1])
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        plane.store.add_account("ada@lab.example", "Ada Lovelace", PASSWORD)
        plane.store.add_account("ops@lab.example", "Olga Ops", PASSWORD)
        plane.store.record_usage(UsageRecord(project="demo", model="tiny", time=time.time() - 60,
                                             prompt_tokens=1200, completion_tokens=300))
        base = f"{plane.admin_url}/console"

        def people() -> None:
            driver = browser
            driver.get(f"{base}/login")
            wait_until(driver, lambda d: d.find_elements(By.ID, "account-login"), "the login form")
            driver.save_screenshot(str(artefacts / "login-accounts.png"))
            log_in(driver, base, "ada@lab.example", PASSWORD)
            wait_until(driver, lambda d: d.current_url.endswith("/console/usage"), "the member's usage page")
            assert "member of demo" in css(driver, "#person").text
            assert not driver.find_elements(By.ID, "nav-nodes")  # a member sees no cluster pages
            driver.save_screenshot(str(artefacts / "member-usage.png"))
            driver.get(f"{base}/usage?days=1")
            chart = css(driver, "#usage-chart svg")
            columns = driver.find_elements(By.CSS_SELECTOR, "#usage-chart rect.tokens")
            assert len(columns) == 2  # prompt and completion of the one day, stacked
            assert all(0 < c.rect["width"] < chart.rect["width"] / 8 for c in columns), (chart.rect, columns[0].rect)
            ticks = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#usage-chart text.y-tick")]
            assert ticks == ["0 tokens", "500 tokens", "1k tokens", "1.5k tokens", "2k tokens"]  # drawn, readable
            keys = driver.find_elements(By.CSS_SELECTOR, "#usage-chart text.key-text")
            assert [k.text for k in keys] == ["prompt tokens", "completion tokens"] and all(k.rect["height"] > 5
                                                                                          for k in keys)
            driver.save_screenshot(str(artefacts / "usage-chart.png"))
            problems = [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
            css(driver, "#logout").click()
            for _ in range(5):
                log_in(driver, base, "ops@lab.example", "not the password")
                wait_until(driver, lambda d: d.find_elements(By.ID, "login-error"), "the refusal")
            log_in(driver, base, "ops@lab.example", PASSWORD)
            wait_until(driver, lambda d: "Too many failed logins" in css(d, "#login-error").text, "the lockout")
            problems += [e["message"] for e in driver.get_log("browser")
                         if e["level"] == "SEVERE" and "/console/login" not in e["message"]]  # bar the 401s and 429
            assert problems == []

        await trio.to_thread.run_sync(people)
        for name in ("login-accounts.png", "member-usage.png", "usage-chart.png"):
            assert (artefacts / name).stat().st_size > 10_000, name
        nursery.cancel_scope.cancel()
