"""The NFS export of slurm.yaml `shared.export` (issue 37): nfs-ganesha's configuration on the exporting node, and
the mount of the others. Pure.

The exporting node's agent runs nfs-ganesha (Debian's `nfs-ganesha` and `nfs-ganesha-vfs`, a userspace server) as a
child like munged, NFSv4 over TCP on port 2049 only (no rpcbind, NLM, RQUOTA or UDP), with one export of
`shared_path` (its pseudo path the same) that only the other Slurm nodes' addresses may read and write; the firewall
opens port 2049 to those nodes only (llmgw.plan.firewall). The kernel's server (nfs-kernel-server) is not used: it
needs the nfsd module and /proc/fs/nfsd, which this project's test machines lack (nor do they have the kernel's NFS
client: the test reads and writes the export with libnfs's userspace client, docs/slurm.md).

Choices, stated: root is not squashed (root on a Slurm node is llmgw's agent, which makes the users' homes); owners
travel as numbers (the UIDs of `users: llmgw` are the same on every node); no grace period after a start
(`Graceless`), so a restarted export serves at once and a client's locks are not reclaimed.

Format: ganesha-config(8), ganesha-core-config(8), ganesha-export-config(8) of nfs-ganesha 4.3; mountinfo: proc(5).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

NFS_PORT = 2049
"""NFSv4's one TCP port."""

MOUNT_OPTIONS = "vers=4.1,proto=tcp,port=2049,hard"

_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*")


def _path(what: str, path: str) -> str:
    if not _PATH.fullmatch(path) or "/../" in f"{path}/":
        raise ValueError(f"{what} {path!r} cannot be written into ganesha.conf: an absolute path of letters, digits "
                         "and `._+@/-` only")
    return path.rstrip("/") or "/"


def _addresses(clients: Iterable[str]) -> list[str]:
    chosen = []
    for client in clients:
        try:
            chosen.append(str(ipaddress.ip_address(client.strip("[]"))))
        except ValueError:
            raise ValueError(f"NFS client {client!r} is not an IP address") from None
    return sorted(set(chosen), key=lambda a: (ipaddress.ip_address(a).version, ipaddress.ip_address(a)))


def ganesha_conf(path: str, clients: Iterable[str], recovery_dir: str, port: int = NFS_PORT) -> str:
    """ganesha.conf exporting `path` read-write to `clients` (IP addresses) only; `recovery_dir` is where ganesha keeps
    its NFSv4 client records. Raises ValueError naming the value that cannot be written (a path with other
    characters than the module's, a client that is not an IP address, no client at all)."""
    export = _path("the shared path", path)
    recovery = _path("the recovery directory", recovery_dir)
    allowed = _addresses(clients)
    if not allowed:
        raise ValueError("no NFS client: an export no node may mount is not written")
    return (
        "# Written by llmgw (slurm.yaml shared.export): edits here are overwritten.\n"
        "NFS_CORE_PARAM {\n"
        f"\tProtocols = 4;\n\tNFS_Port = {int(port)};\n"
        "\tEnable_NLM = false;\n\tEnable_RQUOTA = false;\n\tEnable_UDP = false;\n"
        "}\n"
        "NFSV4 {\n"
        f"\tGraceless = true;\n\tOnly_Numeric_Owners = true;\n\tRecoveryRoot = \"{recovery}\";\n"
        "}\n"
        "EXPORT {\n"
        f"\tExport_Id = 1;\n\tPath = \"{export}\";\n\tPseudo = \"{export}\";\n"
        "\tProtocols = 4;\n\tTransports = TCP;\n\tSecType = sys;\n\tSquash = No_Root_Squash;\n"
        "\tAccess_Type = None;\n"
        f"\tCLIENT {{\n\t\tClients = {', '.join(allowed)};\n\t\tAccess_Type = RW;\n\t}}\n"
        "\tFSAL {\n\t\tName = VFS;\n\t}\n"
        "}\n"
    )


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where it is mounted, its file system type and source."""

    mount_point: str
    fstype: str
    source: str


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/self/mountinfo as Mounts, in order (proc(5): field 5 the mount point, octal escapes such as `\\040`
    for a space; after the ` - ` separator the type and the source). Lines of another shape are skipped."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if sep and len(fields) >= 5 and len(rest) >= 2:
            mounts.append(Mount(_unescape(fields[4]), rest[0], _unescape(rest[1])))
    return mounts


def nfs_source(server: str, path: str) -> str:
    """`server:path` as mount(8) takes it (an IPv6 address in brackets)."""
    try:
        address = ipaddress.ip_address(server.strip("[]"))
    except ValueError:
        raise ValueError(f"NFS server {server!r} is not an IP address") from None
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"{host}:{_path('the shared path', path)}"


def mount_decision(server: str, path: str, mounts: Iterable[Mount]) -> tuple[list[str] | None, str]:
    """What a Slurm node does about the export of `server` at `path`: (argv, "") to mount it, (None, "") when it is
    mounted already, (None, warning) when something else is mounted there (the site's: left alone).
    The last mount at `path` counts (mounts stack). Raises ValueError as `nfs_source`."""
    source = nfs_source(server, path)
    path = path.rstrip("/") or "/"
    there = [m for m in mounts if m.mount_point == path]
    if not there:
        return ["mount", "-t", "nfs4", "-o", MOUNT_OPTIONS, source, path], ""
    last = there[-1]
    if last.fstype.startswith("nfs") and last.source == source:
        return None, ""
    return None, (f"{path} is mounted from {last.source} ({last.fstype}), not from the node exporting it "
                  f"({source}): left alone")
