"""GET /metrics on the admin listener of a real control plane with an in-process agent (NVML stand-in from the
H200 captures): the fleet, its GPU, the replica, the passes and the gateway's counters in one scrape, checked by
promtool; the admin token is required; the API port has no /metrics."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .observed_fleet import chat_once, observed_fleet
from .prometheus_tools import promtool
from .test_in_process_fleet import wait_for


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition: (name, labels) -> value."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in found.items() if n == name and set(labels.items()) <= ls]
    assert len(matches) == 1, f"{name}{labels}: {len(matches)} series"
    return matches[0]


async def test_one_scrape_shows_the_node_its_gpu_the_replica_the_passes_and_the_gateway(
    tmp_path, weights_mirror, fake_engine,
):
    async with observed_fleet(tmp_path, weights_mirror, fake_engine) as plane:
        async with httpx.AsyncClient(timeout=10) as client:
            await chat_once(plane, client)
            assert (await client.get(f"{plane.gateway_url}/metrics")).status_code == 404
            assert (await client.get(f"{plane.admin_url}/metrics")).status_code == 401
            wrong = await client.get(f"{plane.admin_url}/metrics", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            await wait_for(lambda: plane.snapshot().tallies.actions.get(("start", "succeeded")), 10, "start answered")
            scrape = await client.get(f"{plane.admin_url}/metrics",
                                      headers={"Authorization": f"Bearer {plane.admin_token}"})
        assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
        found = samples(scrape.text)
        assert value(found, "llmgw_nodes", state="connected") == 1
        assert value(found, "llmgw_nodes", state="lost") == 0
        assert value(found, "llmgw_node_up", node="n1") == 1
        assert value(found, "llmgw_node_memory_available_bytes", node="n1") > 0
        assert value(found, "llmgw_node_load1", node="n1") >= 0
        assert 0 <= value(found, "llmgw_node_readings_age_seconds", node="n1") < 5
        gpu = {"node": "n1", "gpu": "0", "gpu_class": "h200-141g"}
        assert value(found, "llmgw_gpu_power_limit_watts", **gpu) == 700.0  # the H200 capture's limit
        assert value(found, "llmgw_gpu_memory_total_bytes", **gpu) > 140e9
        assert value(found, "llmgw_gpu_temperature_celsius", **gpu) > 0
        assert value(found, "llmgw_gpu_foreign_processes", **gpu) == 0
        assert value(found, "llmgw_gpu_ecc_uncorrected_errors_total", **gpu) == 0
        assert value(found, "llmgw_gpu_clock_event_active", reason="hw_slowdown", **gpu) in (0, 1)
        assert value(found, "llmgw_gpu_memory_temperature_celsius", **gpu) == 36.0  # the H200's HBM
        assert value(found, "llmgw_gpu_health_placeable", node="n1", gpu="0") == 1
        assert value(found, "llmgw_gpu_health_level", node="n1", gpu="0") == 0
        shard = {"node": "n1", "model": "tiny", "replica": "tiny-0"}
        assert value(found, "llmgw_shard_state", state="ready", **shard) == 1
        assert value(found, "llmgw_shard_state", state="failed", **shard) == 0
        assert value(found, "llmgw_shard_restarts_total", **shard) == 0
        assert value(found, "llmgw_model_replicas_desired", model="tiny") == 1
        assert value(found, "llmgw_model_replicas_ready", model="tiny") == 1
        assert value(found, "llmgw_control_passes_total", outcome="converged") >= 1
        assert value(found, "llmgw_control_pass_duration_seconds_count") >= 1
        assert value(found, "llmgw_control_actions_total", kind="start", outcome="sent") >= 1
        assert value(found, "llmgw_control_actions_total", kind="start", outcome="succeeded") >= 1
        assert value(found, "llmgw_control_leader") == 1
        assert value(found, "llmgw_control_agents_connected") == 1
        assert value(found, "llmgw_settings_info", commit=plane.snapshot().settings.commit) == 1
        assert value(found, "llmgw_settings_head_rejected") == 0
        assert value(found, "llmgw_gateway_requests_total", model="tiny", project="demo", status="200") == 1
        promtool("check", "metrics", stdin=scrape.content)
