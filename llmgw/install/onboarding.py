"""What `llmgw node add HOST` runs on the host, as data: one `RemoteStep` per shell command, in order.

Pure functions of the release and the node's facts (`install_steps`, then `join_steps`); `llmgw.cli.node_add` runs the steps over
ssh, or prints them (`--dry-run`). The layout is that of deploy/systemd/llmgw-agent.service:

    /opt/llmgw/<version>        a venv with the release's wheels installed offline; /opt/llmgw/current links to it
    /etc/llmgw/ca.crt           the control plane's CA; agent.env: LLMGW_AGENT_OPTIONS (control plane, node id)
    /var/lib/llmgw/agent        the agent's state (tls/ from `llmgw node join`); engines/, weights/, cache/ beside it
    /etc/systemd/system/llmgw-agent.service

Every step that changes the host goes through the install journal's verbs (`python3 -m llmgw.install.host`, run
from the release's own wheel before any venv exists), so the journal lists it before it is done. `check_steps` only
check the host (its Python, the release's digests, `llmgw node doctor` from the release in the scratch directory)
and change nothing outside that scratch directory (removed at the end, and on failure); a failure in
`install_steps` or `join_steps` is undone from the journal.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

OPT = "/opt/llmgw"
STATE = "/var/lib/llmgw"
CONFIG = "/etc/llmgw"
UNIT = "llmgw-agent.service"
SUMS = "SHA256SUMS"
"""The release's digests in sha256sum's format, written beside it on the host from the verified manifest."""


@dataclass(frozen=True)
class RemoteStep:
    """One shell `command` run on the host; `what` says it for a person. `payload`: bytes sent on its stdin (a file's
    content); `release`: the release directory is sent on stdin as a tar stream instead."""

    what: str
    command: str
    payload: bytes | None = None
    release: bool = False


@dataclass(frozen=True)
class NodeFacts:
    """What the install steps need to know. `wheel`: llmgw's wheel in the release ("wheels/llmgw-...whl");
    `control_plane`: the agents' address as the host reaches it (HOST:PORT); `unit`: the text of
    llmgw-agent.service; `scratch`: the host's directory for the release while it installs; `record`: the files of
    the release kept in the venv's `record_dir` (its manifest, signature and signer's key: llmgw.release.installed
    names them; llmgw.install stands apart from llmgw.release)."""

    version: str
    wheel: str
    node_id: str
    control_plane: str
    unit: str
    scratch: str
    record: tuple[str, ...] = ()
    record_dir: str = "release"


@dataclass(frozen=True)
class JoinFacts:
    """What joining needs, asked of the control plane only once the release is installed: `join` the join port's
    address (HOST:PORT), `token` the one-time join token, `ca_pem` the CA certificate."""

    join: str
    token: str
    ca_pem: bytes


def agent_env(facts: NodeFacts) -> bytes:
    """/etc/llmgw/agent.env: LLMGW_AGENT_OPTIONS for the unit (quoted for sh and systemd alike)."""
    return (f"# Written by `llmgw node add` (docs/install.md): the options of `llmgw agent` in {UNIT}.\n"
            f'LLMGW_AGENT_OPTIONS="--control-plane {facts.control_plane} --node-id {facts.node_id}"\n'
            "# Engine downloads and builds: under the state directory (the install journal lists it), not ~/.cache.\n"
            f"LLMGW_CACHE={STATE}/cache\n").encode()


def _check(facts: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(facts, name)
        if not value or any(c in value for c in "\"'$`\\ \n;&|<>"):
            raise ValueError(f"{name} {value!r} cannot go on a command line as it is")


def _journal(facts: NodeFacts) -> str:
    return f"PYTHONPATH={facts.scratch}/{facts.wheel} python3 -m llmgw.install.host"


LLMGW = f"{OPT}/current/bin/llmgw"


_UNPACK = ("import pathlib, sys, zipfile; [zipfile.ZipFile(wheel).extractall(sys.argv[2]) "
           "for wheel in sorted(pathlib.Path(sys.argv[1]).glob('*.whl'))]")
"""Unpack every wheel of a directory (argv 1) into one directory (argv 2), which then works as a PYTHONPATH entry:
what a wheel's install does but for its scripts and compiled bytecode, in a second where pip takes many (a wheel is a
zip of its importable files: PEP 427)."""
DOCTOR_REPORT = "doctor.txt"
"""The pre-install doctor's report, in the scratch directory (removed with it)."""


