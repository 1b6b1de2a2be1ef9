"""The container images (deploy/container/, issue 28 item 4), built here by deploy/container/build.sh as `make image`
runs it but from a release's wheels (`LLMGW_WHEELS`: those of the session's signed release of this tree, shared with
the install tests; `make image` builds llmgw's wheel from the tree and downloads its dependencies', a branch of
build.sh this test does not run), on a debootstrap base cached in $LLMGW_CACHE/container (imported once into a podman
storage under $LLMGW_CACHE/container/stores, build.sh's LLMGW_BASE_STORE, and read from there), `podman build --pull
never --network none`, into podman storage of the test's own (--root/--runroot under /tmp), then run: the control
plane as the Helm chart runs it (uid/gid 10001, state in /var/lib/llmgw, gateway 0.0.0.0:8080, agents and admin with
--tls) in a network namespace of the test's lab with the example settings (examples/cluster-repo), answering
`/v1/models` to the openai SDK with a key made by `llmgw keys create` inside the container, and `llmgw validate` of
those settings (and of a broken copy, refused naming the file). The agent image keeps the same llmgw and user and
asks the NVIDIA runtime for every GPU (compute, utility).

Needs root and the Debian packages podman, buildah, runc, debootstrap (`make system-packages`): it fails, never
skips, without them. About 65-95 s here with the base cached; the first time on a machine debootstrap adds about
2 minutes (the base tarball is then kept in $LLMGW_CACHE/container).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from support.llmgw_processes import read_server_banner

from llmgw.engines.installing import default_cache_dir

CHECKOUT = Path(__file__).resolve().parents[2]
EXAMPLE = CHECKOUT / "examples" / "cluster-repo"
CONF = CHECKOUT / "deploy" / "container" / "containers.conf"
BASE_STORES = default_cache_dir() / "container" / "stores"
"""build.sh's LLMGW_BASE_STORE: the base is imported there once per machine (and base tarball), not per run."""


@functools.cache
def _base_store() -> str:
    """The podman storage under BASE_STORES that build.sh imports the cached base into and reads it from (named as
    build.sh names it: the cksum of the base tarball's path, size and mtime); base.sh only names the cached tarball."""
    key = subprocess.run(["sh", "-c", "stat -c '%n %s %Y' \"$1\" | cksum | cut -d' ' -f1", "-",
                          subprocess.run([str(CHECKOUT / "deploy" / "container" / "base.sh")], capture_output=True,
                                         text=True, check=True).stdout.strip()],
                         capture_output=True, text=True, check=True).stdout.strip()
    return f"additionalimagestore={BASE_STORES / key / 'root'}"


def _podman(storage: Path, *argv: str, check: bool = True, timeout: float = 120,
            base: bool = True) -> subprocess.CompletedProcess:
    """podman on the test's storage, with the shared base's store read-only beside it (`base`: not for the reset,
    which must never reach that store)."""
    return subprocess.run(["podman", "--root", str(storage / "root"), "--runroot", str(storage / "run"),
                           "--storage-driver", "overlay", *(["--storage-opt", _base_store()] if base else []), *argv],
                          env={**os.environ, "CONTAINERS_CONF": str(CONF)}, capture_output=True, text=True,
                          check=check, timeout=timeout)


def _settings_repo(target: Path) -> Path:
    """examples/cluster-repo committed in a git repository of its own, owned by the image's user (libgit2 refuses
    a repository another user owns)."""
    shutil.copytree(EXAMPLE, target)
    git = ["git", "-C", str(target), "-c", "user.name=test", "-c", "user.email=test@example.org"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(target)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "example settings"], check=True)
    for path in [target, *target.rglob("*")]:
        os.chown(path, 10001, 10001, follow_symlinks=False)
    return target


