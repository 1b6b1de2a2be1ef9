"""The console in a real Chromium against a real in-process control plane and agent (NVML: the H200 stand-in
built from real captures): log in, read the cluster, see a node's bars and a GPU tile change colour without a
reload, follow links, read the charts and the history, log out and be refused. Screenshots are artefacts."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import trio
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from control.conftest import stand_in_agent
from control.test_fleet_readings import gpu_repo
from control.test_in_process_fleet import commit_directly, wait_for
from llmgw.agent import run_agent
from llmgw.console.views import load_class
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent" / "discovery"))
from fake_nvml import FakeNvml  # noqa: E402

pytestmark = pytest.mark.slow

def wait_until(driver, check, what: str, timeout: float = 20.0):
    """Poll `check(driver)` until it is truthy. An element found by one poll may be replaced before the check reads it
    (the console swaps <main> on every refresh): a stale element is only a poll to repeat (it failed the whole wait
    once, in a full-suite run, though the page showed what was waited for)."""
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
                             ).until(lambda d: check(d))
    except Exception as exc:  # noqa: BLE001 - selenium's TimeoutException: say what we waited for
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; page:\n{driver.page_source[:3000]}") \
            from exc


def css(driver, selector: str):
    return driver.find_element(By.CSS_SELECTOR, selector)


async def test_an_operator_logs_in_reads_the_fleet_sees_a_gpu_change_live_and_logs_out(
    tmp_path, weights_mirror, fake_engine, browser, artefacts,
):
    mirror, sha = weights_mirror
    repo = gpu_repo(tmp_path, sha, "telemetry_interval: 1s\n", tiny_replicas=1)  # GPU readings every second
    nvml = FakeNvml.h200(utilization={"gpu": 85, "memory": 40})
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("gpu1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(), nvml=nvml,
                                                          task_status=task_status))
        await wait_for(lambda: {r["state"] for r in plane.status()["replicas"].values()} == {"ready"}, 30,
                       "big-0 and tiny-0 ready", lambda: plane.status())
        good = plane.snapshot().settings.commit
        bad = await trio.to_thread.run_sync(
            commit_directly, repo, "catalog/tiny.yaml",
            (repo.parent / "seed" / "catalog" / "tiny.yaml").read_bytes().replace(b"replicas: 1", b"replicas: many"),
            "tiny: a bad replica count")
        plane.wake_watcher()
        await wait_for(lambda: plane.snapshot().watch.bad is not None, 10, "the bad head rejected")
        base = f"{plane.admin_url}/console"
        token = plane.admin_token

        def operator() -> None:
            driver = browser
            driver.get(f"{base}/nodes")  # no session: the login form
            wait_until(driver, lambda d: d.current_url.endswith("/console/login"), "the login form")
            driver.save_screenshot(str(artefacts / "login.png"))
            css(driver, "#token").send_keys(token)
            css(driver, "#login").click()

            wait_until(driver, lambda d: d.find_elements(By.ID, "commit"), "the cluster page")
            assert driver.current_url == f"{base}/"
            assert css(driver, "#commit").text == good[:12]
            assert css(driver, "#serving").text == "serving"
            assert bad[:12] in css(driver, "#bad").text
            assert css(driver, "#bad .where").text.startswith("catalog/tiny.yaml:")
            assert css(driver, "#nodes-connected").text == "1 connected"
            assert css(driver, "#replicas-ready").text == "2 ready"
            assert css(driver, "#role").text == "leader"
            driver.save_screenshot(str(artefacts / "cluster.png"))

            css(driver, "#nav-nodes").click()
            row = wait_until(driver, lambda d: d.find_elements(By.ID, "node-gpu1"), "the nodes table")[0]
            assert row.find_element(By.CSS_SELECTOR, "td.state").text == "connected"
            gpu_bar = row.find_element(By.CSS_SELECTOR, "td.gpu meter")
            assert "load-high" in gpu_bar.get_attribute("class") and gpu_bar.get_attribute("value") == "0.85"
            ram = row.find_element(By.CSS_SELECTOR, "td.ram meter")  # the host's real memory reading
            assert 0 < float(ram.get_attribute("value")) < 1
            assert "llama.cpp@b11434" in row.find_element(By.CSS_SELECTOR, "td.engines").text
            driver.save_screenshot(str(artefacts / "nodes.png"))

            row.find_element(By.LINK_TEXT, "gpu1").click()
            wait_until(driver, lambda d: d.find_elements(By.ID, "gpu-0"), "the node page")
            assert driver.current_url == f"{base}/nodes/gpu1"
            now = css(driver, "#gpu-0 .now").text
            assert "utilisation 85 %" in now and "of 700 W" in now and "of 140.4Gi" in now
            wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#gpu-0 svg.chart circle.util, "
                                                                     "#gpu-0 svg.chart polyline.util"),
                       "a utilisation point on GPU 0's chart (the sampler folds every 5 s)", timeout=20)
            assert css(driver, "#gpu-0 svg.chart").get_attribute("aria-label") == "GPU 0 of gpu1, last hour"
            assert "big-0" in css(driver, "#shards").text and "ready" in css(driver, "#shards").text
            driver.save_screenshot(str(artefacts / "node.png"))
            # the chart's axes are drawn and readable: percent ticks, a clock every quarter hour, the legend's scales
            ticks = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#gpu-0 svg.chart text.y-tick")]
            assert ticks == ["0 %", "25 %", "50 %", "75 %", "100 %"]
            clock = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#gpu-0 svg.chart text.x-tick")]
            assert len(clock) == 5 and all(len(c) == 5 and c[2] == ":" for c in clock), clock
            keys = [k.text for k in driver.find_elements(By.CSS_SELECTOR, "#gpu-0 svg.chart text.key-text")]
            assert keys == ["utilisation %", "memory % of 140.4GiB", "power % of 700 W limit"], keys
            driver.execute_script("arguments[0].scrollIntoView()", css(driver, "#gpu-0"))
            driver.save_screenshot(str(artefacts / "node-chart.png"))

            shard_row = [r for r in driver.find_elements(By.CSS_SELECTOR, "#shards tbody tr") if "big-0/0" in r.text][0]
            shard_row.find_element(By.CSS_SELECTOR, "a.shard-log").click()  # the engine's log, followed
            wait_until(driver, lambda d: "server is listening" in css(d, "#log").text, "big-0/0's log")
            assert css(driver, "#follow").text == "Stop following"
            assert driver.execute_script("return document.body.dataset.refresh;") == "2"
            driver.save_screenshot(str(artefacts / "log.png"))

            css(driver, "#nav-gpus").click()
            tile = wait_until(driver, lambda d: d.find_elements(By.ID, "tile-gpu1-0"), "the GPU map")[0]
            assert "load-high" in tile.get_attribute("class") and "85 %" in tile.text
            driver.save_screenshot(str(artefacts / "gpus.png"))
            driver.execute_script("window.consoleTestMarker = 'same page';")
            nvml.cards[0]["utilization"] = {"gpu": 5, "memory": 1}  # the card goes quiet
            wait_until(driver, lambda d: "load-idle" in css(d, "#tile-gpu1-0").get_attribute("class"),
                       "the tile to turn idle without a reload", timeout=20)
            assert "5 %" in css(driver, "#tile-gpu1-0").text
            assert driver.execute_script("return window.consoleTestMarker;") == "same page"

            css(driver, "#tile-gpu1-0").click()
            wait_until(driver, lambda d: d.current_url.endswith("/console/nodes/gpu1#gpu-0"), "the tile's link")

            css(driver, "#nav-replicas").click()
            wait_until(driver, lambda d: d.find_elements(By.ID, "replica-big-0"), "the replicas page")
            assert css(driver, "#model-big .ready-count").text == "1/1 ready"
            assert "complete" in css(driver, "#model-big .ready-count").get_attribute("class")
            assert css(driver, "#replica-big-0 td.state").text == "ready"
            assert css(driver, "#replica-big-0 a").get_attribute("href") == f"{base}/nodes/gpu1"
            driver.save_screenshot(str(artefacts / "replicas.png"))

            css(driver, "#nav-history").click()
            entries = wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#history details"), "history")
            assert "pass " in entries[0].text
            entries[0].find_element(By.TAG_NAME, "summary").click()
            assert "status.yaml" in entries[0].text or "converged" in entries[0].text
            driver.save_screenshot(str(artefacts / "history.png"))
            entries[0].find_element(By.CSS_SELECTOR, "a.entry").click()  # the settings it applied
            wait_until(driver, lambda d: d.find_elements(By.ID, "message"), "the history entry")
            assert good[:12] in css(driver, "#diff").text  # one settings commit so far: in force, no change

            css(driver, "#nav-usage").click()  # the plane's real store: no request yet
            wait_until(driver, lambda d: d.find_elements(By.ID, "usage-model"), "the usage page")
            assert "No request in this period." in css(driver, "#usage-model").text
            driver.save_screenshot(str(artefacts / "usage.png"))

            problems = [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
            assert problems == [], problems  # no CSP violation, no script error, nothing fetched that failed

            css(driver, "#logout").click()
            wait_until(driver, lambda d: d.current_url.endswith("/console/login"), "the login form after logout")
            driver.get(f"{base}/nodes")
            wait_until(driver, lambda d: d.current_url.endswith("/console/login"), "refused after logout")
            assert not driver.find_elements(By.ID, "node-gpu1")

        await trio.to_thread.run_sync(operator)
        nursery.cancel_scope.cancel()


def h200_cards(loads: list[int], node: int) -> FakeNvml:
    """The H200 stand-in with one card per load (percent), each with its own UUID and PCI bus id."""
    base = FakeNvml.h200()
    template = base.cards[0]
    cards = []
    for index, load in enumerate(loads):
        card = copy.deepcopy(template)
        card["uuid"] = f"GPU-{node:04x}{index:04x}-960a-207c-573e-20129c535d06"
        card["pci"] = dict(card["pci"], busId=f"00000000:{node:02x}:{index + 1:02x}.0", device=index + 1)
        card["utilization"] = {"gpu": load, "memory": load // 2}
        card["power_usage_mw"] = 80_000 + load * 6_000
        card["memory"] = dict(card["memory"], used=(load * card["memory"]["total"]) // 100)
        cards.append(card)
    return FakeNvml(cards, driver=base.driver, cuda=base.cuda)


FLEET_LOADS = {"h200-a": [0, 5, 15, 35, 45, 65, 75, 95], "h200-b": [100, 100, 98, 97, 12, 8, 0, 55]}


async def test_the_gpu_map_of_an_h200_fleet_colours_every_card_by_its_load(
    tmp_path, settings_repo, weights_mirror, fake_engine, browser, artefacts,
):
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state",
                                       admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        for number, (node_id, loads) in enumerate(FLEET_LOADS.items()):
            agent = stand_in_agent(node_id, tmp_path / node_id, mirror, fake_engine)
            nvml = h200_cards(loads, number + 1)
            await nursery.start(lambda task_status, agent=agent, nvml=nvml: run_agent(
                agent, plane.local_connector(), nvml=nvml, task_status=task_status))
        await wait_for(lambda: all(len(((plane.status()["nodes"].get(n) or {}).get("readings") or {}).get("gpus", []))
                                   == 8 for n in FLEET_LOADS), 30, "both nodes' readings", lambda: plane.status())
        base = f"{plane.admin_url}/console"
        token = plane.admin_token

        def operator() -> None:
            driver = browser
            driver.get(f"{base}/login")
            css(driver, "#token").send_keys(token)
            css(driver, "#login").click()
            wait_until(driver, lambda d: d.find_elements(By.ID, "commit"), "the cluster page")
            assert css(driver, "#nodes-connected").text == "2 connected"
            driver.save_screenshot(str(artefacts / "fleet-cluster.png"))
            driver.get(f"{base}/gpus")
            wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".tile"), "the GPU map")
            assert len(driver.find_elements(By.CSS_SELECTOR, ".tile")) == 16
            for node_id, loads in FLEET_LOADS.items():
                for index, load in enumerate(loads):
                    tile = css(driver, f"#tile-{node_id}-{index}")
                    assert load_class(load) in tile.get_attribute("class").split(), (node_id, index, load)
                    assert f"{load} %" in tile.text
            assert css(driver, "h2").text.startswith("h200-141g")
            driver.save_screenshot(str(artefacts / "fleet-gpus.png"))
            driver.get(f"{base}/nodes")
            wait_until(driver, lambda d: d.find_elements(By.ID, "node-h200-b"), "the nodes table")
            mean_b = sum(FLEET_LOADS["h200-b"]) / 8
            bar = css(driver, "#node-h200-b td.gpu meter")
            assert abs(float(bar.get_attribute("value")) - mean_b / 100) < 1e-3
            assert load_class(mean_b) in bar.get_attribute("class")
            driver.save_screenshot(str(artefacts / "fleet-nodes.png"))
            driver.set_window_size(390, 844)  # a phone-sized viewport: the map still lays out
            driver.get(f"{base}/gpus")
            wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".tile"), "the GPU map on a phone")
            width = driver.execute_script("return document.documentElement.scrollWidth;")
            assert width <= 390, f"the GPU map scrolls sideways on a phone ({width} px)"
            driver.save_screenshot(str(artefacts / "fleet-gpus-phone.png"))

        await trio.to_thread.run_sync(operator)
        nursery.cancel_scope.cancel()
