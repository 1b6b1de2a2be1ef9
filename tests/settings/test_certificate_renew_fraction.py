"""agents/ `certificate_renew_fraction`: two thirds by default, a node's value over the default's, sent to the agent
in AgentSettings, and a value outside (0.1, 0.95] refused at its file, line and key."""

from __future__ import annotations

import pytest

from llmgw.control.commands import agent_settings
from llmgw.errors import SettingsError
from llmgw.settings import load_directory
from settings_trees import with_node_line as _tree


def test_the_default_is_two_thirds_and_a_nodes_value_reaches_its_agent(tmp_path):
    settings = load_directory(_tree(tmp_path, "certificate_renew_fraction: 0.5\n"))
    assert settings.agent_defaults.certificate_renew_fraction == pytest.approx(2 / 3, abs=1e-3)
    assert agent_settings(settings, "gpu-node-01").certificate_renew_fraction == 0.5


@pytest.mark.parametrize("value", ["0.05", "0.1", "0.99", "1", "\"half\""])
def test_a_fraction_outside_its_range_is_refused_at_its_key(tmp_path, value):
    with pytest.raises(SettingsError) as caught:
        load_directory(_tree(tmp_path, f"certificate_renew_fraction: {value}\n"))
    assert "agents/nodes/gpu-node-01.yaml:11:" in str(caught.value)
    assert "certificate_renew_fraction" in str(caught.value)
