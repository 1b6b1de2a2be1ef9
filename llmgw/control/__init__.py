"""llmgw.control: the control plane (settings watcher, fleet registry, reconciler, audit, admin API).

    ControlPlane(ControlConfig(...))     run with `await nursery.start(plane.run)`; `plane.accept_agent(link, peer)`
    AdminClient(url, token)              the admin API from the CLI (llmgw.control.client)
    build_route_table(settings, fleet, replica_key, secret)    the gateway's routing table (pure)
    FleetRegistry                        what agents reported, which nodes are lost (pure)
    replica_key(secret, replica_id)      the bearer key of a replica: HMAC-SHA256 hex of its id
"""

from llmgw.control.keys import SecretResolver, replica_key, sign_webhook, webhook_signature_valid
from llmgw.control.reconciling import PassRecord, Reconciler, converged
from llmgw.control.registry import FleetRegistry, NodeRecord
from llmgw.control.routing import build_route_table
from llmgw.control.watching import SettingsWatcher, WatchState

__all__ = [
    "AdminClient", "ControlConfig", "ControlPlane", "FleetRegistry", "NodeRecord", "PassRecord", "Reconciler",
    "SecretResolver", "SettingsWatcher", "WatchState", "build_route_table", "converged", "default_state_dir",
    "replica_key", "sign_webhook", "webhook_signature_valid",
]


def __getattr__(name: str):
    # The plane pulls in the gateway, the store and the wire transport: import them only when asked.
    if name in ("ControlPlane", "ControlConfig"):
        from llmgw.control import plane

        return getattr(plane, name)
    if name in ("AdminClient", "default_state_dir"):
        from llmgw.control import client

        return getattr(client, name)
    raise AttributeError(name)
