"""Which agents a control plane serves (issue 30, `llmgw.control.versions`): its own version and older; a newer
agent (by version or by wire protocol) is refused with a sentence saying to upgrade the control plane first."""

from __future__ import annotations

from llmgw.control.versions import newer_agent_refusal, version_key


def test_versions_order_as_releases_do():
    assert version_key("0.2.0") > version_key("0.2.0rc1") > version_key("0.1.10") > version_key("0.1.9")
    assert version_key("1.2") == version_key("1.2.0") == version_key("v1.2.0+g1234")
    assert version_key("unknown") is None


def test_only_a_newer_agent_is_refused_naming_both_versions_and_what_to_do():
    assert newer_agent_refusal("n1", "0.1.0", 1, "0.1.0", 1) is None
    assert newer_agent_refusal("n1", "0.0.9", 1, "0.1.0", 1) is None  # an older agent is served what it lists
    assert newer_agent_refusal("n1", "", 1, "0.1.0", 1) is None
    assert newer_agent_refusal("n1", "0.2.0", 1, "0.1.0", 1) == (
        "node n1 runs llmgw agent 0.2.0, newer than this control plane's llmgw 0.1.0; upgrade the control plane "
        "first (llmgw 0.2.0 or newer), then start the agent again: control planes go first in an upgrade.")
    assert "speaks wire protocol 2, newer than this control plane's 1" in newer_agent_refusal("n1", "0.1.0", 2,
                                                                                              "0.1.0", 1)