def _build(storage: Path, wheels: Path) -> tuple[str, str]:
    done = subprocess.run([str(CHECKOUT / "deploy" / "container" / "build.sh")],
                          env={**os.environ, "PYTHON": sys.executable, "LLMGW_IMAGE_STORAGE": str(storage),
                               "LLMGW_WHEELS": str(wheels), "LLMGW_BASE_STORE": str(BASE_STORES)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    server, agent = done.stdout.split()
    return server, agent


@pytest.fixture
def storage() -> Iterator[Path]:
    """podman's storage for this test, under /tmp: podman refuses a --runroot longer than 50 characters."""
    folder = Path(tempfile.mkdtemp(prefix="llmgw-podman-", dir="/tmp"))
    try:
        yield folder
    finally:
        _podman(folder, "system", "reset", "--force", check=False, base=False)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_control_plane_image_serves_the_example_settings_in_a_namespace(tmp_path, netns_lab, storage,
                                                                            full_release) -> None:
    server_image, agent_image = _build(storage, full_release.directory / "wheels")
    assert server_image == "localhost/llmgw:0.1.0" and agent_image == "localhost/llmgw-agent:0.1.0"

    config = json.loads(_podman(storage, "image", "inspect", server_image).stdout)[0]["Config"]
    assert (config["User"], config["Entrypoint"], config["WorkingDir"]) == ("10001:10001", ["llmgw"], "/home/llmgw")
    assert sorted(config["ExposedPorts"]) == ["8080/tcp", "8081/tcp", "8082/tcp", "8083/tcp"]
    agent_config = json.loads(_podman(storage, "image", "inspect", agent_image).stdout)[0]["Config"]
    assert {"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            "LLMGW_STATE=/var/lib/llmgw"} <= set(agent_config["Env"])
    assert agent_config["User"] == "10001:10001"
    help_text = _podman(storage, "run", "--rm", "--network", "none", agent_image).stdout
    assert "--control-plane" in help_text

    settings = _settings_repo(tmp_path / "settings")
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, 10001, 10001)
    host = netns_lab.host("cp")
    netns_lab.join_root()
    name = f"llmgw-test-{os.getpid()}"
    run = ["podman", "--root", str(storage / "root"), "--runroot", str(storage / "run"), "--storage-driver",
           "overlay", "--storage-opt", _base_store(), "run", "--rm", "--name", name, "--network", f"ns:/run/netns/{host.netns}",
           "--read-only", "--tmpfs", "/tmp", "--tmpfs", "/home/llmgw",
           "-v", f"{settings}:/srv/settings:ro", "-v", f"{state}:/var/lib/llmgw",
           server_image, "server", "--repo", "/srv/settings", "--state", "/var/lib/llmgw",
           "--gateway", "0.0.0.0:8080", "--admin", "0.0.0.0:8081", "--agents", "0.0.0.0:8082", "--tls",
           "--join-port", "8083", "--tls-hostname", "llmgw-agents"]
    server = subprocess.Popen(run, env={**os.environ, "CONTAINERS_CONF": str(CONF)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        banner = read_server_banner(server, timeout=120)
        assert banner["agents"][1:] == ["port", "8082", "(mutual", "TLS;", "join", "port", "8083)"], banner
        assert banner["settings"][2:] == ["from", "/srv/settings"], banner
        made = _podman(storage, "exec", name, "llmgw", "keys", "create", "--project", "demo", "--state",
                       "/var/lib/llmgw", "--json")
        key = json.loads(made.stdout)["key"]
        client = openai.OpenAI(base_url=f"http://{host.address}:8080/v1", api_key=key, max_retries=0, timeout=30)
        models = sorted(model.id for model in client.models.list())
        # the project's three models and their aliases; not llama-3.1-70b-instruct, which demo may not use
        assert models == ["gemma", "gemma-3", "gemma-3-270m", "gemma-3-270m-vllm", "smollm2", "smollm2-135m-instruct"]
        assert (state / "llmgw.sqlite3").stat().st_uid == 10001
    finally:
        _podman(storage, "stop", "-t", "10", name, check=False)
        server.wait(timeout=30)
        server.stderr.close()

    validated = _podman(storage, "run", "--rm", "--network", "none", "-v", f"{settings}:/srv/settings:ro",
                        server_image, "validate", "/srv/settings", check=False)
    assert validated.returncode == 0, validated.stderr
    (settings / "llmgw.yaml").write_text("name: demo\nlisteners: 7\n")
    refused = _podman(storage, "run", "--rm", "--network", "none", "-v", f"{settings}:/srv/settings:ro",
                      server_image, "validate", "/srv/settings", check=False)
    assert refused.returncode == 1 and "llmgw.yaml" in refused.stdout + refused.stderr, refused
