"""Machines of their own for onboarding tests: each "host" an sshd with its own root file system and network
address, reached with real ssh. Needs root (namespaces, mounts) and Debian's openssh-server (`make system-packages`).

    from support.ssh_hosts import open_ssh_hosts

    with open_lab() as lab, open_ssh_hosts(lab, 3) as hosts:   # or the pytest fixture `ssh_hosts` (tests/conftest.py)
        one = hosts[0]
        one.ssh("cat /etc/hostname")                             # "host1": real ssh, the host's own /etc
        subprocess.run(["ssh", "-F", str(one.ssh_config), one.name, "uname -n"])   # what a CLI under test does
        before = one.snapshot()
        ...
        assert one.snapshot() == before                          # nothing left behind on the host's root

A host (DESIGN.md, "Known traps") is a network namespace of the lab (`support.netns`, joined to the root namespace
so the test process reaches it without `ip netns exec`) in which

    unshare --mount --pid --uts --fork --kill-child --propagation private

mounts a tmpfs, an overlay over `/` whose upper and work directories are on that tmpfs, a fresh /proc, /sys, /run,
/tmp, /dev/shm and /dev/pts, and an empty tmpfs over each hidden path (the checkout, the virtual environments,
HOME with its caches and pyenv, the machine's wheel caches: `HIDDEN` and the `hide` argument), then `chroot`s into
the overlay and runs `sshd -D -e`, PID 1 of its PID namespace: killing it ends everything that ran on the host.
The host's writes land on its tmpfs; the machine's files never change. Its hostname and /etc/hostname are its name.
sshd answers only the key pair the hosts' fixture made (root login; `ssh_config` names every host with that key and
a known_hosts of the hosts' own Ed25519 host keys, so host key checking stays on).

Cleanup: closing stops each sshd (its PID namespace, mounts and tmpfs go with it) and the lab removes the namespaces
and routes. If the test process itself is killed, `unshare` is killed with it (parent-death signal) and kills sshd
(`--kill-child`), so no process stays either way.

Start time: about 0.1 s per host here (keys, namespace, mounts, sshd accepting), the hosts started together. An ssh
command: about 0.02 s of CPU for the client (`KEX`), 0.03 s for the host's sshd.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from support.netns import Lab

HIDDEN = ("/work", "/opt/pypi", "/opt/pypi-more", "/opt/wheels", "/opt/tf-plugins", "/opt/skills")
"""Paths of this kind of machine hidden on every host when they exist, besides HOME, the checkout, the virtual
environment running the tests and $LLMGW_CACHE (see `hidden_paths`)."""


KEX = "curve25519-sha256,curve25519-sha256@libssh.org"
"""The key exchange `ssh_config` asks for. OpenSSH 9.2's default, sntrup761x25519-sha512 (post-quantum), costs the ssh
client about 0.1 s of CPU per connection here (0.2 s of wall time at a load of 5), 0.015 s with curve25519; `node
add` opens a new connection per step, some 20 per host, and every `host.ssh` is one. An operator's ssh configuration
may choose either: what llmgw runs over the connection is the same."""

_START = r"""
set -eu
T=$1 NAME=$2 SEED=$3 ADDRESS=$4
shift 4
mount -t tmpfs -o mode=700 llmgw-host "$T"
mkdir "$T/upper" "$T/work" "$T/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$T/upper,workdir=$T/work" "$T/root"
R=$T/root
mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
mount --bind /dev "$R/dev"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
mount -t tmpfs -o mode=755 tmpfs "$R/run"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
while [ "$#" -gt 0 ] && [ "$1" != "--share" ]; do
    if [ -d "$R$1" ]; then mount -t tmpfs -o "mode=$(stat -c %a "$1")" tmpfs "$R$1"; fi
    shift
done
[ "$#" -gt 0 ] && shift
for path in "$@"; do
    mkdir -p "$R$path"
    mount --bind "$path" "$R$path"
    mount -o remount,bind,ro "$R$path"
