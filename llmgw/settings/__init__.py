"""llmgw.settings: read, validate and diff settings trees (directories or git commits)."""

from llmgw.settings.model import (
    Adapter, AgentSettings, ClusterSettings, Endpoint, EngineVersion, Listener, Model, Organisation, Prices,
    Project, Quota, Resources, Settings, StoreSettings, Team, WeightsFile,
)

__all__ = [
    "Adapter", "AgentSettings", "ClusterSettings", "Endpoint", "EngineVersion", "Listener", "Model",
    "Organisation", "Prices", "Project", "Quota", "Resources", "Settings", "StoreSettings", "Team", "WeightsFile",
]
