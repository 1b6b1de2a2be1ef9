"""deploy/container/base.sh makes the images' Debian base once, even when builds start at once (issue 28 item 4's
images; on a fresh machine tests/packaging/test_container_image.py and tests/slurm/test_slurm_containers.py ask for
it together): a second caller waits for the first and prints the same tarball, so that build.sh's base store, named
by the tarball's path, size and mtime, is the same for both (two debootstraps writing one `.part` once gave two
stores, and an image built on one could not be read through the other). debootstrap and chroot are stand-ins here
(a real debootstrap takes minutes and the network); tar, flock and the script are real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BASE_SH = Path(__file__).resolve().parents[2] / "deploy" / "container" / "base.sh"

DEBOOTSTRAP = """#!/bin/sh
# debootstrap --variant=minbase --include=... SUITE TARGET MIRROR: a root of one file, a line per run in the log
echo "$*" >> "$RUNS"
sleep 1
mkdir -p "$4/etc" && echo bookworm > "$4/etc/debian_version"
"""


def test_two_builds_at_once_make_the_base_once_and_name_the_same_file(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "debootstrap").write_text(DEBOOTSTRAP)
    (tools / "chroot").write_text("#!/bin/sh\nexit 0\n")  # `chroot ROOT apt-get clean`: nothing to clean here
    for tool in tools.iterdir():
        tool.chmod(0o755)
    runs = tmp_path / "runs"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "LLMGW_CACHE": str(tmp_path / "cache"),
           "RUNS": str(runs)}
    both = [subprocess.Popen([str(BASE_SH)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [process.communicate(timeout=60) for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    paths = {stdout.strip() for stdout, _ in outputs}
    assert len(paths) == 1, outputs
    tarball = Path(paths.pop())
    assert tarball.is_file() and not tarball.with_name(tarball.name + ".part").exists()
    assert len(runs.read_text().splitlines()) == 1  # one debootstrap, the other caller waited
    members = subprocess.run(["tar", "-tf", str(tarball)], capture_output=True, text=True, check=True).stdout
    assert "./etc/debian_version" in members.split()
    # later callers print it again without making it
    again = subprocess.run([str(BASE_SH)], env=env, capture_output=True, text=True, check=True)
    assert again.stdout.strip() == str(tarball) and len(runs.read_text().splitlines()) == 1