done
mkdir -p -m 700 "$R/root/.ssh" "$R/run/llmgw-host"
mkdir -m 755 "$R/run/sshd"
cp "$SEED/id_ed25519.pub" "$R/root/.ssh/authorized_keys"
cp "$SEED/$NAME.key" "$R/run/llmgw-host/host_key"
echo "$NAME" > "$R/etc/hostname"
hostname "$NAME"
# The keeper stays outside the chroot: /proc/<its pid>/root/$T/upper is this host's upper directory, seen from the
# root namespace (the tmpfs is mounted in this mount namespace only).
sleep infinity &
exec chroot "$R" /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config -h /run/llmgw-host/host_key \
    -o "ListenAddress=$ADDRESS" -o PidFile=none -o UsePAM=no -o PermitRootLogin=prohibit-password \
    -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o MaxStartups=100 -o MaxSessions=100 \
    -o LogLevel=ERROR
"""


def hidden_paths(extra: Sequence[str] = ()) -> list[str]:
    """The paths a host hides under an empty tmpfs: HIDDEN, HOME, the checkout holding these tests, the virtual
    environment running them, $LLMGW_CACHE, then `extra`; absolute, each once, in that order."""
    checkout = Path(__file__).resolve().parents[2]
    paths = [*HIDDEN, str(Path.home()), str(checkout), sys.prefix, os.environ.get("LLMGW_CACHE", ""), *extra]
    return list(dict.fromkeys(p for p in paths if p.startswith("/") and p != "/"))


PARENT_DEATH_KILL = ("setpriv", "--pdeathsig", "KILL", "--")
"""The prefix that has a host's first process SIGKILLed when the test process dies (util-linux's setpriv sets the
parent-death signal, kept across the exec of `ip` and `unshare`). Not a `preexec_fn`: Python code run in the child
between fork and exec aborted once in a whole run, in a worker where gRPC's event engine ran (its fork handler's
poller: "epoll_wait error: Bad file descriptor", exit -6)."""


@dataclass
class SshHost:
    """One host: `name` (host1, host2, ...; its ssh alias in `ssh_config`) at `address`, sshd process `pid` (in the
    root PID namespace), and `mount_point`, where its tmpfs is mounted inside its own mount namespace."""

    name: str
    address: str
    ssh_config: Path
    mount_point: Path
    process: subprocess.Popen
    log: Path
    pid: int = 0
    keeper: int = 0
    shared: tuple[str, ...] = ()

    def ssh_argv(self, command: str) -> list[str]:
        """The ssh command line that runs the shell `command` on this host."""
        return ["ssh", "-F", str(self.ssh_config), self.name, command]

    def ssh(self, command: str, *, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run the shell `command` on this host over ssh and wait; text output captured unless given otherwise.
        Raises CalledProcessError (with the host's stderr) when it fails and `check`."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        done = subprocess.run(self.ssh_argv(command), timeout=timeout, **kwargs)
        if check and done.returncode:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return done

    @property
    def root(self) -> Path:
        """This host's `/` as the test process sees it (through /proc: read and write with care)."""
        return Path(f"/proc/{self.pid}/root")

    @property
    def upper(self) -> Path:
        """The overlay's upper directory: every file this host wrote, created or deleted (a whiteout) on its root."""
        return Path(f"/proc/{self.keeper}/root{self.mount_point}/upper")

    def snapshot(self) -> dict[str, tuple]:
        """What differs on this host's root from the machine's and what its hidden paths hold now, by path as the
        host names it: ("dir", mode), ("file", mode, sha256), ("link", target) or ("deleted",) for a whiteout.
        A path the overlay copied up but whose kind, mode and content equal the machine's (a file written back as
        it was, a directory something was done in) is no difference. /run, /tmp, /proc and the like are not
        included. Compare two snapshots for a file-system diff."""
        entries: dict[str, tuple] = {}
        _walk(self.upper, "", entries)
        machine: dict[str, tuple] = {}
        for path in list(entries):
            if entries[path][0] != "deleted" and os.path.lexists(path):
                _entry(Path(path), path, machine)
        entries = {path: value for path, value in entries.items() if machine.get(path) != value}
        for path in hidden_paths():
            if os.path.isdir(path) and not any(path == p or path.startswith(p + "/") for p in self.shared):
                _walk(self.root / path.lstrip("/"), path, entries, skip={self.root / p.lstrip("/") for p in self.shared})
        return {path: value for path, value in entries.items()
                if not any(path == p or path.startswith(p + "/") or p.startswith(path + "/") for p in self.shared)}

    def stop(self) -> None:
        """Stop sshd and with it everything on this host (its PID namespace); idempotent."""
        if self.pid:  # unshare reaps its child, PID 1 of the host, and exits
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()  # --kill-child ends the host
            self.process.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.mount_point.rmdir()


