"""agents/ `build`: a node's override is loaded over agents/default.yaml, and a value that is no build is refused
at its file, line and key."""

from __future__ import annotations

import pytest

from llmgw.errors import SettingsError
from llmgw.settings import load_directory
from settings_trees import with_node_line as _tree


def test_a_nodes_build_overrides_the_default_auto(tmp_path):
    settings = load_directory(_tree(tmp_path, "build: cu129\n"))
    assert settings.agent_settings_for("gpu-node-01").build == "cu129"
    assert settings.agent_defaults.build == "auto"


def test_a_build_that_is_not_one_is_refused_at_its_key(tmp_path):
    with pytest.raises(SettingsError) as caught:
        load_directory(_tree(tmp_path, "build: cuda12\n"))
    message = str(caught.value)
    assert "agents/nodes/gpu-node-01.yaml:11:" in message and "build" in message and "cu129" in message
