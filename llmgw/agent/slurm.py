"""The Slurm daemons an agent keeps on its node, as the control plane's SlurmRole says (issue 15).

`SlurmKeeper.apply(role)` writes the munge key (mode 0400, owner `munge` when the agent runs as root and that user
exists; never on a command line), slurm.conf, gres.conf and (on the controller) slurmdbd.conf (mode 0600), makes
slurmdbd's MariaDB database and user when they are missing (SQL on the client's stdin, never its command line;
the server's own settings are left as they are), then starts munged, slurmdbd, slurmctld and slurmd in that order,
each waiting for the one before to answer. On the controller with accounting it keeps the role's accounts with
`sacctmgr` (projects as accounts, members as users; only what llmgw made is changed). A daemon that exits is started again after a backoff (1 s doubling to
60 s; back to 1 s once it ran a minute). A role with no daemons stops what the keeper started. `run()` also keeps
the node's drain in step with the role: resumed when lent and drained with llmgw's reason, drained with llmgw's
reason when not lent, an administrator's drain (another reason) never touched (`llmgw.tools.slurm.drain_verdict`).
`report()` is the heartbeat's SlurmReport: each daemon's state, pid, restarts and last error in Slurm's own words,
Slurm's version, the node's state, reason and running job steps, and on the controller with accounting the jobs
that ended since the sacct cursor (`read_finished_jobs`, `recorded`), which the control plane prices into usage
once each. With slurm.yaml `users: llmgw` it gives the node the role's Linux users, their homes on the shared path
and their SSH keys (`sync_users`, decided by llmgw.tools.linux_users). With slurm.yaml `containers: runc` it writes
etc/oci.conf from its own template (llmgw.tools.slurm_oci), so `srun --container` runs steps with runc; with
`shared.export` it keeps nfs-ganesha exporting the shared path on the exporting node, or mounts it on the others
(`keep_shared_path`, llmgw.tools.nfs_export).

Layout (`SlurmLayout`): everything under one directory (the role's @SLURM_DIR@): munge/ (key, socket, seed),
state/, spool/, log/, run/, etc/. The agent runs its own munged on its own socket (so a site's or test's other
munged is left alone), and the daemons run as the agent's user. Slurm missing or broken on the node is a warning in
the report with Slurm's own words, never an exception out of the keeper.

Programs: Debian's slurm-wlm 22.05 (`slurmctld -D -i`, `slurmd -D -N NODE`, `slurmdbd -D`, `munged -F`), their
man pages at slurm.schedmd.com and munged(8).
"""

from __future__ import annotations

import enum
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from llmgw.agent.shards import next_backoff
from llmgw.tools.slurm import SACCT_FIELDS, drain_verdict, parse_sacct, parse_sacctmgr_accounts, parse_sacctmgr_assocs, parse_scontrol_nodes
from llmgw.tools.conf_keys import GRES_CONF_KEYS, SLURM_CONF_KEYS, SLURMDBD_CONF_KEYS, rendered_problem
from llmgw.tools.nfs_export import NFS_PORT, ganesha_conf, mount_decision, parse_mountinfo
from llmgw.tools.slurm_oci import oci_conf
from llmgw.tools.linux_users import MARK, UserSpec, parse_group, parse_passwd, parse_shadow_expiry, user_commands
from llmgw.tools.slurm_accounts import WantedAccount, account_commands
from llmgw.tools.values import ParseError
from llmgw.wire import pb

log = logging.getLogger("llmgw.agent.slurm")

STABLE_AFTER = 60.0
"""Seconds a daemon must run before its next crash restarts it after the first backoff again."""
BACKOFF_MAX = 60.0
CHECK_INTERVAL = 10.0
"""Seconds between reads of the node in Slurm (state, drain, job steps)."""
START_TIMEOUT = 30.0
"""Seconds a daemon has to answer (munged's socket, slurmdbd's and slurmctld's ports) before the next starts."""
FINISHED_WINDOW = 3600.0
"""Seconds back that the controller's agent reads ended jobs when it has no cursor (no control plane has recorded
any job of this cluster yet)."""
CURSOR_MARGIN = 300.0
"""Seconds before the cursor that every read starts: a job slurmdbd learns of late (its end written after the read
that passed its end time) is still read once it is there. Jobs read twice are recorded once (their request id)."""
MAX_FINISHED = 2000
"""The most ended jobs one beat carries (the oldest: the cursor then stops at the last one carried)."""
ENDED_STATES = "CD,F,CA,TO,OOM,NF,PR,DL,BF"
"""sacct --state: completed, failed, cancelled, timeout, out of memory, node fail, preempted, deadline, boot fail."""
COMMAND_TIMEOUT = 30.0
"""Seconds a Slurm command (scontrol, squeue, sacct, sacctmgr) may take before it counts as failed."""
_TAIL = 8
GANESHA = "ganesha.nfsd"
"""nfs-ganesha's daemon: the shared path's NFS server on the node of slurm.yaml `shared.export`."""
KEPT_APART = ("munged", GANESHA)
"""Daemons a change of Slurm's files does not restart."""