def _walk(top: Path, prefix: str, entries: dict[str, tuple], skip: set[Path] = frozenset()) -> None:
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if Path(dirpath) / d not in skip]
        rel = prefix + dirpath[len(str(top)):]
        for name in sorted(dirnames + filenames):
            _entry(Path(dirpath) / name, f"{rel}/{name}", entries)


def _entry(path: Path, key: str, entries: dict[str, tuple]) -> None:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        entries[key] = ("link", os.readlink(path))
    elif stat.S_ISDIR(info.st_mode):
        entries[key] = ("dir", stat.S_IMODE(info.st_mode))
    elif stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
        entries[key] = ("deleted",)
    elif stat.S_ISREG(info.st_mode):
        entries[key] = ("file", stat.S_IMODE(info.st_mode), hashlib.sha256(path.read_bytes()).hexdigest())
    else:
        entries[key] = ("other", info.st_mode)


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _comm(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return ""


def _wait_started(host: SshHost, deadline: float) -> None:
    """Wait until sshd (PID 1 of the host) accepts on port 22; find its pid and the keeper's."""
    while True:
        if host.process.poll() is not None:
            raise RuntimeError(f"{host.name} did not start (exit {host.process.returncode}): {host.log.read_text()}")
        if not host.pid:  # unshare's child, PID 1 of the host: a shell until it execs sshd
            host.pid = next((pid for pid in _children(host.process.pid) if _comm(pid) == "sshd"), 0)
        if host.pid and not host.keeper:
            host.keeper = next((pid for pid in _children(host.pid) if _comm(pid) == "sleep"), 0)
        if host.pid and host.keeper:
            with contextlib.suppress(OSError), socket.create_connection((host.address, 22), timeout=1) as conn:
                if conn.recv(4).startswith(b"SSH-"):
                    return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host.name}: sshd did not answer on {host.address}:22 in time: {host.log.read_text()}")
        time.sleep(0.01)


