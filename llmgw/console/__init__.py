"""llmgw.console: the web console, quart-trio pages under /console on the admin listener.

    Console(snapshot, authorise=..., history=...)   the ASGI app (llmgw.console.app); `run_sampler` feeds the charts
    FleetHistory, GpuSeries                          one-minute GPU buckets of the last hour (pure, llmgw.console.buckets)

It reads the control plane through `ControlView.snapshot()` (an immutable `ControlState`) and the status document
only (see docs/console.md), and imports of `llmgw.control` only its view module (`llmgw.control.view`, an import
contract); the CLI mounts it on the admin listener (`llmgw.cli.console_mount`).
"""

from llmgw.console.app import Console
from llmgw.console.buckets import MINUTES, FleetHistory, GpuSeries
from llmgw.console.sessions import Login

__all__ = ["MINUTES", "Console", "FleetHistory", "GpuSeries", "Login"]