@dataclass(frozen=True)
class SlurmLayout:
    """Where the keeper puts Slurm's files on this node, and who runs the daemons (`user`: the agent's)."""

    root: Path
    user: str = field(default_factory=lambda: pwd.getpwuid(os.geteuid()).pw_name)
    users_prefix: str = ""
    """shadow's `--prefix DIR` for the Linux users of `users: llmgw` ("" : the machine's own /etc/passwd); tests."""

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def authorized_keys(self) -> Path:
        """The directory of the users' SSH keys, one file per login: sshd's `AuthorizedKeysFile <this>/%u`."""
        return self.root / "ssh" / "authorized_keys"

    def etc_file(self, name: str) -> Path:
        """/etc/<name> of the users' database: under `users_prefix` when one is given."""
        return Path(self.users_prefix or "/") / "etc" / name

    def fill(self, text: str) -> str:
        """A file of the role with its placeholders (llmgw.plan.slurm_roles.AGENT_PATHS) replaced."""
        return (text.replace("@SLURM_DIR@", str(self.root)).replace("@SLURM_USER@", self.user)
                .replace("@MUNGE_SOCKET@", str(self.munge_socket)))

    def env(self) -> dict[str, str]:
        """The environment of every Slurm program the keeper runs: SLURM_CONF pointing at its slurm.conf."""
        return dict(os.environ, SLURM_CONF=str(self.slurm_conf))


class DaemonState(str, enum.Enum):
    """One Slurm daemon's state as the keeper reports it. The wire (`SlurmDaemon.state`) carries `.value`."""

    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"          # exited, waiting to start again
    STOPPED = "stopped"


@dataclass
class Daemon:
    """One daemon's state as reported (`DaemonState`); `error` the last exit with its log's last lines."""

    name: str
    argv: tuple[str, ...]
    state: DaemonState = DaemonState.STARTING
    pid: int = 0
    restarts: int = 0
    error: str = ""
    started: trio.Event = field(default_factory=trio.Event)
    process: trio.Process | None = None

    def message(self) -> pb.SlurmDaemon:
        return pb.SlurmDaemon(name=self.name, state=self.state.value, pid=self.pid, restarts=self.restarts, error=self.error)


def _tail(path: Path, lines: int = _TAIL) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def keep_running(daemon: Daemon, log_file: Path, env: dict[str, str] | None = None, *,
                       stable_after: float = STABLE_AFTER,
                       on_change: Callable[[Daemon], None] = lambda daemon: None) -> None:
    """Run `daemon.argv` until cancelled, starting it again after each exit: wait 1 s, doubling to BACKOFF_MAX,
    back to 1 s after a run of `stable_after` seconds. Output goes to `log_file` (appended); each exit is kept in
    `daemon.error` with the log's last lines. Cancelled: the process is sent SIGTERM, then SIGKILL after 10 s.
    A program that cannot be started (missing, not executable) is an exit like any other, never raised.
    `on_change(daemon)` is called when it is running and when it exited."""
    delay = 0.0
    log_file.parent.mkdir(parents=True, exist_ok=True)
    while True:
        began = trio.current_time()
        daemon.state = DaemonState.STARTING
        try:
            with open(log_file, "ab") as out:
                process = await trio.lowlevel.open_process(list(daemon.argv), stdout=out, stderr=subprocess.STDOUT,
                                                           env=env, start_new_session=True)
        except OSError as exc:
            daemon.error = f"{daemon.argv[0]} could not start: {exc}"
            code = None
        else:
            daemon.process, daemon.pid, daemon.state = process, process.pid, DaemonState.RUNNING
            daemon.started.set()
            on_change(daemon)
            try:
                code = await process.wait()
            finally:
                if process.returncode is None:
                    with trio.CancelScope(shield=True):
                        await _stop(process)
                    daemon.state, daemon.pid = DaemonState.STOPPED, 0
            daemon.error = f"{daemon.name} exited with {_exit_words(code)}: {_tail(log_file)}".rstrip(": ")
        daemon.restarts += 1
        daemon.state, daemon.pid = DaemonState.BACKOFF, 0
        log.warning("%s", daemon.error)
        on_change(daemon)
        delay = 0.0 if trio.current_time() - began >= stable_after else delay
        delay = next_backoff(delay, 1.0, BACKOFF_MAX)
        await trio.sleep(delay)


