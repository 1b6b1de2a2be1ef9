"""The machine room in a real Chromium against a real in-process control plane and agent: the agent reads the H200
capture with a fault (an Xid 79 line in the kernel log, a link trained at x8, a pending row remap), and the node
page shows each finding with its evidence and the card out of placement; the same scrape of /metrics carries the
findings. The agent reads this machine's /sys for its sensors: a VM, so the page says "not measured"."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import trio
from selenium.webdriver.common.by import By

from control.conftest import stand_in_agent
from control.test_in_process_fleet import wait_for
from llmgw.agent import run_agent
from llmgw.agent.discovery import ToolOutput
from llmgw.agent.health import HealthReader
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane

from .test_console_in_chromium import css, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent" / "discovery"))
from fake_nvml import FakeNvml  # noqa: E402

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def faulty_tools():
    """A runner answering `nvidia-smi -q -x` with the H200 capture at x8 with a remap pending, and dmesg with the
    capture's Xid 79 line (tests/fixtures/hand-made/doctor-*); journalctl is not installed."""
    xml = (FIXTURES / "nvidia-h200" / "nvidia-smi-q-x.xml").read_text()
    xml = xml.replace("<current_link_width>16x<", "<current_link_width>8x<")
    xml = xml.replace("<remapped_row_pending>No<", "<remapped_row_pending>Yes<")
    dmesg = (FIXTURES / "hand-made" / "doctor-xid-79" / "dmesg-xid.txt").read_text()
    dmesg = "\n".join(line for line in dmesg.splitlines() if not line.startswith("#"))

    def run(argv: list[str]) -> ToolOutput | None:
        if argv[:2] == ["nvidia-smi", "-q"]:
            return ToolOutput(tuple(argv), 0, xml)
        if argv[0] == "dmesg":
            return ToolOutput(tuple(argv), 0, dmesg)
        return None

    return run


async def test_the_node_page_shows_the_faulty_h200s_findings_with_evidence(
    tmp_path, settings_repo, weights_mirror, fake_engine, browser, artefacts,
):
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state",
                                       admin_mounts=(console_mount,)))
    health = HealthReader(faulty_tools(), sys_root=tmp_path / "sys", etc_root=tmp_path / "etc")
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("gpu1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(), nvml=FakeNvml.h200(),
                                                          health=health, task_status=task_status))
        await wait_for(lambda: ((plane.status()["nodes"].get("gpu1") or {}).get("readings") or {}).get("gpus"), 30,
                       "gpu1's readings", lambda: plane.status())
        base = f"{plane.admin_url}/console"
        token = plane.admin_token
        async with httpx.AsyncClient(timeout=10) as client:
            scrape = (await client.get(f"{plane.admin_url}/metrics",
                                       headers={"Authorization": f"Bearer {token}"})).text
        for series in ('llmgw_gpu_health_findings{code="xid",gpu="0",level="fail",node="gpu1"} 1.0',
                       'llmgw_gpu_health_findings{code="pcie-width",gpu="0",level="warn",node="gpu1"} 1.0',
                       'llmgw_gpu_health_findings{code="remap-pending",gpu="0",level="warn",node="gpu1"} 1.0',
                       'llmgw_gpu_health_placeable{gpu="0",node="gpu1"} 0.0'):
            assert series in scrape, series

        def operator() -> None:
            driver = browser
            driver.get(f"{base}/login")
            css(driver, "#token").send_keys(token)
            css(driver, "#login").click()
            wait_until(driver, lambda d: d.find_elements(By.ID, "commit"), "the cluster page")
            driver.get(f"{base}/nodes/gpu1")
            wait_until(driver, lambda d: d.find_elements(By.ID, "health-0"), "gpu1's card health")
            card = css(driver, "#health-0")
            assert "out of placement until this clears" in card.text
            findings = {li.get_attribute("data-code"): li.text
                        for li in card.find_elements(By.CSS_SELECTOR, "li.finding")}
            assert set(findings) == {"xid", "pcie-width", "remap-pending"}
            assert "NVRM: Xid (PCI:0000:00:06): 79, pid=2231, name=python3, GPU has fallen off the bus." in findings["xid"]
            assert "x8 of x16" in findings["pcie-width"]
            assert "rows remapped: 0 for correctable errors, 0 for uncorrectable errors" in findings["remap-pending"]
            if not Path("/sys/class/hwmon").exists() and not Path("/sys/class/powercap").exists():   # this VM
                assert css(driver, "#cpu-packages").text == "not measured" == css(driver, "#inlet").text
            assert "HBM 36 °C" in css(driver, "#gpu-0").text
            driver.save_screenshot(str(artefacts / "node-health-h200-fault.png"))

        await trio.to_thread.run_sync(operator)
        nursery.cancel_scope.cancel()
