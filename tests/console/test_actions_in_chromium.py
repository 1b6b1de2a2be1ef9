"""Console actions in a real Chromium against a real control plane with two in-process agents (issue 36, item 2):
an operator drains the node that serves "tiny" from its page, reads the diff, commits it, and the settings commit is
theirs while the replica moves to the other node; a project member adds an SSH key on their page the same way, then
makes an API key of their project (shown once) and revokes it, and reads their project's quotas with the requests in
flight counted. Screenshots of the new pages (the node's actions, a diff to confirm, a commit done, the SSH keys, a
new API key, the API keys, the quotas) are artefacts,
checked non-empty and free of browser console errors."""

from __future__ import annotations

import time

import pytest
import trio
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By

from control.conftest import stand_in_agent
from control.test_in_process_fleet import wait_for
from control.test_people_on_the_admin_api import KEY, PASSWORD, head, people_repo
from llmgw.agent import run_agent
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane

from .test_console_in_chromium import css, wait_until
from .test_console_quotas import PROJECTS
from .test_people_in_chromium import log_in

pytestmark = pytest.mark.slow
SCREENSHOTS = ("node-actions.png", "action-confirm.png", "action-committed.png", "ssh-keys.png", "api-key-made.png",
               "api-keys.png", "quotas.png")


def click(driver, selector: str) -> None:
    """Click `selector`, again when the page's refresh replaced it between finding and clicking."""
    wait_until(driver, lambda d: _clicked(d, selector), f"{selector} clicked", 10)


def _clicked(driver, selector: str) -> bool:
    try:
        css(driver, selector).click()
    except StaleElementReferenceException:
        return False
    return True


def tiny_on(plane) -> str | None:
    """The node whose shard of tiny-0 is ready, None while none is."""
    replica = plane.status()["replicas"].get("tiny-0") or {}
    ready = [s["node"] for s in (replica.get("shards") or {}).values() if s.get("state") == "ready"]
    return ready[0] if len(ready) == 1 else None