def check_steps(facts: NodeFacts, *, doctor: bool = True, min_disk: str = "") -> list[RemoteStep]:
    """The commands `node add` runs on the host before it changes anything there (nothing but its scratch
    directory): Python 3.11+ with venv, the release copied and its digests checked, then (with `doctor`) `llmgw node
    doctor` from the release itself, its wheels unpacked inside the scratch directory (`_UNPACK`): a host that cannot serve
    stops here with the failed checks in its own words, nothing installed. `min_disk`: a size ("20Gi") that must
    be free where the weights go (the doctor's --min-free), "" for none. Raises ValueError as `install_steps`."""
    _check(facts, ("version", "scratch", "wheel"))
    scratch = facts.scratch
    steps = [
        RemoteStep("check that the host has Python 3.11 or newer, with venv (Debian: python3-venv)",
                   "python3 -c " + shlex.quote("import sys; sys.version_info >= (3, 11) or sys.exit('Python ' + "
                                               "sys.version.split()[0] + ' is older than 3.11'); import ensurepip, venv")),
        RemoteStep(f"copy the release into {scratch}",
                   f"rm -rf {scratch} && mkdir -p -m 700 {scratch} && tar -x -C {scratch}", release=True),
        RemoteStep("check every file of the release against its signed digests",
                   f"cd {scratch} && sha256sum --quiet --strict -c {SUMS}"),
    ]
    if doctor:
        if min_disk and not all(c.isalnum() or c == "." for c in min_disk):
            raise ValueError(f"min_disk {min_disk!r} is not a size")
        report = f"{scratch}/{DOCTOR_REPORT}"
        failed = shlex.quote('/^fail/ {sub(/^fail +/, ""); sub(/  +/, ": "); printf "%s%s", sep, $0; sep = "; "} '
                             'END {print ""}')
        steps.append(RemoteStep(
            f"check the host with `llmgw node doctor`, run from the release in {scratch} before anything is installed",
            f"python3 -c {shlex.quote(_UNPACK)} {scratch}/wheels {scratch}/doctor && {{ PYTHONPATH={scratch}/doctor "
            f"python3 -m llmgw.cli node doctor --weights-dir {STATE}/weights --state-dir {scratch}/state"
            f"{f' --min-free {min_disk}' if min_disk else ''} >{report} 2>&1 || "
            f"{{ awk {failed} {report} >&2; exit 1; }}; }}"))
    return steps


def install_steps(facts: NodeFacts) -> list[RemoteStep]:
    """The commands `node add` runs on the host after `check_steps`, up to an installed release (module
    docstring), each change through the install journal: a failure from here on is undone from it. The release's
    signed manifest, its signature and the key that verified it are kept in the venv (`llmgw.release.installed`).
    Raises ValueError when a fact holds a character a shell or unit file would misread."""
    _check(facts, ("version", "node_id", "control_plane", "scratch", "wheel", "record_dir"))
    if not all(name and name.replace(".", "").replace("-", "").isalnum() for name in facts.record):
        raise ValueError(f"record {facts.record!r} holds a name a shell would misread")
    scratch, venv, journal = facts.scratch, f"{OPT}/{facts.version}", _journal(facts)
    record = f"{venv}/{facts.record_dir}"
    return [
        RemoteStep(f"make {OPT}", f"{journal} mkdir {OPT}"),
        RemoteStep(f"make the venv {venv}", f"{journal} venv {venv}"),
        RemoteStep(f"install llmgw {facts.version} into it from the release's wheels (no registry)",
                   f"{venv}/bin/pip install --quiet --no-index --find-links {scratch}/wheels llmgw=={facts.version} "
                   "--no-compile --disable-pip-version-check"),  # bytecode: written on first import, in the venv
        RemoteStep(f"keep the release's signed manifest and the key that signed it in {record}",
                   f"mkdir -m 755 {record} && cd {scratch} && cp {' '.join(facts.record)} {record}/"),
        RemoteStep(f"link {OPT}/current to {facts.version}", f"{journal} link {OPT}/current {facts.version}"),
        RemoteStep(f"make {STATE}/agent, engines, weights, cache",
                   f"{journal} mkdir {STATE}/agent --mode 0750 && {journal} mkdir {STATE}/engines && "
                   f"{journal} mkdir {STATE}/weights --weights && {journal} mkdir {STATE}/cache"),
    ]


