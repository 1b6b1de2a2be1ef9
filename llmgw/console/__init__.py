"""llmgw.console: the web console, quart-trio pages under /console on the admin listener.

    Console(snapshot, authorise=..., history=...)   the ASGI app (llmgw.console.app); `run_sampler` feeds the charts
    FleetHistory, GpuSeries                          one-minute GPU buckets of the last hour (pure, llmgw.console.buckets)

It reads the control plane through `ControlPlane.snapshot()` (an immutable `ControlState`) and the status document
only (see docs/console.md).
"""

from llmgw.console.app import Console
from llmgw.console.buckets import MINUTES, FleetHistory, GpuSeries

__all__ = ["MINUTES", "Console", "FleetHistory", "GpuSeries"]
