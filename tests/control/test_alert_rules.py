"""The alert rules of deploy/prometheus/alerts.yaml pass `promtool check rules`, and their unit tests
(alerts.test.yaml) pass `promtool test rules`; a rule weakened on purpose fails those unit tests."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .prometheus_tools import DEPLOY, promtool, require

RULES = DEPLOY / "prometheus" / "alerts.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts.test.yaml"
ALERTS = ("LlmgwNodeLost", "LlmgwReplicaFailing", "LlmgwReplicaRestarting", "LlmgwModelWithoutReadyReplica",
          "LlmgwSettingsCommitRejected", "LlmgwNotConverged", "LlmgwGpuEccErrors", "LlmgwGpuHeldByForeignProcess",
          "LlmgwGpuPowerAtLimit", "LlmgwQuotaRejecting", "LlmgwGpuOutOfPlacement", "LlmgwGpuXid",
          "LlmgwGpuXidUnattributed", "LlmgwGpuRowRemapPending", "LlmgwGpuRowRemapFailure", "LlmgwGpuPcieDegraded",
          "LlmgwNvlinkFabricFinding", "LlmgwImexDown", "LlmgwInfinibandPortDown")


def test_the_alert_rules_pass_promtool_check_rules():
    assert "SUCCESS: 24 rules found" in promtool("check", "rules", str(RULES))


def test_every_alert_has_a_unit_test_and_the_unit_tests_pass():
    tested = RULE_TESTS.read_text()
    for alert in ALERTS:
        assert f"alertname: {alert}\n" in tested, f"{alert} has no promtool unit test"
    assert "SUCCESS" in promtool("test", "rules", str(RULE_TESTS))


@pytest.mark.parametrize(("rule", "weakened"), [
    ("for: 10m\n        labels: {severity: warning}", "for: 1m\n        labels: {severity: warning}"),
    ("llmgw_gpu_foreign_processes > 0", "llmgw_gpu_foreign_processes > 1"),
    ("increase(llmgw_shard_restarts_total[15m]) >= 3", "increase(llmgw_shard_restarts_total[15m]) >= 4"),
    ('llmgw_gpu_health_findings{code="xid"} > 0', 'llmgw_gpu_health_findings{code="xid", level="fail"} > 0'),
    ('code=~"pcie-width|pcie-gen|pcie-limited"', 'code=~"pcie-gen|pcie-limited"'),
    ("llmgw_fabric_imex_up == 0\n        for: 5m", "llmgw_fabric_imex_up == 0\n        for: 10m"),
])
def test_a_weakened_rule_fails_its_unit_test(tmp_path, rule, weakened):
    text = RULES.read_text()
    assert rule in text
    (tmp_path / "alerts.yaml").write_text(text.replace(rule, weakened, 1))
    shutil.copy(RULE_TESTS, tmp_path / "alerts.test.yaml")
    done = subprocess.run([require("promtool"), "test", "rules", "alerts.test.yaml"], cwd=tmp_path,
                          capture_output=True, timeout=60)
    assert done.returncode != 0, done.stdout.decode()
