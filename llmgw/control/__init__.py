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

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from llmgw.control.client import AdminClient, default_state_dir
    from llmgw.control.deciding import Decision, backoff, converged, decide
    from llmgw.control.keys import SecretResolver, replica_key, sign_webhook, webhook_signature_valid
    from llmgw.control.looping import ControlLoop
    from llmgw.control.plane import ControlConfig, ControlPlane, open_control_plane
    from llmgw.control.registry import FleetRegistry, NodeRecord
    from llmgw.control.routing import build_route_table
    from llmgw.control.state import ControlState, PassRecord, WatchState
    from llmgw.control.watching import SettingsWatcher

_EXPORTS: dict[str, tuple[str, ...]] = {
    "client": ("AdminClient", "default_state_dir"),
    "deciding": ("Decision", "backoff", "converged", "decide"),
    "keys": ("SecretResolver", "replica_key", "sign_webhook", "webhook_signature_valid"),
    "looping": ("ControlLoop",),
    "plane": ("ControlConfig", "ControlPlane", "open_control_plane"),
    "registry": ("FleetRegistry", "NodeRecord"),
    "routing": ("build_route_table",),
    "state": ("ControlState", "PassRecord", "WatchState"),
    "watching": ("SettingsWatcher",),
}
"""Each name of this package's interface, by the submodule that defines it, imported when first read (PEP 562):
`llmgw status` and the other admin API commands import `llmgw.control.client` (httpx) and `stalls` without the
deciding, the loop, the gateway and the store, about 1 s of CPU at each command's start."""
__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), _EXPORTS)
