"""`llmgw node doctor --installable` (llmgw.agent.doctor_install): what `llmgw node add` polls once the node
connected. Real files, the real CLI in-process; no agent."""

from __future__ import annotations

import json

from llmgw.agent.config import save_agent_settings
from llmgw.wire import pb
from support.in_process_cli import run_llmgw


def test_no_agent_settings_yet_fails_saying_the_agent_has_not_had_them(tmp_path) -> None:
    code, out, _ = run_llmgw(["node", "doctor", "--installable", "--state-dir", str(tmp_path)])
    assert code == 1
    assert out.splitlines() == [
        f"fail  install  the agent has not had its settings from the control plane yet (none kept in {tmp_path}): "
        "it learns there where engines and weights come from", "node doctor: 1 check(s) failed"]


def test_each_mirror_is_read_and_what_it_holds_is_named_and_a_missing_one_fails(tmp_path) -> None:
    engines, weights, gone = tmp_path / "engines", tmp_path / "weights", tmp_path / "gone"
    (engines / "llama.cpp" / "b11434" / "bin").mkdir(parents=True)
    (engines / "llama.cpp" / "b11434" / "bin" / "llama-server").write_bytes(b"\x7fELF")
    (engines / "llama.cpp" / "b1" / "bin").mkdir(parents=True)  # empty: not a build
    (weights / "sha256").mkdir(parents=True)
    (weights / "sha256" / ("a" * 64)).write_bytes(b"gguf")
    state = tmp_path / "state"
    save_agent_settings(state, pb.AgentSettings(mirrors=[str(engines), str(weights)]))
    code, out, _ = run_llmgw(["node", "doctor", "--installable", "--state-dir", str(state)])
    assert (code, out.splitlines()) == (0, [
        f"ok    install  mirror {engines}: 0 weights files, engines llama.cpp@b11434",
        f"ok    install  mirror {weights}: 1 weights file, engines none", "node doctor: installable"])

    save_agent_settings(state, pb.AgentSettings(mirrors=[str(weights), str(gone)]))
    code, out, _ = run_llmgw(["node", "doctor", "--installable", "--state-dir", str(state), "--json"])
    assert code == 1
    assert json.loads(out)["checks"][1] == {
        "name": "install", "status": "fail", "detail": f"the mirror {gone} that the agent settings name is not a "
        "directory this node can read: mount or copy it there, or change agents/ `mirrors:`"}


def test_no_mirror_is_installable_from_the_engines_and_weights_sources(tmp_path) -> None:
    save_agent_settings(tmp_path, pb.AgentSettings(heartbeat_interval=5))
    code, out, _ = run_llmgw(["node", "doctor", "--installable", "--state-dir", str(tmp_path)])
    assert code == 0 and out.startswith("info  install  no mirror in the agent settings: engines and weights are ")
