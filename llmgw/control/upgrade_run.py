"""`llmgw upgrade`'s driver: runs the pure rollout (`llmgw.control.upgrades`) against the live fleet.

`UpgradeRunner` holds the one rollout (`current`), publishes every change of it into `ControlState.upgrade` (what
`llmgw status` shows), and runs it as a task of the control plane's nursery: every `POLL` seconds it reads the fleet
(`node_seen`), `advance`s the rollout and sends the release to the nodes it names (`send_release`: the release's tar
in pieces of `PIECE_BYTES`, each an UpgradeAgent command answered by the agent; the last one is answered once the
node installed it and flipped `current`). `pause()` and `resume()` change the rollout in place. One rollout at a
time: a new one is refused while one is under way.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import trio

from llmgw.control.state import ControlState
from llmgw.control.upgrades import NodeSeen, Upgrade, UpgradeState, advance, pause, plan_upgrade, resume, sent
from llmgw.errors import LlmgwError, UsageError
from llmgw.identity import ShardState
from llmgw.wire import pb
from llmgw.wire.features import UPGRADE

log = logging.getLogger("llmgw.control")

PIECE_BYTES = 1 << 20
"""The bytes of the release's tar in one UpgradeAgent (gRPC messages stay far under their limit)."""
PIECE_TIMEOUT = 60.0
"""Seconds an agent has to answer one piece."""
INSTALL_TIMEOUT = 1800.0
"""Seconds an agent has to answer the last piece: verify and install the release (pip, offline)."""
CONFIRM_SECONDS = 120.0
"""Seconds the new agent has to register before its node rolls back by itself (UpgradeAgent.confirm_seconds)."""
POLL = 0.2


@dataclass(frozen=True)
class ReleaseTar:
    """A verified release as a tar on the control plane's disk (`path`, `size` bytes, `sha256`), of llmgw
    `version`, and the key lines the agents verify it with (`trusted_keys`)."""

    version: str
    path: Path
    size: int
    sha256: str
    trusted_keys: tuple[str, ...]

    @classmethod
    def of(cls, version: str, path: Path, trusted_keys: tuple[str, ...]) -> ReleaseTar:
        """Read `path` once for its size and sha256. Blocking."""
        digest, size = hashlib.sha256(), 0
        with path.open("rb") as stream:
            while chunk := stream.read(PIECE_BYTES):
                digest.update(chunk)
                size += len(chunk)
        return cls(version, path, size, digest.hexdigest(), trusted_keys)


def node_seen(state: ControlState) -> dict[str, NodeSeen]:
    """Every node of the fleet as the rollout sees it (`NodeSeen`): ready when every shard llmgw runs there is."""
    seen = {}
    for record in state.fleet.records():
        shards = [s for s in record.state.shards if not s.adopted_foreign]
        seen[record.node_id] = NodeSeen(record.connected, record.agent_version, record.registered_at,
                                        all(s.state is ShardState.READY for s in shards), record.warnings)
    return seen


Command = Callable[..., Awaitable[object]]
"""`ControlView.command(node_id, timeout, **body)`: one command, its CommandOutcome."""


async def send_release(command: Command, node_id: str, release: ReleaseTar,
                       confirm_seconds: float = CONFIRM_SECONDS) -> str:
    """Send `release` to `node_id` in pieces and wait for the last answer; "" when the node installed it, else the
    sentence why not (the agent's, or the connection's). A checkpoint; the tar is read in a thread."""
    offset = 0
    with release.path.open("rb") as stream:
        while True:
            data = await trio.to_thread.run_sync(stream.read, PIECE_BYTES)
            last = offset + len(data) >= release.size
            piece = pb.UpgradeAgent(version=release.version, offset=offset, data=data, total_bytes=release.size,
                                    sha256=release.sha256, last=last, trusted_keys=list(release.trusted_keys),
                                    confirm_seconds=confirm_seconds)
            try:
                outcome = await command(node_id, INSTALL_TIMEOUT if last else PIECE_TIMEOUT, upgrade_agent=piece)
            except LlmgwError as exc:
                return str(exc)
            if not outcome.ok:
                return outcome.error or "the agent refused the release"
            offset += len(data)
            if last:
                return ""