def join_steps(facts: NodeFacts, join: JoinFacts) -> list[RemoteStep]:
    """The commands after `install_steps`: the CA, joining, agent.env, the unit, starting the
    agent, and removing the scratch directory. Raises ValueError as `install_steps` does."""
    _check(join, ("join", "token"))
    journal, llmgw = _journal(facts), LLMGW
    return [
        RemoteStep(f"write {CONFIG}/ca.crt (the control plane's CA)", f"{journal} write {CONFIG}/ca.crt",
                   payload=join.ca_pem),
        RemoteStep(f"join with a one-time token (certificate into {STATE}/agent/tls)",
                   f"{llmgw} node join --control-plane {join.join} --token {join.token} --ca-file {CONFIG}/ca.crt "
                   f"--node-id {facts.node_id} --state-dir {STATE}/agent"),
        RemoteStep(f"write {CONFIG}/agent.env", f"{journal} write {CONFIG}/agent.env --mode 0640",
                   payload=agent_env(facts)),
        RemoteStep(f"write /etc/systemd/system/{UNIT}", f"{journal} write /etc/systemd/system/{UNIT}",
                   payload=facts.unit.encode()),
        RemoteStep(f"enable and start {UNIT} (where systemd runs)", f"{journal} unit {UNIT}"),
        RemoteStep("start the agent as a process of its own where systemd does not run",
                   f"[ -d /run/systemd/system ] || {{ {journal} mkdir /var/log/llmgw --mode 0750 "
                   f"&& set -a && . {CONFIG}/agent.env && set +a && setsid -f {llmgw} agent "
                   f"--state-dir {STATE}/agent --engines-dir {STATE}/engines --weights-dir {STATE}/weights "
                   f"$LLMGW_AGENT_OPTIONS >>/var/log/llmgw/agent.log 2>&1 </dev/null; }}"),
        RemoteStep(f"remove {facts.scratch}", f"rm -rf {facts.scratch}"),
    ]


def undo_steps(facts: NodeFacts) -> list[RemoteStep]:
    """What a failure at or after `FIRST_CHANGE` runs: undo the journal, then remove the scratch directory."""
    return [RemoteStep("undo what was done, from the host's install journal",
                       f"PYTHONPATH={facts.scratch}/{facts.wheel} python3 -m llmgw.install.host undo"),
            RemoteStep(f"remove {facts.scratch}", f"rm -rf {facts.scratch}")]


SERVER_STATE = f"{STATE}/server"


def standby_steps(facts: NodeFacts, store_url: str, listen: str, repo_url: str, shared: bytes,
                  address: str) -> list[RemoteStep]:
    """The commands `llmgw server add` runs after `install_steps` but their last (no agent directories): the first
    control plane's settings tree, CA and store secret (`shared`, a tar of settings/, ca/, secrets/) into the
    scratch directory, `llmgw server init` from the installed release with them (the shared store `store_url`, the
    shared settings repository `repo_url`, listeners on `listen`, `address` as agents dial it in its certificates:
    everything it makes goes into the journal), the
    control plane started where systemd does not run, and the scratch directory removed. Raises ValueError as
    `install_steps` does."""
    for name, value in (("store_url", store_url), ("listen", listen), ("repo_url", repo_url), ("address", address)):
        if not value or any(c in value for c in "\"'$`\\ \n;&|<>"):
            raise ValueError(f"{name} {value!r} cannot go on a command line as it is")
    standby, llmgw = f"{facts.scratch}/standby", LLMGW
    return [
        RemoteStep(f"copy the settings, the agents' CA and the store's secret into {standby}",
                   f"mkdir -m 700 {standby} && tar -x -C {standby}", payload=shared),
        RemoteStep("set up the control plane with `llmgw server init` (the shared store, settings and CA)",
                   f"{llmgw} server init --from {standby}/settings --store {store_url} --listen {listen} "
                   f"--repo {repo_url} --tls-hostname {address} --ca-from {standby}/ca --secrets-from {standby}/secrets"),
        RemoteStep("start the control plane as a process of its own where systemd does not run",
                   f"[ -d /run/systemd/system ] || {{ {_start_server(facts)}; }}"),
        RemoteStep(f"remove {facts.scratch}", f"rm -rf {facts.scratch}"),
    ]


SERVER_USER = "llmgw"
SERVER_LOG = "/var/log/llmgw/server.log"
SERVER_UNIT = "llmgw-server.service"
_SERVER_MATCH = shlex.quote(f"llmgw server --state {SERVER_STATE}")
"""What pgrep finds in the command line of the control plane `server init` set up (run by hand or as below)."""
STOP_SECONDS = 90
"""Seconds a control plane has to exit after SIGTERM (the unit's TimeoutStopSec): it drains its gateway first."""


def _start_server(facts: NodeFacts) -> str:
    """The shell command that starts the control plane as a process of its own (where systemd does not run), with
    the options of server.env, its output appended to SERVER_LOG (its directory made through the journal)."""
    return (f"{{ [ -d {SERVER_LOG.rsplit('/', 1)[0]} ] || {_journal(facts)} mkdir {SERVER_LOG.rsplit('/', 1)[0]} "
            f"--mode 0755; }} && set -a && . {CONFIG}/server.env && set +a && setsid -f runuser -u {SERVER_USER} -- "
            f"{LLMGW} server --state {SERVER_STATE} $LLMGW_SERVER_OPTIONS >>{SERVER_LOG} 2>&1 </dev/null")


