"""llmgw.control: the control plane (settings watcher, fleet registry, reconciler, audit, admin API).

    open_control_plane(ControlConfig(...))   async with ... as plane: the wiring (llmgw.control.opening), yielding
                                         the read-only view `ControlPlane` (llmgw.control.view.ControlView)
    ControlPlane(ControlConfig(...))     or run with `await nursery.start(plane.run)`; `plane.accept_agent(link, peer)`
    AdminClient(url, token)              the admin API from the CLI (llmgw.control.client)
    build_route_table(settings, fleet, replica_key, secret)    the gateway's routing table (pure)
    ControlState, decide(state, now)     the one immutable state and the pure pass over it (llmgw.control.deciding)
    ControlLoop                          folds every event into the next state, runs passes, then the I/O
    FleetRegistry                        what agents reported, their readings, which nodes are lost (pure value)
    replica_key(secret, replica_id)      the bearer key of a replica: HMAC-SHA256 hex of its id
"""

from llmgw.control.keys import SecretResolver, replica_key, sign_webhook, webhook_signature_valid
from llmgw.control.deciding import Decision, backoff, converged, decide
from llmgw.control.looping import ControlLoop
from llmgw.control.registry import FleetRegistry, NodeRecord
from llmgw.control.routing import build_route_table
from llmgw.control.state import ControlState, PassRecord, WatchState
from llmgw.control.watching import SettingsWatcher

__all__ = [
    "AdminClient", "ControlConfig", "ControlLoop", "ControlPlane", "ControlState", "Decision", "FleetRegistry",
    "NodeRecord", "PassRecord", "backoff", "decide",
    "SecretResolver", "SettingsWatcher", "WatchState", "build_route_table", "converged", "default_state_dir",
    "open_control_plane", "replica_key", "sign_webhook", "webhook_signature_valid",
]


def __getattr__(name: str):
    # The plane pulls in the gateway, the store and the wire transport: import them only when asked.
    if name in ("ControlPlane", "ControlConfig", "open_control_plane"):
        from llmgw.control import plane

        return getattr(plane, name)
    if name in ("AdminClient", "default_state_dir"):
        from llmgw.control import client

        return getattr(client, name)
    raise AttributeError(name)