@contextlib.contextmanager
def open_ssh_hosts(lab: Lab, count: int, workdir: Path, *, hide: Sequence[str] = (),
                   share: Sequence[str] = ()) -> Iterator[list[SshHost]]:
    """`count` hosts (module docstring) named host1.. in `lab` (joined to the root namespace), their keys, logs and
    mount points in `workdir`; every host hides `hidden_paths(hide)`, then shows each directory of `share` read-only
    (a bind mount of the machine's: e.g. the test's venv and its Python, for a test that needs llmgw's dependencies
    before `node add` brings a release). All stopped on exit.
    Raises RuntimeError with sshd's log when a host does not answer within 10 s."""
    workdir.mkdir(parents=True, exist_ok=True)
    seed = workdir / "keys"
    seed.mkdir(exist_ok=True)
    key = seed / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llmgw-test", "-f", str(key)], check=True)
    lab.join_root()
    first = len(lab.hosts) + 1
    names = [f"host{first + i}" for i in range(count)]
    known: list[str] = []
    config: list[str] = []
    for name in names:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(seed / f"{name}.key")],
                       check=True)
    ssh_config = workdir / f"ssh_config.{names[0]}"
    hosts: list[SshHost] = []
    try:
        for name in names:
            net = lab.host(name)
            mount_point = workdir / name
            mount_point.mkdir()
            public = (seed / f"{name}.key.pub").read_text().split()[:2]
            known.append(f"{name},{net.address} {' '.join(public)}")
            config.append(f"Host {name}\n  HostName {net.address}\n  User root\n  IdentityFile {key}\n"
                          f"  IdentitiesOnly yes\n  UserKnownHostsFile {workdir / 'known_hosts'}\n"
                          "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 10\n"
                          f"  KexAlgorithms {KEX}\n")
            log = workdir / f"{name}.log"
            with log.open("w") as log_file:
                process = subprocess.Popen(
                    [*PARENT_DEATH_KILL, *net.argv(["unshare", "--mount", "--pid", "--uts", "--fork", "--kill-child",
                                                    "--propagation", "private", "bash", "-c", _START, "host",
                                                    str(mount_point), name, str(seed), net.address,
                                                    *hidden_paths(hide), "--share", *share])],
                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
            hosts.append(SshHost(name, net.address, ssh_config, mount_point, process, log, shared=tuple(share)))
        with (workdir / "known_hosts").open("a") as known_hosts:
            known_hosts.write("".join(line + "\n" for line in known))
        ssh_config.write_text("\n".join(config))
        deadline = time.monotonic() + 10
        for host in hosts:
            _wait_started(host, deadline)
        yield hosts
    finally:
        for host in hosts:
            host.stop()


def quoted(argv: Sequence[str]) -> str:
    """`argv` as one shell command for `SshHost.ssh`."""
    return shlex.join(argv)


SOURCE = "/tmp/llmgw"
"""Where `push_llmgw_source` puts llmgw on a host (its /tmp: a tmpfs outside `snapshot`)."""
LLMGW_ON_HOST = f"PYTHONPATH={SOURCE} /usr/bin/python3 -m llmgw.cli"
"""llmgw from the pushed source, run by the host's Debian python3 (commands that need only click)."""


def push_llmgw_source(host: SshHost) -> None:
    """Copy this checkout's llmgw (the package, and schema/, examples/cluster-repo/, deploy/systemd/ that it reads
    in a source tree) and click into the host's /tmp/llmgw over ssh, one tar stream on stdin, with their bytecode
    (`__pycache__`, `_bytecode`), as an installed package has it: without it every llmgw process of the user llmgw
    there (the control plane, which cannot write into root's /tmp/llmgw) compiled what it imported, about a second of
    CPU, and root's first did too."""
    import io
    import tarfile

    import click

    checkout = Path(__file__).resolve().parents[2]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, name in [(checkout / "llmgw", "llmgw"), (checkout / "schema", "schema"),
                           (checkout / "examples" / "cluster-repo", "examples/cluster-repo"),
                           (checkout / "deploy" / "systemd", "deploy/systemd"), (Path(click.__file__).parent, "click")]:
            tar.add(path, arcname=name, filter=lambda info: None if "__pycache__" in info.name else info)
        for path, name in [(checkout / "llmgw", "llmgw"), (Path(click.__file__).parent, "click")]:
            for directory in sorted({source.parent for source in path.rglob("*.py")}):
                sources = [(source, _bytecode(source)) for source in sorted(directory.glob("*.py"))]
                cache = f"{name}/{directory.relative_to(path).as_posix()}/__pycache__".replace("/./", "/")
                folder = tarfile.TarInfo(cache)
                folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
                tar.addfile(folder)
                for source, data in sources:
                    if data is not None:
                        member = tarfile.TarInfo(f"{cache}/{source.stem}.{sys.implementation.cache_tag}.pyc")
                        member.size, member.mode, member.mtime = len(data), 0o644, folder.mtime
                        tar.addfile(member, io.BytesIO(data))
    host.ssh(f"mkdir -p {SOURCE} && tar -x -C {SOURCE}", input=buffer.getvalue(), text=False)


_BYTECODE: dict[tuple[str, int, int], bytes | None] = {}


def _bytecode(source: Path) -> bytes | None:
    """The bytecode Python writes for `source` (a timestamp .pyc: valid for any copy of it with the same mtime and
    size, as tar keeps them): this process's own, from its bytecode cache (`importlib.util.cache_from_source`, e.g.
    `make test`'s PYTHONPYCACHEPREFIX) when that is valid for it, else compiled here; once per process and version
    of the file. None for a file that does not compile."""
    import importlib.util
    import py_compile
    import struct
    import tempfile

    info = source.stat()
    key = (str(source), info.st_mtime_ns, info.st_size)
    if key not in _BYTECODE:
        header = struct.pack("<4sLLL", importlib.util.MAGIC_NUMBER, 0, int(info.st_mtime) & 0xFFFFFFFF,
                             info.st_size & 0xFFFFFFFF)
        try:
            data: bytes | None = Path(importlib.util.cache_from_source(str(source))).read_bytes()
        except (OSError, NotImplementedError):
            data = None
        if data is None or data[:16] != header:
            with tempfile.TemporaryDirectory() as scratch:
                made = py_compile.compile(str(source), cfile=f"{scratch}/code.pyc", doraise=False, quiet=2,
                                          invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
                data = Path(made).read_bytes() if made else None
        _BYTECODE[key] = data
    return _BYTECODE[key]
