"""The node's nftables table `inet llmgw`, applied by the agent (root) as the control plane renders it (issue 29).

`FirewallKeeper.apply(text, digest, rollback_after, control_planes)` swaps llmgw's table in one `nft -f` transaction
(`llmgw.tools.nft.replace_script`): the table and nothing else, so other programs' tables stay as they are. A table
that fails to load changes nothing (the transaction is all or nothing): `apply` returns nft's own message and the
previous table stays. `text` "" removes the table (firewall.yaml off).

A table must never cut the agent off its control plane. After a table loads, the keeper opens new TCP connections
to the control planes' agents addresses ("host:port"), once a second; when none has succeeded within
`rollback_after` seconds it restores the table there was before (or removes its own, when there was none) and
records why (`FirewallState.error`); the same table sent again is refused with that sentence (the control plane
shows it as the CONFIGURE's failure) until the settings render another. Only one watch runs at a time: a newer
apply ends the older watch. `text` "" with no table of llmgw's on the node does nothing (not even run nft).

On a host llmgw installed (`llmgw node add`), the table is recorded in the install journal (`journal`, default
/var/lib/llmgw-install/journal.json) before it is first loaded, so `llmgw wipe` removes it; a host without a journal
(`llmgw up`, an agent started by hand) records nothing. A journal that cannot be written is logged, and the table
is applied all the same (a fleet left open is worse than a wipe that leaves a table).

`nft`: the argv that runs nft (tests run it inside a network namespace with `ip netns exec NS nft`).
Every method is a checkpoint; `apply` is cancelled with its caller, and a watch with the keeper's nursery.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from llmgw.errors import InstallError
from llmgw.install.journal import JOURNAL_PATH, FirewallTable, record_on_installed_host
from llmgw.tools.nft import REMOVE_SCRIPT, TABLE, fabric_element, replace_script, table_refusal
from llmgw.wire import pb

log = logging.getLogger("llmgw.agent")

PROBE_INTERVAL = 1.0
"""Seconds between two attempts to reach a control plane afresh after a table was applied."""


@dataclass(frozen=True)
class FirewallState:
    """What the node holds: `digest` of the table applied ("" none), `error` why the last table sent is not
    applied ("" none: nft's message, a refusal, or a rollback), `rolled_back` the digest rolled back ("" none)."""

    digest: str = ""
    error: str = ""
    rolled_back: str = ""


def report_message(state: FirewallState) -> pb.FirewallReport | None:
    """The heartbeat's FirewallReport of `state`, or None when the node holds no table and nothing failed."""
    if not (state.digest or state.error or state.rolled_back):
        return None
    return pb.FirewallReport(digest=state.digest, error=state.error, rolled_back=state.rolled_back)


class FirewallKeeper:
    """Applies llmgw's table on this node; `state` says what it holds now (module docstring)."""

    def __init__(self, nursery: trio.Nursery, nft: Sequence[str] = ("nft",), journal: Path | None = JOURNAL_PATH):
        self.nursery = nursery
        self.nft = tuple(nft)
        self.journal = journal  # None: record nowhere
        self.state = FirewallState()
        self._watch: trio.CancelScope | None = None
        self._rolled_back: dict[str, str] = {}  # digest -> why it was rolled back
        self._lock = trio.Lock()  # one swap at a time: an apply, or a watch's restore

    async def _run(self, *argv: str, script: str | None = None) -> tuple[int, str, str]:
        try:
            done = await trio.run_process([*self.nft, *argv], stdin=(script or "").encode(), capture_stdout=True,
                                          capture_stderr=True, check=False)
        except OSError as exc:
            return 127, "", f"cannot run {self.nft[0]}: {exc}"
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")

    async def current(self) -> str:
        """The table llmgw has on this node now, as `nft list table inet llmgw` prints it ("" none)."""
        code, out, _ = await self._run("list", "table", *TABLE.split())
        return out if code == 0 else ""

    async def _load(self, script: str) -> str:
        code, _, err = await self._run("-f", "-", script=script)
        return "" if code == 0 else (err.strip() or f"nft exited with status {code}")

    async def apply(self, text: str, digest: str, rollback_after: float = 60.0,
                    control_planes: Sequence[str] = ()) -> FirewallState:
        """Swap llmgw's table for `text` ("" removes it), then watch that a control plane is still reachable
        (module docstring). Returns the state after the swap; a failure leaves the previous table and says why in
        `error` (nft's message, with "nft refused the table:" before it)."""
        async with self._lock:
            return await self._apply(text, digest, rollback_after, control_planes)

    async def _apply(self, text: str, digest: str, rollback_after: float, control_planes: Sequence[str]) -> FirewallState:
        if text and digest == self.state.digest and not self.state.error and await self.current():
            return self.state
        if not text and not await self.current():  # nothing of llmgw's to remove (or no nft on this node)
            self.state = FirewallState()
            return self.state
        refusal = (table_refusal(text) or self._rolled_back.get(digest)) if text else None
        if refusal:
            self.state = FirewallState(self.state.digest, refusal)
            return self.state
        previous = await self.current()
        if text:
            await self._record_in_journal()
        error = await self._load(replace_script(text) if text else REMOVE_SCRIPT)
        if error:
            self.state = FirewallState(self.state.digest, f"nft refused the table: {error}")
            log.warning("firewall: %s", self.state.error)
            return self.state
        before = self.state.digest
        self.state = FirewallState(digest if text else "")
        log.info("firewall: table %s %s", TABLE, f"applied (digest {digest})" if text else "removed")
        if self._watch is not None:  # the older table's watch ends: that table is gone
            self._watch.cancel()
            self._watch = None
        if text and control_planes:
            self._watch = trio.CancelScope()
            self.nursery.start_soon(self._keep_or_restore, self._watch, previous, before, digest, rollback_after,
                                    tuple(control_planes))
        return self.state

    async def _record_in_journal(self) -> None:
        """Intent first: the install journal lists llmgw's table before it is loaded (module docstring)."""
        if self.journal is None:
            return
        family, name = TABLE.split()
        try:
            await trio.to_thread.run_sync(record_on_installed_host, FirewallTable(family, name), self.journal)
        except InstallError as exc:
            log.warning("firewall: the table is applied but not recorded for `llmgw wipe`: %s", exc)
            return
        self.journal = None  # listed (or no journal here): once per agent is enough

    async def let_in(self, address: str, port: int, seconds: float) -> str:
        """Let `address` reach TCP `port` for `seconds` (a fabric test's client, `llmgw.tools.nft.fabric_element`),
        when llmgw holds a table here; "" done or nothing to do, else why not (nft's message)."""
        if not self.state.digest:
            return ""
        try:
            script = fabric_element(address, port, seconds)
        except ValueError:
            return f"the fabric test's client {address!r} is not an IP address: the firewall cannot let it in"
        async with self._lock:  # not while a swap recreates the sets
            return await self._load(script)

    async def _keep_or_restore(self, scope: trio.CancelScope, previous: str, before: str, digest: str,
                               rollback_after: float, control_planes: tuple[str, ...]) -> None:
        with scope:
            with trio.move_on_after(rollback_after):
                while not await _reach_any(control_planes):
                    await trio.sleep(PROBE_INTERVAL)
                return
            async with self._lock:  # a newer apply waiting here cancels this watch first
                with trio.CancelScope(shield=True):  # a restore begun is finished
                    error = await self._load(replace_script(previous) if previous else REMOVE_SCRIPT)
                why = (f"table {digest} rolled back: no control plane ({', '.join(control_planes)}) could be reached "
                       f"within {rollback_after:g} s of applying it")
                if error:
                    why += f"; restoring the previous table failed too: {error}"
                self.state = FirewallState(before if not error else digest, why, digest)
                self._rolled_back[digest] = why + "; it is not applied again: change firewall.yaml"
                self._watch = None
            log.warning("firewall: %s", why)


async def _reach_any(addresses: tuple[str, ...]) -> bool:
    """Whether a new TCP connection to one of `addresses` ("host:port", "[v6]:port") opens within a second."""
    for address in addresses:
        host, _, port = address.rpartition(":")
        with trio.move_on_after(PROBE_INTERVAL):
            try:
                stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
            except (OSError, ValueError):
                continue
            await stream.aclose()
            return True
    return False
