"""llmgw.agent: everything that runs on a node (see DESIGN.md).

Public API: `run_agent(config, connect)` with `AgentConfig` (the node agent), `Supervisor` (engine processes: start, stop, restart with backoff, adopt after an agent restart),
`ShardSpec` / `ShardView` (what the supervisor runs and reports), `LogRing`, `read_inventory` / `Inventory`.
"""

from llmgw.agent.config import AgentConfig
from llmgw.agent.inventory import Inventory, read_inventory
from llmgw.agent.logs import LogRing
from llmgw.agent.shards import ShardSpec, ShardView
from llmgw.agent.runtime import run_agent
from llmgw.agent.supervisor import ForeignEngine, Supervisor

__all__ = ["AgentConfig", "ForeignEngine", "Inventory", "LogRing", "ShardSpec", "ShardView", "Supervisor", "read_inventory", "run_agent"]