RESTART_MARK = "/run/llmgw-server.restarted"
"""Touched by `restart_server_step` before it restarts the control plane: until the control plane writes its
admin-url again (`{SERVER_STATE}/admin-url` newer than this file: its admin API opened), `llmgw server upgrade`'s
poll answers from a shell test, not from a Python start of `llmgw status` (about a second of CPU each)."""


def restart_server_step(facts: NodeFacts, why: str) -> RemoteStep:
    """Restart the control plane on the host from whatever `current` links to now: RESTART_MARK touched, then
    `systemctl restart` of SERVER_UNIT where systemd runs; elsewhere SIGTERM to the running one (it drains its
    gateway and, leading, releases the leader lease, so a standby takes over), a wait of at most STOP_SECONDS for it
    to exit, and a new one started as `standby_steps` starts it. `why` ends the step's description."""
    tries = STOP_SECONDS * 10
    return RemoteStep(
        f"restart the control plane {why}",
        f"touch {RESTART_MARK} && if [ -d /run/systemd/system ]; then systemctl restart {SERVER_UNIT}; else "
        f"pkill -TERM -u {SERVER_USER} -f {_SERVER_MATCH}; i=0; "
        f"while pgrep -u {SERVER_USER} -f {_SERVER_MATCH} >/dev/null; do i=$((i+1)); [ $i -lt {tries} ] || "
        f"{{ echo 'the control plane did not exit within {STOP_SECONDS} s of SIGTERM' >&2; exit 1; }}; sleep 0.1; "
        f"done; {_start_server(facts)}; fi")


def _switch_current(version: str) -> str:
    """Point OPT/current at `version` atomically (a new link renamed over the old one)."""
    return f"ln -sfn {version} {OPT}/.current.new && mv -T {OPT}/.current.new {OPT}/current"


def server_upgrade_steps(facts: NodeFacts) -> list[RemoteStep]:
    """What `llmgw server upgrade` runs on a control plane's host after `check_steps` (no doctor): the release
    `facts.version` installed beside the one that runs (its venv through the journal, so `llmgw wipe` removes it,
    the release's record kept in it; a venv whose record holds this release's signed manifest already, from an
    upgrade that was switched back, is kept as it is: the record is written only after pip succeeded), `current`
    switched to it atomically, the control plane restarted from it (`restart_server_step`), and the scratch
    directory removed. A failure before the switch leaves the running version as it was (`server_upgrade_undo`).
    Raises ValueError as `install_steps` does."""
    _check(facts, ("version", "scratch", "wheel", "record_dir"))
    scratch, venv, journal = facts.scratch, f"{OPT}/{facts.version}", _journal(facts)
    record = f"{venv}/{facts.record_dir}"
    installed = f"cmp -s {scratch}/{facts.record[0]} {record}/{facts.record[0]}" if facts.record else "false"
    return [
        RemoteStep(f"make the venv {venv} (kept when it holds this release already)",
                   f"{installed} || {{ rm -rf {venv} && {journal} venv {venv}; }}"),
        RemoteStep(f"install llmgw {facts.version} into it from the release's wheels (no registry)",
                   f"{installed} || {venv}/bin/pip install --quiet --no-index --find-links {scratch}/wheels "
                   f"llmgw=={facts.version} --no-compile --disable-pip-version-check"),
        RemoteStep(f"keep the release's signed manifest and the key that signed it in {record}",
                   f"{installed} || {{ mkdir -m 755 {record} && cd {scratch} && cp {' '.join(facts.record)} {record}/; }}"),
        RemoteStep(f"link {OPT}/current to {facts.version}", _switch_current(facts.version)),
        restart_server_step(facts, f"from llmgw {facts.version}"),
        RemoteStep(f"remove {facts.scratch}", f"rm -rf {facts.scratch}"),
    ]


def server_upgrade_undo(facts: NodeFacts) -> list[RemoteStep]:
    """What a failed `server_upgrade_steps` step runs before `current` was switched: the new venv removed (never
    the one `current` links to) and the scratch directory."""
    venv = f"{OPT}/{facts.version}"
    return [RemoteStep(f"remove {venv}", f"[ \"$(readlink {OPT}/current)\" = {facts.version} ] || rm -rf {venv}"),
            RemoteStep(f"remove {facts.scratch}", f"rm -rf {facts.scratch}")]


def server_rollback_steps(facts: NodeFacts, previous: str) -> list[RemoteStep]:
    """Back to the release `previous` after an upgrade to `facts.version` whose control plane did not come back:
    `current` links to `previous` again and the control plane is restarted from it (the new venv stays, listed in
    the journal). Raises ValueError when `previous` is not a plain version."""
    if not previous or not previous.replace(".", "").replace("-", "").replace("+", "").isalnum():
        raise ValueError(f"previous version {previous!r} cannot go on a command line as it is")
    return [RemoteStep(f"link {OPT}/current back to {previous}", _switch_current(previous)),
            restart_server_step(facts, f"from llmgw {previous} again")]