async def test_an_operator_drains_a_node_from_the_console_and_a_member_adds_an_ssh_key(
    tmp_path, weights_mirror, fake_engine, browser, artefacts,
):
    mirror, sha = weights_mirror
    repo = people_repo(tmp_path, sha, files={"projects.yaml": PROJECTS})  # demo and other, with quotas
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        for node in ("n1", "n2"):
            agent = stand_in_agent(node, tmp_path / node, mirror, fake_engine)
            await nursery.start(lambda task_status, a=agent: run_agent(a, plane.local_connector(),
                                                                       task_status=task_status))
        await wait_for(lambda: tiny_on(plane) is not None, 30, "tiny-0 ready", lambda: plane.status())
        first = tiny_on(plane)
        other = "n2" if first == "n1" else "n1"
        plane.store.add_account("ops@lab.example", "Olga Ops", PASSWORD)
        plane.store.add_account("ada@lab.example", "Ada Lovelace", PASSWORD)
        base = f"{plane.admin_url}/console"
        problems: list[str] = []

        def operator_drains() -> None:
            driver = browser
            log_in(driver, base, "ops@lab.example", PASSWORD)
            wait_until(driver, lambda d: d.find_elements(By.ID, "commit"), "the cluster page")
            driver.get(f"{base}/nodes/{first}")
            wait_until(driver, lambda d: d.find_elements(By.ID, "drain"), "the node's actions")
            driver.save_screenshot(str(artefacts / "node-actions.png"))
            click(driver, "#drain")
            wait_until(driver, lambda d: d.find_elements(By.ID, "action-diff"), "the diff to confirm")
            assert f"+  drained: [{first}]" in css(driver, "#action-diff").text
            assert css(driver, "#action-author").text == "Olga Ops <ops@lab.example>"
            driver.save_screenshot(str(artefacts / "action-confirm.png"))
            click(driver, "#confirm")
            wait_until(driver, lambda d: d.find_elements(By.ID, "action-done"), "the commit done")
            assert "Committed" in css(driver, "#action-done").text
            driver.save_screenshot(str(artefacts / "action-committed.png"))
            problems.extend(e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING"))

        await trio.to_thread.run_sync(operator_drains)
        commit = head(repo)
        assert commit.message == f"llmgw node drain {first}\n"
        assert (commit.author.name, commit.author.email, commit.committer.name) == (
            "Olga Ops", "ops@lab.example", "llmgw")
        await wait_for(lambda: tiny_on(plane) == other, 30, f"tiny-0 moved to {other}", lambda: plane.status())

        def replica_moved_and_member_adds_a_key() -> None:
            driver = browser
            driver.get(f"{base}/replicas")
            wait_until(driver, lambda d: f"ready on {other}" in css(d, "#replica-tiny-0").text, "tiny-0 on " + other)
            driver.get(f"{base}/history")
            wait_until(driver, lambda d: "for Olga Ops <ops@lab.example>" in css(d, "#history").text
                       or d.refresh(), "the audit of Olga's drain", 20)
            css(driver, "#logout").click()
            log_in(driver, base, "ada@lab.example", PASSWORD)
            wait_until(driver, lambda d: d.current_url.endswith("/console/usage"), "the member's usage page")
            css(driver, "#nav-ssh-keys").click()
            wait_until(driver, lambda d: d.find_elements(By.ID, "key-line"), "the SSH keys page")
            css(driver, "#key-line").send_keys(KEY)
            time.sleep(6)  # past a refresh of <main> (every 5 s): a form being typed into is left alone
            assert css(driver, "#key-line").get_attribute("value") == KEY
            click(driver, "#add-key")
            wait_until(driver, lambda d: d.find_elements(By.ID, "action-diff"), "the key's diff")
            assert "ada@lab.example" in css(driver, "#action-diff").text
            click(driver, "#confirm")
            wait_until(driver, lambda d: d.find_elements(By.ID, "action-done"), "the key committed")
            css(driver, "#back").click()
            wait_until(driver, lambda d: KEY in css(d, "#ssh-keys").text, "the key listed")
            driver.save_screenshot(str(artefacts / "ssh-keys.png"))
            # her own API keys: one made (shown once), listed by its prefix, revoked
            css(driver, "#nav-keys").click()
            wait_until(driver, lambda d: d.find_elements(By.ID, "make-key"), "the API keys page")
            css(driver, "#key-name").send_keys("laptop")
            click(driver, "#make-key")
            wait_until(driver, lambda d: d.find_elements(By.ID, "new-key"), "the new key")
            made.append(css(driver, "#new-key").text)
            driver.save_screenshot(str(artefacts / "api-key-made.png"))
            css(driver, "#back").click()
            wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".revoke-key"), "the key listed")
            assert made[0] not in driver.page_source and "laptop" in css(driver, "#api-keys").text
            driver.save_screenshot(str(artefacts / "api-keys.png"))
            click(driver, ".revoke-key")
            wait_until(driver, lambda d: d.find_elements(By.ID, "key-revoked"), "the key revoked")
            # her project's quotas, with the requests in flight counted
            css(driver, "#nav-quotas").click()
            wait_until(driver, lambda d: d.find_elements(By.ID, "quotas-demo"), "the quotas page")
            assert not driver.find_elements(By.ID, "quotas-other")
            assert "900 1000 100" in css(driver, "#quota-demo-project-demo-tokens_per_minute").text
            driver.save_screenshot(str(artefacts / "quotas.png"))
            problems.extend(e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING"))

        made: list[str] = []
        for _ in range(3):  # three requests of demo in flight, reserved as the gateway reserves them
            plane.store.reserve(plane.snapshot().settings.quota_scopes("demo"), 300, 0.5)
        await trio.to_thread.run_sync(replica_moved_and_member_adds_a_key)
        assert problems == [], problems  # no CSP violation, no script error, nothing fetched that failed
        assert (head(repo).author.name, head(repo).author.email) == ("Ada Lovelace", "ada@lab.example")
        [key] = plane.store.list_api_keys("demo")
        assert made[0].startswith("sk-llmgw-") and key.revoked_at is not None and (key.project, key.name) == (
            "demo", "laptop")
        for name in SCREENSHOTS:
            assert (artefacts / name).stat().st_size > 10_000, name
        nursery.cancel_scope.cancel()