class UpgradeRunner:
    """The control plane's one rollout. `publish(upgrade)` puts it into the state; `seen()` reads the fleet;
    `send(node_id)` sends the release to one node ("" or why not)."""

    def __init__(self, publish: Callable[[Upgrade], None], seen: Callable[[], Mapping[str, NodeSeen]]):
        self.publish = publish
        self.seen = seen
        self.current: Upgrade | None = None
        self.changed = trio.Event()

    def _set(self, upgrade: Upgrade) -> None:
        if upgrade != self.current:
            self.current = upgrade
            self.publish(upgrade)
            self.changed.set()
            self.changed = trio.Event()

    def start(self, nursery: trio.Nursery, version: str, send: Callable[[str], Awaitable[str]], *,
              max_unavailable: int = 1, restart_timeout: float = CONFIRM_SECONDS + 60.0,
              ready_timeout: float = 300.0, paused: bool = False) -> Upgrade:
        """Plan a rollout of `version` over the connected nodes and run it in `nursery`; returns it as planned.
        Raises UsageError while another one is under way, or when a node cannot upgrade over its stream (an
        agent without the "upgrade" feature), naming it."""
        if self.current is not None and not self.current.ended:
            raise UsageError(f"an upgrade to llmgw {self.current.version} is under way ({self.current.state.value}):"
                             " wait for it, or pause it with `llmgw upgrade --pause`")
        upgrade = plan_upgrade(version, self.seen(), trio.current_time(), max_unavailable=max_unavailable,
                               restart_timeout=restart_timeout, ready_timeout=ready_timeout, paused=paused)
        self._set(upgrade)
        nursery.start_soon(self._run, send)
        return upgrade

    def pause(self) -> Upgrade:
        """Pause the rollout under way. Raises UsageError when there is none."""
        return self._change(pause)

    def resume(self) -> Upgrade:
        """Resume a paused rollout. Raises UsageError when there is none."""
        return self._change(resume)

    def _change(self, how: Callable[[Upgrade], Upgrade]) -> Upgrade:
        if self.current is None or self.current.ended:
            raise UsageError("no upgrade is under way (`llmgw status` shows the last one)")
        self._set(how(self.current))
        return self.current

    async def _run(self, send: Callable[[str], Awaitable[str]]) -> None:
        async def one(node_id: str) -> None:
            error = await send(node_id)
            assert self.current is not None
            if error:
                log.warning("upgrade of node %s failed: %s", node_id, error)
            self._set(sent(self.current, node_id, error, trio.current_time()))

        async with trio.open_nursery() as nursery:
            while True:
                assert self.current is not None
                upgrade, sends = advance(self.current, self.seen(), trio.current_time())
                self._set(upgrade)
                for order in sends:
                    log.info("upgrade to llmgw %s: sending the release to node %s", upgrade.version, order.node_id)
                    nursery.start_soon(one, order.node_id)
                if upgrade.ended:
                    log.info("upgrade to llmgw %s %s%s", upgrade.version, upgrade.state.value,
                             f": {upgrade.reason}" if upgrade.reason else "")
                    return
                await trio.sleep(POLL)


def upgrade_refusal(state: ControlState) -> str | None:
    """Why the connected fleet cannot be upgraded over its streams (a node whose agent lacks the "upgrade"
    feature, named with its version); None when it can."""
    old = sorted(f"{r.node_id} ({r.agent_version or 'unknown version'})" for r in state.fleet.records()
                 if r.connected and UPGRADE not in r.features)
    if old:
        return (f"the agents of {', '.join(old)} cannot upgrade over their stream: upgrade them on the node "
                "(`llmgw node add` again), then run `llmgw upgrade`")
    return None


def _release_tuple(version: str) -> tuple[int, ...] | None:
    """(0, 1, 2) of "0.1.2" (its leading dotted numbers: "0.2.0rc1" reads as (0, 2, 0)); None when it does not
    start with a number."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else None


def version_refusal(release_version: str, plane_version: str) -> str | None:
    """Why agents may not be rolled to `release_version` by a control plane of `plane_version`: the release is
    newer (control planes are upgraded first, the standbys and then the leader, docs/operations.md); None when it
    is not, or when either version does not read as numbers (nothing to compare)."""
    release, plane = _release_tuple(release_version), _release_tuple(plane_version)
    if release is None or plane is None or release <= plane:
        return None
    return (f"the release is llmgw {release_version}, newer than this control plane's llmgw {plane_version}: "
            "upgrade the control planes first (the standbys, then the leader; docs/operations.md), then run "
            "`llmgw upgrade` against the new leader")


def publish_into(update: Callable) -> Callable[[Upgrade], None]:
    """A `publish` for `UpgradeRunner` that puts the rollout into `ControlState.upgrade` through the loop's
    `update` (no pass follows: nothing placement-relevant changed)."""
    return lambda upgrade: update(lambda state: (replace(state, upgrade=upgrade), False))


__all__ = ["CONFIRM_SECONDS", "ReleaseTar", "UpgradeRunner", "UpgradeState", "node_seen", "publish_into",
           "send_release", "upgrade_refusal", "version_refusal"]


def verify_release_tar(tar_path: Path, trusted_keys: tuple[str, ...], work_dir: Path) -> ReleaseTar:
    """The release in the tar at `tar_path` (as `llmgw upgrade` sends it: the release directory's manifest, its
    signature and every file it lists), verified against `trusted_keys` (releases.trusted_keys) in a scratch
    directory under `work_dir` (removed after). Blocking. Raises: UsageError when no key is trusted; ReleaseError
    saying what does not check (`llmgw.release.verify_release`), or a tar that cannot be read."""
    import shutil
    import tarfile

    from llmgw.archives import extract_tar
    import tempfile

    from llmgw.errors import ReleaseError
    from llmgw.release import verify_release

    if not trusted_keys:
        raise UsageError("llmgw.yaml lists no releases.trusted_keys, so no release can be verified: add the public "
                         "key of whoever builds releases (`llmgw release keygen` prints it), then run `llmgw upgrade`")
    scratch = Path(tempfile.mkdtemp(prefix="verify-", dir=work_dir))
    try:
        try:
            with tarfile.open(tar_path) as tar:
                extract_tar(tar, scratch)
        except (tarfile.TarError, OSError) as exc:
            raise ReleaseError(f"the release sent is not a readable tar: {exc}") from exc
        manifest = verify_release(scratch, list(trusted_keys))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ReleaseTar.of(manifest.version, tar_path, tuple(trusted_keys))
