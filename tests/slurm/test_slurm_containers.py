"""slurm.yaml `containers: runc` (issue 37) on the real Slurm 22.05 of the tests: the agent's keeper, given the role
the control plane sends, writes oci.conf beside slurm.conf (llmgw.tools.slurm_oci), and `srun --container=BUNDLE`
runs the step inside an OCI bundle made with buildah from the images' debootstrap base (deploy/container/base.sh,
cached in $LLMGW_CACHE/container): the step reads a file only the bundle holds, sees Debian bookworm, and its exit
code is the step's. With `containers: none` the file is removed and the same `srun --container` runs outside any
container (Slurm ignores the option on a node without oci.conf).

The bundle: `buildah from scratch`, the base tarball added, a marker file copied in, the container mounted; its
config.json from `runc spec` with `terminal: false` (a terminal hangs the step: runc then waits for a console socket
Slurm never gives), and the mount bound at `rootfs` (slurmstepd roots the step at <bundle>/rootfs; runc refuses a link there). buildah and runc use deploy/container/containers.conf.

Slow: about 25-35 s here with the base cached (the first time on a machine, debootstrap adds 1-4 minutes). Fails,
never skips, without Slurm, munge, buildah or runc (`make system-packages`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
import trio

from llmgw.agent.slurm import SlurmKeeper, SlurmLayout
from llmgw.control.commands import slurm_role
from llmgw.plan import Fleet, NodeState
from llmgw.settings.model import ClusterSettings, Settings
from llmgw.settings.slurm import SlurmNode
from llmgw.tools.slurm import parse_slurmd_config

from .local_slurm import loopback_settings, require_slurm

# one pytest-xdist worker for the real-Slurm modules (tests/conftest.py, MACHINE_WIDE)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("machine-wide")]

CHECKOUT = Path(__file__).resolve().parents[2]
CONF = CHECKOUT / "deploy" / "container" / "containers.conf"
HOST = socket.gethostname().split(".")[0]
MARKER = f"made by buildah {secrets.token_hex(4)}"
MiB = 1 << 20


def _buildah(storage: Path, *argv: str) -> str:
    done = subprocess.run(["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run"),
                           "--storage-driver", "overlay", *argv], env={**os.environ, "CONTAINERS_CONF": str(CONF)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"buildah {' '.join(argv)}: {done.stderr}"
    return done.stdout.strip()


@pytest.fixture
def bundle(tmp_path) -> Iterator[Path]:
    """An OCI bundle (tmp_path/bundle) whose root is a buildah container: the debootstrap base and a marker file."""
    for tool in ("buildah", "runc", "debootstrap"):
        assert shutil.which(tool), f"{tool} is missing: run `make system-packages` (Debian buildah runc debootstrap)"
    base = subprocess.run([str(CHECKOUT / "deploy" / "container" / "base.sh")], capture_output=True, text=True,
                          timeout=600)
    assert base.returncode == 0, base.stderr
    storage = Path(tempfile.mkdtemp(prefix="llmgw-buildah-", dir="/tmp"))  # a short --runroot, as podman's
    container = _buildah(storage, "from", "scratch")
    mounted = None
    try:
        _buildah(storage, "add", container, base.stdout.strip(), "/")
        (tmp_path / "marker").write_text(MARKER + "\n")
        _buildah(storage, "copy", container, str(tmp_path / "marker"), "/etc/llmgw-bundle")
        root = _buildah(storage, "mount", container)
        folder = tmp_path / "bundle"
        folder.mkdir()
        subprocess.run(["runc", "spec", "--bundle", str(folder)], check=True, timeout=30)
        config = json.loads((folder / "config.json").read_text())
        config["process"]["terminal"] = False
        (folder / "rootfs").mkdir()  # slurmstepd roots every step at <bundle>/rootfs, whatever root.path says,
        subprocess.run(["mount", "--bind", root, str(folder / "rootfs")], check=True, timeout=30)  # and runc
        mounted = folder / "rootfs"  # refuses a link there
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        yield folder
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], capture_output=True, timeout=30)
        _buildah(storage, "rm", container)
        subprocess.run(["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run"),
                        "--storage-driver", "overlay", "rm", "--all"], capture_output=True, timeout=60)
        subprocess.run(["umount", "-R", str(storage / "root" / "overlay")], capture_output=True, timeout=30)
        shutil.rmtree(storage, ignore_errors=True)


def _settings() -> Settings:
    slurm = replace(loopback_settings(HOST, accounting=False), containers="runc",
                    nodes=MappingProxyType({HOST: SlurmNode("debug", lent=True)}))
    return Settings(cluster=ClusterSettings(name="t"), slurm=slurm)


def _without_containers(settings: Settings) -> Settings:
    return replace(settings, slurm=replace(settings.slurm, containers="none"))


def _this_node() -> Fleet:
    config = parse_slurmd_config(subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout)
    return Fleet((NodeState(HOST, address="127.0.0.1", cpu_cores=config.cpus, memory_bytes=config.memory_mib * MiB),))


def _srun(layout: SlurmLayout, bundle: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["srun", "-N1", f"--container={bundle}", "/bin/sh", "-c", script], capture_output=True,
                          text=True, timeout=60, env=layout.env())


async def test_srun_runs_a_step_in_a_buildah_bundle_with_the_oci_conf_the_agent_writes(tmp_path, bundle) -> None:
    require_slurm()
    assert not Path("/etc/llmgw-bundle").exists()
    settings = _settings()
    key = {"munge-key": secrets.token_hex(32)}.__getitem__
    layout = SlurmLayout(tmp_path / "slurm")
    async with trio.open_nursery() as nursery:
        keeper = SlurmKeeper(layout, nursery)
        began = time.monotonic()
        await keeper.apply(slurm_role(settings, _this_node(), HOST, key))
        report = keeper.report()
        assert report is not None and not report.warnings, report
        assert "drain" not in keeper.node_state, keeper.node_state  # lent: resumed in Slurm
        oci = (layout.etc / "oci.conf").read_text()
        assert f'RunTimeRun="{shutil.which("runc")} run %n.%u.%j.%s.%t -b %b"' in oci
        started = time.monotonic()

        inside = _srun(layout, bundle, ". /etc/os-release; cat /etc/llmgw-bundle; echo $VERSION_CODENAME; exit 3")
        stepped = time.monotonic()
        assert inside.stdout.splitlines() == [MARKER, "bookworm"], (inside.stdout, inside.stderr)
        assert inside.returncode == 3, inside.stderr
        warm = _srun(layout, bundle, "cat /etc/llmgw-bundle")
        assert warm.stdout.strip() == MARKER, warm.stderr
        print(f"\nSlurm up in {started - began:.1f} s; first srun --container {stepped - started:.2f} s (the node "
              f"just resumed), the next {time.monotonic() - stepped:.2f} s")
        stepped = time.monotonic()

        await keeper.apply(slurm_role(_without_containers(settings), _this_node(), HOST, key))
        assert set(keeper.daemons) == {"munged", "slurmctld", "slurmd"}  # oci.conf changes restart nothing
        assert not (layout.etc / "oci.conf").exists()
        outside = _srun(layout, bundle, "cat /etc/llmgw-bundle")  # no oci.conf: the option is ignored
        assert outside.returncode != 0 and MARKER not in outside.stdout, outside
        print(f"without oci.conf {time.monotonic() - stepped:.2f} s")
        left = subprocess.run(["runc", "list", "-q"], capture_output=True, text=True, timeout=30).stdout.split()
        assert not [c for c in left if c.startswith(f"{HOST}.root.")], left  # RunTimeDelete removed the container
        await keeper.stop()
        nursery.cancel_scope.cancel()
