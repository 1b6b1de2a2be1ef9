"""The node page shows the machine room's sensors (CPU packages' temperature and power, the inlet, each card's HBM
temperature) and says "not measured" where the node measured nothing, never 0."""

from __future__ import annotations

from dataclasses import replace

from llmgw.console import Console
from llmgw.control.readings import GpuSample
from llmgw.tools.sensors import NodeSensors, SensorValue

from .test_console_logs import BEARER
from .test_console_security import admin_only, no_history, state_with_one_gpu_node


def node_page_with(sensors: NodeSensors, gpu: GpuSample):
    state = state_with_one_gpu_node()
    record = state.fleet.records()[0]
    readings = replace(record.readings, sensors=sensors, gpus=(gpu,))
    registry, _ = state.fleet.heartbeat("gpu1", 0.0, readings=readings)
    state = replace(state, fleet=registry)
    return Console(lambda: state, authorise=admin_only, history=no_history, clock=lambda: 1.0)


async def page(console: Console) -> str:
    response = await console.app.test_client().get("/console/nodes/gpu1", headers=BEARER)
    assert response.status_code == 200
    return await response.get_data(as_text=True)


async def test_the_node_page_shows_packages_power_inlet_and_hbm():
    sensors = NodeSensors(
        cpu_package_celsius=(SensorValue("coretemp.0", "Physical id 0", 55.0),
                             SensorValue("coretemp.1", "Physical id 0", 57.0)),
        cpu_package_watts=(SensorValue("package-0", "intel-rapl:0", 90.04),),
        inlet_celsius=SensorValue("nct6775.656", "SYSTIN", 31.0))
    html = await page(node_page_with(sensors, GpuSample(0, temperature_celsius=41.0, memory_temperature_celsius=36.0)))
    packages = html.split('id="cpu-packages">')[1].split("</dd>")[0]
    assert "coretemp.0 (Physical id 0) 55 °C" in packages and "coretemp.1 (Physical id 0) 57 °C" in packages
    assert "package-0 90.0 W" in packages
    assert "31.0 °C" in html.split('id="inlet">')[1].split("</dd>")[0]
    assert '<span class="hbm">HBM 36 °C</span>' in html


async def test_a_node_that_measured_nothing_says_so():
    html = await page(node_page_with(NodeSensors(), GpuSample(0, temperature_celsius=41.0)))
    assert html.split('id="cpu-packages">')[1].startswith("not measured")
    assert html.split('id="inlet">')[1].startswith("not measured")
    assert 'class="hbm"' not in html
