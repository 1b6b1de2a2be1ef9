"""slurm.yaml `shared.export` (issue 37) between network-namespace hosts (tests/support/netns.py): Slurm's controller
`ctl` exports the shared path, `node` is a lendable Slurm node, `web` an llmgw node outside Slurm.

- `ctl`'s agent part (SlurmKeeper.keep_shared_path, run inside its namespace with the role the control plane sends)
  keeps a real nfs-ganesha exporting the path over NFSv4 on TCP 2049: from `node`, libnfs's userspace client writes
  a file that lands in the directory and reads it back; `web` is refused by the export's client list;
- `ctl`'s nftables table (llmgw.plan.firewall, loaded with `nft -f` in its namespace) opens 2049 to `node` and
  refuses `web` at once (TCP reset), while `node` still writes;
- `node`'s agent part mounts the export at the shared path with mount(8). This machine's kernel has no NFS client
  (no `nfs4` in /proc/filesystems, no modules), so here the mount fails and the node's report says so in mount's
  words; on a kernel with one, the mount is checked to show the file.

The kernel's NFS server cannot run here either (no nfsd): hence nfs-ganesha, in userspace (docs/slurm.md).
About 10 s. Fails, never skips, without nfs-ganesha, nfs-ganesha-vfs, libnfs-utils or nftables.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import MappingProxyType

from llmgw.control.commands import slurm_role
from llmgw.plan.firewall import firewall_table
from llmgw.plan.types import Fleet, NodeState
from llmgw.settings.firewall import FirewallSettings
from llmgw.settings.model import ClusterSettings, Settings
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings
from llmgw.tools.nft import replace_script

from support.netns_probes import connect

CHECKOUT = Path(__file__).resolve().parents[2]

KEEP = """
import sys, json, trio
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from llmgw.agent.slurm import SlurmKeeper, SlurmLayout
from llmgw.wire import pb

async def main():
    role = pb.SlurmRole.FromString(Path(sys.argv[1]).read_bytes())
    async with trio.open_nursery() as nursery:
        keeper = SlurmKeeper(SlurmLayout(Path(sys.argv[2])), nursery)
        warnings = await keeper.keep_shared_path(role)
        print(json.dumps({"warnings": warnings, "daemons": sorted(keeper.daemons)}), flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the test closes stdin
        await keeper.stop()
        nursery.cancel_scope.cancel()

trio.run(main)
"""


def _keep(host, role, root: Path) -> tuple[subprocess.Popen, dict]:
    """The agent's part for the shared path, run inside `host`'s namespace; returns the process and its report."""
    root.mkdir(parents=True)
    (root / "role.bin").write_bytes(role.SerializeToString())
    process = host.popen([sys.executable, "-c", KEEP, str(root / "role.bin"), str(root / "slurm"), str(CHECKOUT)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line, f"the agent's part on {host.name} ended without a report"
    return process, json.loads(line)


def _nfs(host, *argv: str) -> subprocess.CompletedProcess:
    return host.run(list(argv), check=False, timeout=20)


def test_the_controller_exports_the_shared_path_to_slurm_nodes_only(netns_lab, tmp_path) -> None:
    for tool in ("ganesha.nfsd", "nfs-cp", "nfs-cat", "nft"):
        assert shutil.which(tool), (f"{tool} is missing: run `make system-packages` (Debian nfs-ganesha, "
                                    "nfs-ganesha-vfs, libnfs-utils, nftables)")
    ctl, node, web = (netns_lab.host(name) for name in ("ctl", "node", "web"))
    shared = tmp_path / "shared"
    slurm = SlurmSettings(enabled=True, controller="ctl", nodes=MappingProxyType({"node": SlurmNode("p")}),
                          partitions=MappingProxyType({"p": SlurmPartition(default=True)}),
                          shared_path=str(shared), shared_export="ctl")
    firewall = FirewallSettings(enabled=True, control_planes=(ipaddress.ip_network(netns_lab.address(200)),))
    settings = Settings(ClusterSettings(name="lab"), firewall=firewall, slurm=slurm)
    fleet = Fleet((NodeState("ctl", ctl.address, cpu_cores=2), NodeState("node", node.address, cpu_cores=2),
                   NodeState("web", web.address, cpu_cores=2)))
    secret = {"munge-key": "k" * 40}.__getitem__
    exporting = slurm_role(settings, fleet, "ctl", secret)
    mounting = slurm_role(settings, fleet, "node", secret)
    assert list(exporting.nfs_clients) == [node.address] and not exporting.nfs_server
    assert mounting.nfs_server == ctl.address and mounting.shared_path == str(shared)

    began = time.monotonic()
    server, report = _keep(ctl, exporting, tmp_path / "ctl")
    exported = time.monotonic()
    assert report == {"warnings": [], "daemons": ["ganesha.nfsd"]}, report
    url = f"nfs://{ctl.address}{shared}"
    (tmp_path / "job.txt").write_text("written by a job on node\n")
    wrote = _nfs(node, "nfs-cp", str(tmp_path / "job.txt"), f"{url}/job.txt?version=4")
    assert wrote.returncode == 0, wrote.stderr
    assert (shared / "job.txt").read_text() == "written by a job on node\n"
    assert _nfs(node, "nfs-cat", f"{url}/job.txt?version=4").stdout == "written by a job on node\n"
    refused = _nfs(web, "nfs-cat", f"{url}/job.txt?version=4")
    assert refused.returncode != 0 and "written" not in refused.stdout, refused  # not among the export's clients

    table = firewall_table(settings, fleet, "ctl")
    assert f'ip saddr {{ {node.address}/32 }} tcp dport 2049 accept comment "nfs shared path"' in table.text
    ctl.run(["nft", "-f", "-"], input=replace_script(table.text))
    assert connect(web, ctl.address, 2049).startswith("refused")  # a reset, at once
    assert connect(node, ctl.address, 2049) == "open"
    again = _nfs(node, "nfs-cp", str(tmp_path / "job.txt"), f"{url}/again.txt?version=4")
    assert again.returncode == 0 and (shared / "again.txt").exists(), again.stderr
    print(f"\nganesha exporting in {exported - began:.1f} s; writes and reads over NFS in "
          f"{time.monotonic() - exported:.1f} s")

    mount_point = tmp_path / "node" / "shared"
    mounting.shared_path = str(mount_point)
    client, report = _keep(node, mounting, tmp_path / "node")
    try:
        if "nfs4" in Path("/proc/filesystems").read_text():  # a kernel with an NFS client: mounted for real
            assert report["warnings"] == [], report
        else:
            [warning] = report["warnings"]
            assert warning.startswith(f"mounting {ctl.address}:{mount_point} at {mount_point} failed: mount"), warning
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30)
        for process in (client, server):
            process.stdin.close()
            process.wait(timeout=20)
