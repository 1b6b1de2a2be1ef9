"""A real Prometheus (Debian's) on loopback scrapes a real control plane (in-process agent, NVML stand-in from the
H200 captures, a replica of the engine stand-in, traffic through the gateway) with the admin token, and answers the
fleet metrics through its HTTP API. Every panel of the Grafana dashboards in deploy/grafana and every alert of
deploy/prometheus/alerts.yaml is evaluated there: each must parse, and each panel must return series except those
listed in `EMPTY_PANELS` with the reason."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import trio
from ruamel.yaml import YAML

from .observed_fleet import observed_fleet
from .prometheus_tools import DEPLOY, require

DASHBOARDS = sorted((DEPLOY / "grafana").glob("*.json"))
RULES = DEPLOY / "prometheus" / "alerts.yaml"
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "1m", "$node": ".+", "$gpu": ".+",
                     "$model": ".+"}
"""Grafana's variables, substituted with fixed values before Prometheus evaluates a panel's expression."""
EMPTY_PANELS = {
    "Quota rejections": "no request of the test hits a quota",
    "Health findings": "the test's H200 stand-in is healthy: no card has a finding",
}
"""Panels allowed to return no series in this test, with why."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expression with Grafana's variables substituted) of every panel target."""
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
                    expr = expr.replace(name, GRAFANA_VARIABLES[name])
                assert "$" not in expr, f"{board['uid']} / {panel['title']}: unsubstituted variable in {expr}"
                out.append((board["uid"], panel["title"], expr))
    return out


def alert_expressions() -> list[tuple[str, str]]:
    rules = YAML(typ="safe").load(RULES.read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def write_config(directory: Path, admin_port: int, token: str) -> Path:
    (directory / "token").write_text(token)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": "llmgw", "metrics_path": "/metrics",
            "authorization": {"credentials_file": str(directory / "token")},
            "static_configs": [{"targets": [f"127.0.0.1:{admin_port}"]}],
        }],
    }
    path = directory / "prometheus.yml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


async def query(client: httpx.AsyncClient, expr: str) -> list[dict]:
    """The result of an instant query; fails with Prometheus' error when the expression does not parse."""
    reply = await client.get("/api/v1/query", params={"query": expr})
    body = reply.json()
    assert reply.status_code == 200 and body["status"] == "success", f"{expr}: {body.get('error')}"
    return body["data"]["result"]


async def wait_query(client: httpx.AsyncClient, expr: str, timeout: float) -> list[dict]:
    with trio.move_on_after(timeout):
        while True:
            result = await query(client, expr)
            if result:
                return result
            await trio.sleep(0.25)
    raise AssertionError(f"Prometheus returned no series for {expr} within {timeout} s")


def only_value(result: list[dict]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


async def test_a_real_prometheus_scrapes_the_fleet_and_evaluates_every_panel_and_alert(
    tmp_path, weights_mirror, fake_engine,
):
    prometheus = require("prometheus")
    async with observed_fleet(tmp_path, weights_mirror, fake_engine) as plane:
        _record, api_key = plane.store.create_api_key("demo")
        async with httpx.AsyncClient(base_url=plane.gateway_url, timeout=10,
                                     headers={"Authorization": f"Bearer {api_key}"}) as gateway:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
            assert (await gateway.post("/v1/chat/completions", json=body)).status_code == 200
            streamed = await gateway.post("/v1/chat/completions", json={**body, "stream": True})
            assert streamed.status_code == 200 and "data: [DONE]" in streamed.text

        port = free_port()
        config = write_config(tmp_path, plane.admin_port, plane.admin_token)
        log = (tmp_path / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                with trio.fail_after(30):
                    while True:
                        assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
                        try:
                            if (await client.get("/-/ready")).status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        await trio.sleep(0.2)
                await wait_query(client, 'up{job="llmgw"} == 1', 20)
                # enough samples for rate() over the dashboards' 15 s $__rate_interval
                await wait_query(client, "count_over_time(llmgw_control_agents_connected[15s]) >= 6", 30)

                assert only_value(await query(client, 'llmgw_nodes{state="connected"}')) == 1
                assert only_value(await query(client, 'llmgw_node_memory_available_bytes{node="n1"}')) > 0
                assert only_value(await query(client, 'llmgw_node_cpu_usage_ratio{node="n1"}')) >= 0
                assert only_value(await query(client, 'llmgw_gpu_power_limit_watts{node="n1", gpu="0"}')) == 700
                assert only_value(await query(client, 'llmgw_gpu_memory_total_bytes{gpu_class="h200-141g"}')) > 140e9
                assert only_value(await query(client, 'llmgw_shard_state{replica="tiny-0", state="ready"}')) == 1
                assert only_value(await query(client, 'llmgw_model_replicas_ready{model="tiny"}')) == 1
                assert only_value(await query(client, 'sum(llmgw_control_passes_total)')) >= 1
                assert only_value(await query(
                    client, 'llmgw_control_actions_total{kind="start", outcome="succeeded"}')) >= 1
                assert only_value(await query(
                    client, 'sum(llmgw_gateway_requests_total{model="tiny", status="200"})')) == 2

                empty = []
                for uid, title, expr in panel_queries():
                    if not await query(client, expr):
                        empty.append(title)
                        assert title in EMPTY_PANELS, f"{uid} / {title}: no series for {expr}"
                assert sorted(set(empty)) == sorted(EMPTY_PANELS), f"panels now with series: {EMPTY_PANELS}"
                for alert, expr in alert_expressions():
                    await query(client, expr)  # parses and evaluates

                rules = (await client.get("/api/v1/rules")).json()["data"]["groups"]
                health = {r["name"]: r["health"] for group in rules for r in group["rules"]}
                assert len(health) == 24 and set(health.values()) <= {"ok", "unknown"}, health
                firing = {a["labels"]["alertname"] for a in (await client.get("/api/v1/alerts")).json()["data"]["alerts"]}
                assert not firing & {"LlmgwNodeLost", "LlmgwModelWithoutReadyReplica", "LlmgwGpuEccErrors",
                                     "LlmgwSettingsCommitRejected"}, firing
        finally:
            process.terminate()
            process.wait(10)
            log.close()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_each_dashboard_is_grafana_json_with_a_prometheus_datasource_variable_and_placed_panels(path):
    board = json.loads(path.read_text())
    assert board["uid"] == path.stem and board["schemaVersion"] >= 36 and board["title"].startswith("llmgw")
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24 and position["h"] > 0
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
