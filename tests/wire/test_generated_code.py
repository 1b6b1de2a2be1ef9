"""The committed protobuf/gRPC code matches agent.proto and imports as part of the package."""

from __future__ import annotations

import subprocess
import sys

from llmgw import wire
from llmgw.wire import generate


def test_committed_generated_code_matches_agent_proto() -> None:
    stale = generate.stale_files()
    assert stale == [], f"regenerate with `python -m llmgw.wire.generate`: {stale} differ from agent.proto"


def test_generated_grpc_module_imports_the_message_module_relatively() -> None:
    text = (generate.PACKAGE_DIR / "agent_pb2_grpc.py").read_text()
    assert "from . import agent_pb2 as agent__pb2" in text
    assert "\nimport agent_pb2" not in text


def test_generate_check_exits_zero_when_fresh() -> None:
    result = subprocess.run([sys.executable, "-m", "llmgw.wire.generate", "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_pb_is_the_generated_module_and_messages_carry_the_protocol_version() -> None:
    assert wire.pb.DESCRIPTOR.package == "llmgw.wire.v1"
    assert wire.PROTOCOL_VERSION == 1
    agent = wire.agent_message(heartbeat=wire.pb.Heartbeat(time=2.5))
    control = wire.control_message(command_id="c1", restart=wire.pb.Restart())
    assert (agent.protocol, agent.WhichOneof("body")) == (1, "heartbeat")
    assert (control.protocol, control.command_id, control.WhichOneof("body")) == (1, "c1", "restart")
