"""The feature names an agent lists in `Register.features`: what it can do beyond the protocol's base.

The control plane checks a node's features before it sends a command that needs one (a node without
`RESTART` is never sent `Restart`; one without `IGNORE_GPUS` would still offer the cards settings leave alone).
An agent lists exactly the features it implements: `llmgw.agent.FEATURES` for this version. Names are only
added, never reused for something else (agent.proto's compatibility rules).

What a ControlMessage needs (`needed`, pure): its body's kind (`BASE_KINDS` every agent of protocol 1 handles;
every other kind names its feature in `KIND_FEATURES`, so a kind added later is never sent to an agent that
does not list it), and what some fields ask for (an InstallEngine's engine, a StartShard's weights sources,
AgentSettings' `ignore_gpus`). The control plane sends nothing whose needs an agent's list lacks
(`llmgw.control.sessions.AgentSession.send`; a pass refuses the action before, `llmgw.control.deciding`).
An agent that lists no features at all (none of protocol 1 does) gets the base only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

ADOPT = "adopt"                        # engines survive an agent restart and are adopted (same pids)
LOGS = "logs"                          # RequestLogs answers with the agent's or a shard's log lines
INSTALL_LLAMA_CPP = "install:llama.cpp"  # InstallEngine for llama.cpp (also in Register.engines_installable)
WEIGHTS_MIRROR = "weights:mirror"      # weights from <mirror>/sha256/<digest>
WEIGHTS_HTTPS = "weights:https"        # weights from https:// URLs
WEIGHTS_HF = "weights:hf"              # weights from hf://org/repo[@revision]/path
RESTART = "restart"                    # Restart over the stream: answers, restarts, engines keep serving
IGNORE_GPUS = "agent_settings.ignore_gpus"  # AgentSettings.ignore_gpus: those GPUs are not reported, read or offered
TELEMETRY_INTERVAL = "agent_settings.telemetry_interval"  # readings every AgentSettings.telemetry_interval
INSTALL_VLLM = "install:vllm"          # InstallEngine for vllm: a venv from InstallEngine.python_packages
INSTALL_SGLANG = "install:sglang"      # InstallEngine for sglang: the same, on GPU nodes (llmgw.engines.builds)
WEIGHTS_HF_DIRECTORY = "weights:hf-directory"  # a WeightsFile naming hf://org/repo@<revision>/[dir/], listed by the Hub
FABRIC_TEST = "fabric-test:ib_write_bw"  # FabricTest: perftest's ib_write_bw server or client on one adapter
UPGRADE = "upgrade"                    # UpgradeAgent: a release in pieces, installed beside, re-exec, rollback
WIPE = "wipe"                          # WipeNode: engines stopped, the install journal undone, the agent stopped
TRAINING = "training:lora"             # StartTraining, CancelTraining: LoRA jobs run by the agent (llmgw.training)

ALL = (ADOPT, LOGS, INSTALL_LLAMA_CPP, WEIGHTS_MIRROR, WEIGHTS_HTTPS, WEIGHTS_HF, RESTART, IGNORE_GPUS,
       TELEMETRY_INTERVAL, INSTALL_VLLM, INSTALL_SGLANG, WEIGHTS_HF_DIRECTORY, FABRIC_TEST, UPGRADE,
       WIPE, TRAINING)
"""Every feature name defined so far, in the order they were added."""

BASE_KINDS = frozenset({
    "start_shard", "stop_shard", "install_engine", "agent_settings", "registered", "slurm_jobs_recorded",
    "certificate_renewed", "trust_certificates",
})
"""The ControlMessage body kinds every agent of protocol 1 handles (all of them were there before agents listed
what they add). Closed: a kind added later goes to `KIND_FEATURES` (tests/wire/test_features_needed.py checks that
every kind of agent.proto is in one of the two)."""

KIND_FEATURES = {"request_logs": LOGS, "restart": RESTART, "fabric_test": FABRIC_TEST, "upgrade_agent": UPGRADE,
                 "wipe_node": WIPE, "start_training": TRAINING, "cancel_training": TRAINING}
"""The feature a ControlMessage body kind needs, for the kinds outside `BASE_KINDS`."""


def weights_feature(source: str) -> str | None:
    """The feature fetching weights from `source` needs: hf://.../ (a directory) WEIGHTS_HF_DIRECTORY, hf://
    WEIGHTS_HF, https:// and http:// WEIGHTS_HTTPS; None for file:// and the mirrors (the base)."""
    if source.startswith("hf://"):
        return WEIGHTS_HF_DIRECTORY if source.endswith("/") else WEIGHTS_HF
    if source.startswith(("https://", "http://")):
        return WEIGHTS_HTTPS
    return None


def weights_features(sources: Iterable[str]) -> tuple[str, ...]:
    """The features fetching every one of `sources` needs, each once, in the order first needed."""
    return tuple(dict.fromkeys(f for f in map(weights_feature, sources) if f is not None))


def install_feature(engine: str) -> str:
    """The feature installing `engine` ("llama.cpp", or "llama.cpp@b11434") needs: "install:llama.cpp"."""
    return f"install:{engine.partition('@')[0]}"


def needed(message: Any) -> tuple[str, ...]:
    """The features an agent must list to be sent `message` (a `pb.ControlMessage`), each once: its kind's (none for
    `BASE_KINDS`; "kind:<name>" for a kind neither table knows, which no agent lists, so it is never sent), then its
    fields'. Pure."""
    kind = message.WhichOneof("body")
    if kind is None:
        return ()
    features: list[str] = []
    if kind not in BASE_KINDS:
        features.append(KIND_FEATURES.get(kind, f"kind:{kind}"))
    body = getattr(message, kind)
    if kind == "install_engine":
        features.append(install_feature(body.engine))
    elif kind == "start_shard":
        sources = [w.source for w in body.weights] + [w.source for a in body.adapters for w in a.weights]
        features += weights_features(sources)
    elif kind == "agent_settings" and body.ignore_gpus:
        features.append(IGNORE_GPUS)
    return tuple(dict.fromkeys(features))


def lacking(message: Any, listed: Sequence[str] | frozenset[str]) -> tuple[str, ...]:
    """The features `message` needs (`needed`) that `listed` (an agent's Register.features) does not hold."""
    have = set(listed)
    return tuple(f for f in needed(message) if f not in have)