def _sacct_time(when: float) -> str:
    """Unix seconds as sacct's -S/-E take them: local time "YYYY-MM-DDTHH:MM:SS" (sacct(1), TIME FORMAT)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))


def _exit_words(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


async def _stop(process: trio.Process, grace: float = 10.0) -> None:
    process.terminate()
    with trio.move_on_after(grace):
        await process.wait()
        return
    process.kill()
    await process.wait()


def _count_lines(output: bytes, skip: str = "") -> int:
    """Non-empty lines of a command's output, less those ending with `skip` (when given)."""
    lines = [line.strip() for line in output.decode(errors="replace").splitlines()]
    return len([line for line in lines if line and not (skip and line.endswith(skip))])


def _listening(address: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex((address, port)) == 0


def _controller_address(slurm_conf: str) -> str:
    """The address in "SlurmctldHost=name(address)" ("127.0.0.1" when none is given)."""
    for line in slurm_conf.splitlines():
        if line.startswith("SlurmctldHost=") and "(" in line:
            return line.split("(", 1)[1].rstrip(")")
    return "127.0.0.1"


def _write(path: Path, data: bytes, mode: int, owner: str | None = None) -> None:
    """Write `data` to `path` with `mode` from the start (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    if owner:
        shutil.chown(tmp, owner)
    tmp.replace(path)


def _write_if_changed(path: Path, data: bytes, mode: int) -> bool:
    """Write `data` to `path` (as `_write`) unless it holds that already; True when written."""
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    _write(path, data, mode)
    return True


def _munge_owner() -> str | None:
    """"munge" when the agent runs as root and the user exists: the key is then owned by munge."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return None
    return "munge"


def refused_files(layout: SlurmLayout, role: pb.SlurmRole) -> str | None:
    """Why the role's files must not be written, or None: each file as it would be written (placeholders filled)
    holds only `Key=Value` lines with the keys llmgw's renderer writes there (`llmgw.tools.conf_keys`: slurm.conf,
    gres.conf, slurmdbd.conf). A file with any other key (a `Prolog=`, an `Include`) or a control character is
    refused whole, so a tampered or injected file never reaches slurmctld or slurmd."""
    files = [("slurm.conf", role.slurm_conf, SLURM_CONF_KEYS), ("gres.conf", role.gres_conf, GRES_CONF_KEYS)]
    if role.slurmdbd_conf:
        files.append(("slurmdbd.conf", role.slurmdbd_conf, SLURMDBD_CONF_KEYS))
    for name, text, keys in files:
        problem = rendered_problem(name, layout.fill(text), keys)
        if problem is not None:
            return f"the control plane's {problem}; Slurm here keeps its earlier files"
    return None


def without_secrets(settings: pb.AgentSettings) -> pb.AgentSettings:
    """A copy of `settings` without the Slurm role's secrets (munge key, slurmdbd.conf, database password), as the
    agent keeps it on disk for its next start: the keeper then uses the files it wrote before."""
    copy = pb.AgentSettings()
    copy.CopyFrom(settings)
    for name in ("munge_key", "slurmdbd_conf", "storage_password"):
        copy.slurm.ClearField(name)
    return copy


def storage_sql(role: pb.SlurmRole) -> str:
    """The SQL that makes slurmdbd's database and user when missing and sets the user's password (derived from the
    munge key, so kept in step with it). Sent on the mysql client's stdin. Nothing else of the server changes."""
    db, user, password = role.storage_database, role.storage_user, role.storage_password.replace("'", "''")
    lines = [f"CREATE DATABASE IF NOT EXISTS `{db}`;"]
    for host in ("localhost", "127.0.0.1"):
        lines += [f"CREATE USER IF NOT EXISTS '{user}'@'{host}' IDENTIFIED BY '{password}';",
                  f"ALTER USER '{user}'@'{host}' IDENTIFIED BY '{password}';",
                  f"GRANT ALL ON `{db}`.* TO '{user}'@'{host}';"]
    return "\n".join(lines) + "\n"


class SlurmKeeper:
    """Keeps this node's Slurm daemons as the last SlurmRole says. `apply(role)` (re)starts what changed; `run()`
    checks the node in Slurm every CHECK_INTERVAL; `report()` is the heartbeat's SlurmReport (None: no part)."""

    def __init__(self, layout: SlurmLayout, nursery: trio.Nursery, *, programs: dict[str, str] | None = None):
        self.layout = layout
        self.nursery = nursery
        self.programs = programs or {}
        self.role = pb.SlurmRole()
        self.daemons: dict[str, Daemon] = {}
        self._scopes: dict[str, trio.CancelScope] = {}
        self.warnings: list[str] = []  # from the last apply
        self._checks: list[str] = []    # from the last check of the node and of ended jobs
        self.version = ""
        self.node_state = ""
        self.node_reason = ""
        self.job_steps = 0
        self.finished_jobs: list[pb.SlurmJob] = []
        self.finished_since: float | None = None  # the sacct cursor (unix seconds): None until the first one is known
        self.finished_until = 0.0  # up to where `finished_jobs` holds every ended job
        self.users_ready = 0
        self._lock = trio.Lock()

    def _program(self, name: str) -> str | None:
        """The executable for `name`: the `programs` override when it exists, else the one on PATH; None: missing."""
        if name in self.programs:
            return self.programs[name] if os.access(self.programs[name], os.X_OK) else None
        return shutil.which(name)

    # --- applying a role ---------------------------------------------------------------------------------------

    async def apply(self, role: pb.SlurmRole) -> None:
        """Make the node match `role`: files written, daemons started or stopped, drain set. Never raises for a
        Slurm that is missing or broken: that goes to `warnings` (the report's). A role whose files hold a key llmgw
        never writes there is not taken at all (`refused_files`, a warning saying which line)."""
        async with self._lock:
            refused = refused_files(self.layout, role)
            if refused is not None:  # the role is not taken: the files, daemons and drain stay as they were
                self.warnings = [refused]
                return
            self.role = role
            if role.finished_since:  # the store's cursor, sent with every CONFIGURE of the controller
                self.finished_since = role.finished_since
            wanted = list(role.daemons)
            if not wanted:
                await self._stop_all()
                self.warnings = []
                return
            warnings: list[str] = []
            for name in ("munged", *wanted):
                if self._program(name) is None:
                    warnings.append(f"{name} is not installed on this node (Debian: slurm-wlm, slurmdbd, munge); "
                                    "Slurm is not started here")
            if warnings:
                self.warnings = warnings
                await self._stop_all()
                return
            try:
                changed = await trio.to_thread.run_sync(self._write_files, role)
            except OSError as exc:
                self.warnings = [f"cannot write Slurm's files under {self.layout.root}: {exc}"]
                return
            warnings += await self.keep_shared_path(role)
            warnings += await self.sync_users(role)
            if not self.layout.munge_key.exists():
                self.warnings = [*warnings, "no munge key: the control plane sent none and none was written before"]
                return
            if "slurmdbd" in wanted and role.storage_password:  # none: kept settings, the database is made
                problem = await self._make_storage(role)
                if problem:
                    warnings.append(problem)
            self.warnings = warnings
            for name in [n for n in self.daemons if n not in KEPT_APART and (n not in wanted or changed)]:
                await self._stop(name)
            if "munge" in changed:
                await self._stop("munged")
            await self._start("munged", lambda: self.layout.munge_socket.exists())
            address = _controller_address(role.slurm_conf)
            for name in wanted:
                ready = {"slurmdbd": lambda: _listening(address, role.slurmdbd_port),
                         "slurmctld": lambda: _listening(address, role.slurmctld_port),
                         "slurmd": lambda: self._registered(role.node_name)}[name]
                await self._start(name, ready)
            if "slurmdbd" in wanted:
                await self._sync_accounts(role)
        await self.check_node()

    def _write_files(self, role: pb.SlurmRole) -> set[str]:
        """Write what differs from what is on disk; returns which of "munge", "slurm" changed."""
        layout = self.layout
        for sub in ("state", "spool", "log", "run", "etc"):
            (layout.root / sub).mkdir(parents=True, exist_ok=True)
        layout.munge_dir.mkdir(parents=True, exist_ok=True)
        layout.munge_dir.chmod(0o700)
        changed: set[str] = set()
        oci = layout.etc / "oci.conf"
        if role.containers:  # read by slurmstepd at each step: no daemon restarts for it
            program = self._program("runc")
            if program is not None:
                _write_if_changed(oci, oci_conf(role.containers, program).encode(), 0o644)
        else:
            oci.unlink(missing_ok=True)
        wanted = {"slurm.conf": (layout.slurm_conf, layout.fill(role.slurm_conf).encode(), 0o644, None, "slurm"),
                  "gres.conf": (layout.etc / "gres.conf", layout.fill(role.gres_conf).encode(), 0o644, None, "slurm")}
        if role.munge_key:  # none: kept settings, the key written before stays
            wanted["munge.key"] = (layout.munge_key, role.munge_key, 0o400, _munge_owner(), "munge")
        if role.slurmdbd_conf:
            wanted["slurmdbd.conf"] = (layout.etc / "slurmdbd.conf", layout.fill(role.slurmdbd_conf).encode(), 0o600,
                                       None, "slurm")
        for _, (path, data, mode, owner, group) in wanted.items():
            try:
                same = path.read_bytes() == data
            except OSError:
                same = False
            if not same:
                _write(path, data, mode, owner)
                changed.add(group)
        return changed

    async def keep_shared_path(self, role: pb.SlurmRole) -> list[str]:
        """slurm.yaml `shared.export`: on the exporting node (`nfs_clients`), nfs-ganesha kept running with the
        export of `shared_path` to those addresses only (llmgw.tools.nfs_export; restarted when its configuration
        changes, stopped when the node exports nothing); on the others (`nfs_server`), `shared_path` mounted from it
        when it is not already. Returns warnings in words (ganesha missing, the mount refused in mount's words)."""
        warnings: list[str] = []
        if role.containers and self._program("runc") is None:
            warnings.append("runc is not installed on this node (Debian: runc): no oci.conf is written, and "
                            "`srun --container` runs steps outside any container here")
        if not role.nfs_clients:
            await self._stop(GANESHA)
        else:
            conf = self.layout.root / "nfs" / "ganesha.conf"
            try:
                text = ganesha_conf(role.shared_path, role.nfs_clients, str(self.layout.root / "nfs" / "recovery"))
                Path(role.shared_path).mkdir(parents=True, exist_ok=True)
                for sub in ("nfs/recovery", "run", "log"):
                    (self.layout.root / sub).mkdir(parents=True, exist_ok=True)
                changed = _write_if_changed(conf, text.encode(), 0o644)
            except (ValueError, OSError) as exc:
                return [*warnings, f"the shared path is not exported: {exc}"]
            if self._program(GANESHA) is None:
                return [*warnings, "nfs-ganesha is not installed on this node (Debian: nfs-ganesha, "
                        "nfs-ganesha-vfs): the shared path is not exported"]
            if changed:
                await self._stop(GANESHA)
            known = len(self.warnings)
            await self._start(GANESHA, lambda: _listening("127.0.0.1", NFS_PORT))
            warnings += self.warnings[known:]  # it did not answer: said in this part's warnings
            del self.warnings[known:]
        if role.nfs_server and role.shared_path:
            try:
                mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
                argv, warning = mount_decision(role.nfs_server, role.shared_path, mounts)
                if argv is not None:
                    Path(role.shared_path).mkdir(parents=True, exist_ok=True)
            except (ValueError, OSError) as exc:
                return [*warnings, f"the shared path is not mounted: {exc}"]
            if warning:
                warnings.append(warning)
            if argv is not None:
                done = await self._slurm(*argv)
                if done.returncode != 0:
                    warnings.append(f"mounting {argv[-2]} at {argv[-1]} failed: "
                                    f"{(done.stderr or done.stdout).decode(errors='replace').strip()}")
        return warnings

    async def _make_storage(self, role: pb.SlurmRole) -> str:
        """Create slurmdbd's database and user on MariaDB as root over TCP; "" or the client's own words."""
        mysql = self._program("mysql")
        if mysql is None:
            return "the mysql client is not installed: slurmdbd's database and user are not made"
        done = await trio.run_process(
            [mysql, "-h", role.storage_host, "-P", str(role.storage_port), "-u", "root", "-N", "-B"],
            stdin=storage_sql(role).encode(), capture_stdout=True, capture_stderr=True, check=False)
        if done.returncode != 0:
            return (f"MariaDB at {role.storage_host}:{role.storage_port} refused slurmdbd's database and user: "
                    f"{done.stderr.decode(errors='replace').strip()}")
        return ""

    async def sync_users(self, role: pb.SlurmRole) -> list[str]:
        """Give the node the role's Linux users (llmgw.tools.linux_users: groupadd/useradd/usermod, only users llmgw
        made are changed, nothing deleted), make their homes on the shared path when missing (mode 0700, owned by
        the user; never moved or deleted) and write their SSH keys into `layout.authorized_keys` (one file per
        login, mode 0644; the files of users no longer wanted are removed). Returns warnings in words: the shared
        path missing on this node, users left alone, a command's refusal in its own words."""
        layout = self.layout
        try:
            passwd = parse_passwd(layout.etc_file("passwd").read_text())
            if not role.users and not any(entry.gecos.startswith(MARK) for entry in passwd):
                return []  # no user wanted and none made before: nothing to read or do
            groups = parse_group(layout.etc_file("group").read_text())
            expiry = parse_shadow_expiry(layout.etc_file("shadow").read_text())
        except (OSError, ParseError) as exc:
            return [f"cannot read the node's users ({exc}): the users of slurm.yaml are not made here"]
        warnings: list[str] = []
        shared = Path(role.shared_path) if role.shared_path else None
        if role.users and (shared is None or not shared.is_dir()):
            warnings.append(f"the shared path {role.shared_path} is not present on this node: mount it (docs/slurm.md); "
                            "the users are made here but their homes are not")
            shared = None
        wanted = [UserSpec(u.login, u.uid, u.email, u.home, u.shell or "/bin/bash") for u in role.users]
        plan = user_commands(wanted, passwd, groups, expiry, layout.users_prefix)
        warnings += plan.warnings
        failed: set[str] = set()
        for command in plan.commands:
            done = await self._slurm(*command)
            if done.returncode != 0:
                failed.add(command[-1])
                warnings.append(f"{' '.join(command[:1] + command[-1:])} failed: "
                                f"{done.stderr.decode(errors='replace').strip()}")
        ready = [user for user in plan.ready if user.login not in failed]
        keys = {u.login: list(u.keys) for u in role.users}
        try:
            warnings += await trio.to_thread.run_sync(self._homes_and_keys, ready, keys, shared)
        except OSError as exc:
            warnings.append(f"cannot write the users' homes or SSH keys: {exc}")
        self.users_ready = len(ready)
        return warnings

    def _homes_and_keys(self, ready: list[UserSpec], keys: dict[str, list[str]], shared: Path | None) -> list[str]:
        warnings = []
        if shared is not None:
            for user in ready:
                home = Path(user.home)
                if home.exists():
                    continue
                home.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                home.mkdir(mode=0o700)
                try:
                    os.chown(home, user.uid, user.uid)
                except PermissionError as exc:
                    warnings.append(f"home {home} of {user.login} is made but not theirs (the agent is not root): {exc}")
        directory = self.layout.authorized_keys
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        wanted = {user.login for user in ready if keys.get(user.login)}
        for path in directory.iterdir():
            if path.name not in wanted:
                path.unlink()
        for user in ready:
            if user.login in wanted:
                text = "".join(line.strip() + "\n" for line in keys[user.login])
                path = directory / user.login
                try:
                    same = path.read_text() == text
                except OSError:
                    same = False
                if not same:
                    _write(path, text.encode(), 0o644)
        return warnings

    async def _sync_accounts(self, role: pb.SlurmRole) -> None:
        """Make Slurm's accounts match the role's (llmgw.tools.slurm_accounts): read `sacctmgr show`, run what
        differs. Refusals go to `warnings` in sacctmgr's words."""
        wanted = {a.name: WantedAccount(a.parent, a.description, a.organisation, tuple(a.users)) for a in role.accounts}
        shown = await self._slurm("sacctmgr", "-nP", "show", "account", "format=Account,Description,Organization")
        assocs = await self._slurm("sacctmgr", "-nP", "show", "assoc", "format=Cluster,Account,User,ParentName")
        if shown.returncode != 0 or assocs.returncode != 0:
            self.warnings.append("sacctmgr could not list accounts: "
                                 f"{(shown.stderr or assocs.stderr).decode(errors='replace').strip()}")
            return
        try:
            commands = account_commands(wanted, role.cluster_name,
                                        parse_sacctmgr_accounts(shown.stdout.decode(errors="replace")),
                                        parse_sacctmgr_assocs(assocs.stdout.decode(errors="replace")))
        except ParseError as exc:
            self.warnings.append(str(exc))
            return
        for command in commands:
            done = await self._slurm("sacctmgr", *command)
            if done.returncode != 0:
                self.warnings.append(f"sacctmgr {' '.join(command[1:])} failed: "
                                     f"{done.stderr.decode(errors='replace').strip()}")

    def _argv(self, name: str) -> tuple[str, ...]:
        layout, program = self.layout, self._program(name) or name
        if name == "munged":
            return (program, "-F", "-f", f"--socket={layout.munge_socket}", f"--key-file={layout.munge_key}",
                    f"--log-file={layout.root / 'log' / 'munged.log'}",
                    f"--pid-file={layout.root / 'run' / 'munged.pid'}", f"--seed-file={layout.munge_dir / 'seed'}")
        if name == "slurmctld":
            return (program, "-D", "-i", "-f", str(layout.slurm_conf))
        if name == "slurmd":
            return (program, "-D", "-N", self.role.node_name, "-f", str(layout.slurm_conf))
        if name == GANESHA:
            nfs = layout.root / "nfs"
            return (program, "-F", "-f", str(nfs / "ganesha.conf"), "-L", str(layout.root / "log" / "ganesha.log"),
                    "-p", str(layout.root / "run" / "ganesha.pid"), "-N", "NIV_EVENT")
        return (program, "-D")  # slurmdbd reads slurmdbd.conf beside SLURM_CONF

    def _registered(self, node_name: str) -> bool:
        """True once slurmctld knows `node_name` as responding (blocking: runs scontrol)."""
        try:
            done = subprocess.run([self._program("scontrol") or "scontrol", "show", "node", node_name],
                                  capture_output=True, text=True, timeout=10, env=self.layout.env(), check=False)
            nodes = parse_scontrol_nodes(done.stdout) if done.returncode == 0 else ()
        except (subprocess.TimeoutExpired, ParseError, OSError):
            return False
        return any(node.responding and node.state != "unknown" for node in nodes)

    async def _start(self, name: str, ready: Callable[[], bool]) -> None:
        if name in self.daemons:
            return
        daemon = self.daemons[name] = Daemon(name, self._argv(name))
        scope = self._scopes[name] = trio.CancelScope()
        log_file = self.layout.root / "log" / f"{name}.out"

        async def run() -> None:
            with scope:
                await keep_running(daemon, log_file, self.layout.env())

        self.nursery.start_soon(run)
        with trio.move_on_after(START_TIMEOUT) as waited:
            await daemon.started.wait()
            while not await trio.to_thread.run_sync(ready):
                await trio.sleep(0.2)
        if waited.cancelled_caught:
            self.warnings.append(f"{name} did not answer within {START_TIMEOUT:g} s: {daemon.error or _tail(log_file)}")

    async def _stop(self, name: str) -> None:
        daemon = self.daemons.pop(name, None)
        scope = self._scopes.pop(name, None)
        if daemon is None or scope is None:
            return
        scope.cancel()
        process = daemon.process
        if process is not None:
            with trio.CancelScope(shield=True):
                await process.wait()
        daemon.state, daemon.pid = DaemonState.STOPPED, 0

    async def _stop_all(self) -> None:
        for name in ("slurmd", "slurmctld", "slurmdbd", GANESHA, "munged"):
            await self._stop(name)

    async def stop(self) -> None:
        """Stop every daemon the keeper started (slurmd first, munged last)."""
        async with self._lock:
            await self._stop_all()

    # --- the node in Slurm -------------------------------------------------------------------------------------

    async def _slurm(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        program = self._program(args[0]) or args[0]
        try:
            with trio.move_on_after(COMMAND_TIMEOUT):
                return await trio.run_process([program, *args[1:]], capture_stdout=True, capture_stderr=True,
                                              check=False, env={**self.layout.env(), **(env or {})})
            return subprocess.CompletedProcess([program, *args[1:]], 124, b"",
                                               f"{args[0]} did not answer within {COMMAND_TIMEOUT:g} s".encode())
        except OSError as exc:  # missing or not executable: an answer like any failure, never a crash
            return subprocess.CompletedProcess([program, *args[1:]], 127, b"", f"{args[0]}: {exc}".encode())

    async def check_node(self) -> None:
        """Read the node in Slurm (state, reason, running job steps, version) and set its drain as the role says."""
        role = self.role
        self._checks = []
        if not role.node_name or "slurmd" not in self.daemons:
            return
        if not self.version:
            done = await self._slurm("slurmd", "-V")
            self.version = done.stdout.decode(errors="replace").strip()
        done = await self._slurm("scontrol", "show", "node", role.node_name)
        if done.returncode != 0:  # a broken Slurm never keeps the node from llmgw: no job step is counted
            self.node_state, self.node_reason, self.job_steps = "unknown", "", 0
            self._checks.append(f"Slurm does not answer for {role.node_name}, so a reclaim does not wait for its "
                                 f"jobs: {done.stderr.decode(errors='replace').strip()}")
            return
        try:
            [node] = parse_scontrol_nodes(done.stdout.decode(errors="replace"))
        except (ParseError, ValueError) as exc:
            self.node_state, self.node_reason = "unknown", str(exc)
            return
        verdict = drain_verdict(node, role.lent, role.drain_reason)
        if verdict == "resume":
            done = await self._slurm("scontrol", "update", f"NodeName={role.node_name}", "State=RESUME")
        elif verdict == "drain":
            done = await self._slurm("scontrol", "update", f"NodeName={role.node_name}", "State=DRAIN",
                                     f"Reason={role.drain_reason}")
        if verdict and done.returncode != 0:
            self._checks.append(f"scontrol could not {verdict} {role.node_name}: "
                                 f"{done.stderr.decode(errors='replace').strip()}")
        if verdict:
            done = await self._slurm("scontrol", "show", "node", role.node_name)
            node = next(iter(parse_scontrol_nodes(done.stdout.decode(errors="replace"))), node)
        self.node_state = "+".join((node.state, *node.flags))
        self.node_reason = node.reason
        steps = await self._slurm("squeue", "-h", "-s", "-w", role.node_name, "-o", "%i")
        jobs = await self._slurm("squeue", "-h", "-w", role.node_name, "-t", "RUNNING,COMPLETING", "-o", "%i")
        # a batch job shows no step of its own in every version: its running self counts as one at least
        self.job_steps = max(_count_lines(steps.stdout, skip=".extern"), _count_lines(jobs.stdout))

    def recorded(self, until: float) -> None:
        """The control plane recorded the ended jobs up to `until` (unix seconds) and stored that as its cursor: the
        next reads start there (less CURSOR_MARGIN)."""
        self.finished_since = max(self.finished_since or 0.0, until)

    async def read_finished_jobs(self, now: float | None = None) -> None:
        """On the controller with accounting: the jobs that ended since the cursor (`finished_since` less
        CURSOR_MARGIN; without one, the last FINISHED_WINDOW seconds) up to `now` (unix seconds, default the
        clock), from `sacct -a --parsable2` with times as unix seconds (SLURM_TIME_FORMAT=%s), into
        `finished_jobs`, oldest end first; `finished_until` is how far they are complete: `now`, or the end of the
        last job carried when more than MAX_FINISHED ended, or the end of a job slurmdbd has not completed yet."""
        if "slurmdbd" not in self.daemons:
            self.finished_jobs, self.finished_until = [], 0.0
            return
        now = time.time() if now is None else now
        start = (self.finished_since - CURSOR_MARGIN) if self.finished_since else now - FINISHED_WINDOW
        done = await self._slurm("sacct", "-a", "--parsable2", "--format=" + ",".join(SACCT_FIELDS),
                                 f"--state={ENDED_STATES}", "-S", _sacct_time(start), "-E", _sacct_time(now),
                                 env={"SLURM_TIME_FORMAT": "%s"})
        if done.returncode != 0:
            self._checks.append(f"sacct failed: {done.stderr.decode(errors='replace').strip()}")
            return
        try:
            jobs = parse_sacct(done.stdout.decode(errors="replace"))
        except ParseError as exc:
            self._checks.append(str(exc))
            return
        until = now
        ended = []
        for job in jobs:
            end = float(job.end) if job.end.isdigit() else 0.0
            if not job.ended:
                continue
            if not job.partition:
                # a job slurmdbd has not completed yet (no partition: its start record is still on its way; seen
                # for an `srun` of milliseconds) waits for a later read, and the cursor waits before it: each job
                # is priced once, from its first complete report
                until = min(until, end - 1.0) if end else until
                continue
            ended.append(pb.SlurmJob(job_id=job.job_id, partition=job.partition, account=job.account, user=job.user,
                                     state=job.state, elapsed_seconds=job.elapsed_seconds, cpus=job.cpus,
                                     gpus=job.gpus, end_time=end,
                                     gpu_type=next(iter(job.gpu_types), "") if len(job.gpu_types) == 1 else ""))
        ended.sort(key=lambda job: job.end_time)
        if len(ended) > MAX_FINISHED:
            ended = ended[:MAX_FINISHED]
            until = min(until, ended[-1].end_time)
        self.finished_jobs, self.finished_until = ended, until

    async def run(self, interval: float = CHECK_INTERVAL) -> None:
        """`check_node` and `read_finished_jobs` every `interval` seconds, until cancelled."""
        while True:
            await trio.sleep(interval)
            async with self._lock:
                await self.check_node()
                await self.read_finished_jobs()

    def report(self) -> pb.SlurmReport | None:
        """The heartbeat's SlurmReport, or None when this node has no part in Slurm and nothing to say."""
        warnings = list(dict.fromkeys([*self.warnings, *self._checks]))
        if not self.role.daemons and not self.daemons and not warnings:
            return None
        return pb.SlurmReport(
            daemons=[self.daemons[n].message() for n in ("munged", GANESHA, "slurmdbd", "slurmctld", "slurmd")
                     if n in self.daemons],
            version=self.version, node_state=self.node_state, node_reason=self.node_reason,
            job_steps=self.job_steps, lent=self.role.lent, warnings=warnings,
            finished_jobs=self.finished_jobs, cluster_name=self.role.cluster_name, users=self.users_ready,
            finished_until=self.finished_until)

