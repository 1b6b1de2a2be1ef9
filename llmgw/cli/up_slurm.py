"""`llmgw up --slurm`: Slurm beside llmgw on this one machine, so `llmgw slurm lend|reclaim|status` act on it.

Without it, `llmgw up` seeds its settings from examples/cluster-repo, whose slurm.yaml is switched off and names an
example node (`gpu-node-01`), not this machine: `llmgw slurm lend $(hostname)` is refused ("not among the nodes that
may be lent") and lending `gpu-node-01` changes nothing here. With `--slurm`, on the first run:

- the seed gets `agents/nodes/<host>.yaml` (`{}`: the settings' fleet knows this node) and a slurm.yaml with
  `enabled: true`, this machine as the controller and as the one lendable node (partition `debug`), accounting off
  (turn it on in slurm.yaml with MariaDB at 127.0.0.1:3306, docs/slurm.md), and `proctrack/linuxproc` +
  `task/none` when the machine has no cgroup v2 (`/sys/fs/cgroup/cgroup.controllers` missing), cgroup's otherwise;
- the munge key secret is made under `<state>/secrets/munge-key` (mode 0600) when missing;
- the local agent's node id is the short host name, which slurmctld checks.

Slurm itself comes from Debian (`make system-packages`: slurm-wlm, munge, slurm-client); a missing Slurm is a
warning in `llmgw slurm status`, never a crash. A state directory made without `--slurm` keeps its settings: edit
slurm.yaml in a clone (what this module writes is the example) or start with a new `--state`.
"""

from __future__ import annotations

import secrets
import shutil
import socket
from pathlib import Path

from llmgw.errors import UsageError

MUNGE_KEY_SECRET = "munge-key"


def short_hostname() -> str:
    """This machine's host name up to its first dot: the node id and Slurm NodeName `llmgw up --slurm` uses."""
    return socket.gethostname().split(".")[0]


def cgroup_v2(root: Path = Path("/sys/fs/cgroup")) -> bool:
    """True when the machine mounts the unified cgroup v2 hierarchy (its root lists `cgroup.controllers`)."""
    return (root / "cgroup.controllers").exists()


def slurm_yaml(host: str, *, cgroup2: bool, cluster_name: str = "up", ports: dict[str, int] | None = None) -> str:
    """The slurm.yaml of `llmgw up --slurm`: `host` the controller and the one lendable node; `ports` (daemon ->
    TCP port) when not Slurm's defaults."""
    proctrack, task = ("proctrack/cgroup", "task/cgroup,task/affinity") if cgroup2 else ("proctrack/linuxproc",
                                                                                         "task/none")
    return (
        "# Written by `llmgw up --slurm`: this machine runs slurmctld and may be lent to Slurm (docs/slurm.md).\n"
        "enabled: true\n"
        f"cluster_name: {cluster_name}\n"
        f"controller: {host}\n"
        "nodes:\n"
        f"  {host}: {{partition: debug}}    # llmgw slurm lend {host} / llmgw slurm reclaim {host}\n"
        "partitions:\n"
        "  debug: {default: true}\n"
        "accounting: false                 # true: slurmdbd on MariaDB at 127.0.0.1:3306, jobs priced into usage\n"
        "users: none\n"
        f"munge_key_secret: {MUNGE_KEY_SECRET}\n"
        f"proctrack_type: {proctrack}\n"
        f"task_plugin: {task}\n"
        + (f"ports: {{{', '.join(f'{name}: {port}' for name, port in sorted(ports.items()))}}}\n" if ports else "")
    )


def slurm_seed(seed: Path, out: Path, host: str, *, cgroup2: bool) -> Path:
    """A copy of the settings tree `seed` in `out` (replaced) with Slurm on `host` (see the module docstring); the
    `ports` of the seed's own slurm.yaml are kept."""
    from ruamel.yaml import YAML

    ports = None
    if (seed / "slurm.yaml").exists():
        ports = dict((YAML(typ="safe").load((seed / "slurm.yaml").read_text()) or {}).get("ports") or {}) or None
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(seed, out, ignore=shutil.ignore_patterns(".git"))
    node_file = out / "agents" / "nodes" / f"{host}.yaml"
    node_file.parent.mkdir(parents=True, exist_ok=True)
    if not node_file.exists():
        node_file.write_text("{}\n")
    (out / "slurm.yaml").write_text(slurm_yaml(host, cgroup2=cgroup2, ports=ports))
    return out


def ensure_munge_key(secrets_dir: Path) -> Path:
    """`<secrets_dir>/munge-key`, made (48 random bytes, URL-safe base64, mode 0600) when missing."""
    path = secrets_dir / MUNGE_KEY_SECRET
    if not path.exists():
        secrets_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(48) + "\n")
    return path


def check_resumed(repo: Path, host: str) -> None:
    """Raise UsageError when the settings repository of an earlier run does not name `host` as Slurm's controller."""
    from llmgw.errors import SettingsError
    from llmgw.settings import load_commit

    try:
        slurm = load_commit(repo).slurm
    except SettingsError:
        return  # the control plane says what is wrong with the settings, as without --slurm
    if not slurm.enabled or slurm.controller != host:
        raise UsageError(f"the settings in {repo} (made by an earlier `llmgw up`) do not run Slurm on {host}: "
                         f"start with a new --state, or set enabled: true, controller: {host} and nodes: {{{host}: "
                         "{partition: debug}} in slurm.yaml (and agents/nodes/" + host + ".yaml) in a clone and push")
