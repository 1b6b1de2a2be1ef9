"""The feature names an agent lists in `Register.features`: what it can do beyond the protocol's base.

The control plane checks a node's features before it sends a command that needs one (a node without
`RESTART` is never sent `Restart`; one without `IGNORE_GPUS` would still offer the cards settings leave alone).
An agent lists exactly the features it implements: `llmgw.agent.FEATURES` for this version. Names are only
added, never reused for something else (agent.proto's compatibility rules).
"""

from __future__ import annotations

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

ALL = (ADOPT, LOGS, INSTALL_LLAMA_CPP, WEIGHTS_MIRROR, WEIGHTS_HTTPS, WEIGHTS_HF, RESTART, IGNORE_GPUS,
       TELEMETRY_INTERVAL, INSTALL_VLLM, INSTALL_SGLANG, WEIGHTS_HF_DIRECTORY, FABRIC_TEST, UPGRADE)
"""Every feature name defined so far, in the order they were added."""
