"""The files an agent writes itself for slurm.yaml `containers` and `shared.export` (issue 37): Slurm's oci.conf
(llmgw.tools.slurm_oci) and nfs-ganesha's export (llmgw.tools.nfs_export), each refusing a value that would change
its meaning, and the mount decision of the other Slurm nodes read from /proc/self/mountinfo (a capture of this
machine's, with an NFS line added in the kernel's format)."""

from __future__ import annotations

import pytest

from llmgw.tools.nfs_export import ganesha_conf, mount_decision, nfs_source, parse_mountinfo
from llmgw.tools.slurm_oci import OCI_CONF_KEYS, oci_conf

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12358824k,nr_inodes=3089706,mode=755
27 1 254:1 / / rw,relatime - ext4 /dev/vda1 rw
41 27 0:40 / /mnt/with\\040space rw,relatime - tmpfs tmpfs rw
52 27 0:51 / /mnt/shared rw,relatime shared:30 - nfs4 10.1.2.3:/mnt/shared rw,vers=4.1,proto=tcp,port=2049
"""


def test_oci_conf_runs_each_step_with_runc_run_and_names_one_container_per_task() -> None:
    text = oci_conf("runc", "/usr/sbin/runc")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert {line.split("=", 1)[0] for line in lines} == OCI_CONF_KEYS
    assert 'RunTimeRun="/usr/sbin/runc run %n.%u.%j.%s.%t -b %b"' in lines
    assert 'RunTimeDelete="/usr/sbin/runc delete --force %n.%u.%j.%s.%t"' in lines
    assert "%U" not in text and "RunTimeCreate" not in text  # neither works on Slurm 22.05 with runc


@pytest.mark.parametrize("runtime, program", [("crun", "/usr/bin/crun"), ("runc", "runc"), ("runc", "/bin/x; id"),
                                              ("runc", "/usr/bin/run c"), ("runc", '/x"y'), ("runc", "/a/../b")])
def test_oci_conf_refuses_another_runtime_or_a_program_that_is_not_a_plain_path(runtime: str, program: str) -> None:
    with pytest.raises(ValueError, match=r"runtime|absolute path"):
        oci_conf(runtime, program)


def test_the_export_lets_the_given_addresses_in_only_and_listens_on_nfsv4_tcp_alone() -> None:
    text = ganesha_conf("/srv/shared/", ["10.0.0.3", "10.0.0.2", "fd00::2", "10.0.0.2"], "/var/lib/llmgw/slurm/nfs")
    assert "\tClients = 10.0.0.2, 10.0.0.3, fd00::2;\n" in text
    assert '\tPath = "/srv/shared";\n\tPseudo = "/srv/shared";\n' in text
    assert "\tAccess_Type = None;\n" in text  # everyone else: no access at all
    for line in ("Protocols = 4;", "NFS_Port = 2049;", "Enable_UDP = false;", "Enable_NLM = false;",
                 "Transports = TCP;"):
        assert line in text


@pytest.mark.parametrize("path, clients, why", [
    ("/srv/shared; }", ["10.0.0.2"], "cannot be written"), ("srv", ["10.0.0.2"], "cannot be written"),
    ("/srv/../etc", ["10.0.0.2"], "cannot be written"), ("/srv", ["10.0.0.0/8"], "not an IP address"),
    ("/srv", ["*"], "not an IP address"), ("/srv", [], "no NFS client")])
def test_the_export_refuses_what_would_change_its_meaning(path: str, clients: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        ganesha_conf(path, clients, "/var/lib/llmgw/slurm/nfs")


def test_mountinfo_is_read_with_its_escapes() -> None:
    mounts = parse_mountinfo(MOUNTINFO + "garbage line\n")
    assert [m.mount_point for m in mounts] == ["/proc", "/dev", "/", "/mnt/with space", "/mnt/shared"]
    assert (mounts[-1].fstype, mounts[-1].source) == ("nfs4", "10.1.2.3:/mnt/shared")


def test_a_node_mounts_the_export_once_and_leaves_another_mount_alone() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    argv, warning = mount_decision("10.1.2.4", "/srv/shared", mounts)
    assert argv == ["mount", "-t", "nfs4", "-o", "vers=4.1,proto=tcp,port=2049,hard", "10.1.2.4:/srv/shared",
                    "/srv/shared"] and not warning
    assert mount_decision("10.1.2.3", "/mnt/shared/", mounts) == (None, "")
    argv, warning = mount_decision("10.1.2.9", "/mnt/shared", mounts)
    assert argv is None and "mounted from 10.1.2.3:/mnt/shared (nfs4)" in warning and "left alone" in warning
    assert nfs_source("fd00::1", "/srv") == "[fd00::1]:/srv"
    with pytest.raises(ValueError, match="not an IP address"):
        mount_decision("host;rm", "/srv", mounts)
