"""llmgw.agent: everything that runs on a node (see DESIGN.md).

Public API: `run_agent(config, connect)` with `AgentConfig` (the node agent; returns `RESTART` when asked to
restart, and `run_agent_restarting` runs it again in-process), `FEATURES` and `ENGINES_INSTALLABLE` (what its
Register says it can do and install), `Supervisor` (engine processes: start, stop, restart with backoff, adopt after an agent restart),
`ShardSpec` / `ShardView` (what the supervisor runs and reports), `LogRing`, `read_inventory` / `Inventory`.
"""

from llmgw.agent.config import AgentConfig
from llmgw.agent.inventory import Inventory, read_inventory
from llmgw.agent.logs import LogRing
from llmgw.agent.shards import ShardSpec, ShardView
from llmgw.agent.reporting import ENGINES_INSTALLABLE, FEATURES
from llmgw.agent.runtime import RESTART, run_agent, run_agent_restarting
from llmgw.agent.supervisor import ForeignEngine, Supervisor

__all__ = [
    "ENGINES_INSTALLABLE", "FEATURES", "RESTART", "AgentConfig", "ForeignEngine", "Inventory", "LogRing", "ShardSpec",
    "ShardView", "Supervisor", "read_inventory", "run_agent", "run_agent_restarting",
]
