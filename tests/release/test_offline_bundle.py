"""Offline bundles (issue 30, item 3): `llmgw bundle create` collects a signed release, the cached llama-server b11434
build and the Gemma 3 270M GGUF into one signed directory laid out as the agents' mirror (hard links, no copies),
and a tar of it; `llmgw bundle import` refuses a bundle with one file changed or added, naming the file, and imports
the tar as a mirror; an agent started `--offline` on that mirror alone installs llama.cpp and fetches Gemma from it
(the network sources it is also given, a counting loopback server, are never asked), serves a completion, refuses
an engine or weights the mirror lacks with a sentence, and `llmgw node doctor` says the node is offline-mirror-only.
`agents/ offline: true` sent as agent settings does the same to an agent started without --offline. An `llmgw agent
--offline` process on a host with no route out (a network namespace) serves Gemma from the imported bundle.
`--vllm LOCK` collects a lock's wheels (a stand-in cu129 lock: tiny `vllm` and `torch` wheels from a loopback
index), which an offline agent then installs from the mirror asking no index. The release is llmgw's wheel alone (1.5 s; the full one is
tests/release/test_release_build.py's)."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent.doctor import offline_checks
from llmgw.engines import builds
from llmgw.engines.locking import Locked, render_lock
from llmgw.wire import control_message, pb
from support.in_process_cli import run_llmgw
from support.releases import SignedRelease
from support.wheels import TORCH_STANDIN, serve, wheel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # agent_support, by name
from agent_support import ControlSide, next_matching  # noqa: E402
from nvml_support import FakeNvml, h200_dump  # noqa: E402

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
VERSION = "b11434"
KEY = "bundle-test-replica-key"


@dataclass(frozen=True)
class Made:
    release: SignedRelease
    directory: Path
    tar: Path
    summary: dict


@pytest.fixture(scope="module")
def made(tmp_path_factory, llama_server_binary, gemma_mirror, bare_release) -> Made:
    root = tmp_path_factory.mktemp("bundle")
    release = bare_release
    code, out, err = run_llmgw([
        "bundle", "create", str(root / "bundle"), "--key", str(release.secret_key), "--release",
        str(release.directory), "--engine", VERSION, "--engines-dir", str(llama_server_binary.parents[3]),
        "--weights", str(gemma_mirror / "sha256" / GEMMA_SHA256), "--tar", str(root / "bundle.tar"), "--json"])
    assert code == 0, err
    summary = json.loads(out)
    print(f"bundle create: {summary['files']} files, {summary['bytes'] / 1e6:.1f} MB in {summary['seconds']} s")
    return Made(release, root / "bundle", root / "bundle.tar", summary)


def _replace_one_byte(path: Path) -> None:
    """Change one byte of `path` in a new file (its old inode is hard-linked into the shared cache)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.unlink()
    path.write_bytes(bytes(data))


def _copy(bundle: Path, target: Path) -> Path:
    """The bundle again, every file hard-linked (cheap; change files only with `_replace_one_byte`)."""
    shutil.copytree(bundle, target, copy_function=os.link)
    return target


def test_the_bundle_is_the_mirror_layout_hard_linked_and_signed(made: Made, llama_server_binary, gemma_mirror):
    b = made.directory
    assert made.summary["engines"] == [f"llama.cpp/{VERSION}"] and made.summary["weights"] == [GEMMA_SHA256]
    assert made.summary["releases"] == ["0.1.0"] and made.summary["key_id"] == made.release.key_id
    engine = b / "llama.cpp" / VERSION / "bin" / "llama-server"
    assert engine.stat().st_ino == llama_server_binary.resolve().stat().st_ino  # hard-linked, not copied
    assert (b / "sha256" / GEMMA_SHA256).stat().st_ino == (gemma_mirror / "sha256" / GEMMA_SHA256).stat().st_ino
    assert os.access(engine, os.X_OK)
    assert (b / "releases" / "0.1.0" / "manifest.json.minisig").is_file()
    minisign = shutil.which("minisign")
    assert minisign, "minisign is missing: run `make system-packages` (Debian package minisign)"
    checked = subprocess.run([minisign, "-Vm", str(b / "manifest.json"), "-P", made.release.trusted_key],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "llmgw-bundle 0.1.0" in checked.stdout, checked.stderr
    code, out, err = run_llmgw(["bundle", "verify", str(b), "--trusted-key", made.release.trusted_key])
    assert code == 0 and "verified: bundle llmgw 0.1.0" in out, err


def test_a_bundle_with_a_changed_or_added_file_is_refused_naming_it(made: Made, tmp_path: Path):
    changed = _copy(made.directory, tmp_path / "changed")
    wheel_path = next((changed / "releases" / "0.1.0" / "wheels").glob("llmgw-*.whl"))
    _replace_one_byte(wheel_path)
    rel = wheel_path.relative_to(changed).as_posix()
    code, out, err = run_llmgw(["bundle", "import", str(changed), str(tmp_path / "mirror"),
                                "--trusted-key", made.release.trusted_key])
    assert code == 1, out
    assert f"{rel} has sha256" in err and f"the bundle {changed} (signed by key" in err, err
    assert "Traceback" not in err and ".importing" not in err, err
    assert not (tmp_path / "mirror").exists() and not list(tmp_path.glob(".mirror*"))  # nothing left behind

    added = _copy(made.directory, tmp_path / "added")
    (added / "sha256" / ("0" * 64)).write_bytes(b"slipped in")
    code, _out, err = run_llmgw(["bundle", "import", str(added), str(tmp_path / "mirror"),
                                 "--trusted-key", made.release.trusted_key])
    assert code == 1 and f"sha256/{'0' * 64} is not in the manifest" in err, err

    code, _out, err = run_llmgw(["bundle", "import", str(made.release.directory), str(tmp_path / "mirror"),
                                 "--trusted-key", made.release.trusted_key])
    assert code == 1 and f"{made.release.directory} is a release of llmgw, not a bundle" in err, err

    other = subprocess.run([sys.executable, "-c", "import sys; from llmgw.release import keygen, read_public_key; "
                            "print(read_public_key(keygen(sys.argv[1])[1]).line)", str(tmp_path / "k")],
                           capture_output=True, text=True, check=True).stdout.strip()
    code, _out, err = run_llmgw(["bundle", "import", str(made.tar), str(tmp_path / "mirror"), "--trusted-key", other])
    assert code == 1 and made.release.key_id in err and not (tmp_path / "mirror").exists(), err


async def test_an_offline_agent_installs_and_serves_from_the_imported_bundle_alone(made: Made, tmp_path: Path,
                                                                                   nursery):
    mirror = tmp_path / "site" / "mirror"
    started = time.monotonic()
    code, out, err = await trio.to_thread.run_sync(lambda: run_llmgw([
        "bundle", "import", str(made.tar), str(mirror), "--trusted-key", made.release.trusted_key, "--json"]))
    assert code == 0, err
    print(f"bundle import of the tar: {json.loads(out)['bytes'] / 1e6:.1f} MB in {time.monotonic() - started:.1f} s")
    assert (mirror / "sha256" / GEMMA_SHA256).is_file() and (mirror / "manifest.json").is_file()

    (tmp_path / "empty-index").mkdir()
    network, url, asked = serve(tmp_path / "empty-index")  # every network source points here: nothing may ask it
    config = AgentConfig(node_id="offline-node", state_dir=tmp_path / "state", cache_dir=tmp_path / "cache",
                         mirrors=(str(mirror),), offline=True, heartbeat_interval=60.0, address="127.0.0.1",
                         stop_shards_on_exit=True)
    control = ControlSide()
    agent = await nursery.start(run_agent, config, control.connect)
    try:
        link = await control.links.receive()
        assert (await link.receive()).WhichOneof("body") == "register"
        await link.send(control_message(command_id="i1", install_engine=pb.InstallEngine(
            engine="llama.cpp", version=VERSION, archive_url=f"{url}llama-{VERSION}.zip", archive_sha256="1" * 64,
            sdist_version="0.1", sdist_sha256="2" * 64)))
        result = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result", timeout=120)
        assert result.command_result.ok, result.command_result.error
        installed = json.loads((tmp_path / "state" / "engines" / "llama.cpp" / VERSION / "installed.json").read_text())
        assert f"mirror:{mirror}" in json.dumps(installed)

        await link.send(control_message(command_id="i2", install_engine=pb.InstallEngine(
            engine="llama.cpp", version="b1", archive_url=f"{url}llama-b1.zip", archive_sha256="1" * 64)))
        refused = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result", timeout=60)
        assert "installs from its offline mirror only" in refused.command_result.error
        assert "llama.cpp/b1" in refused.command_result.error

        await link.send(control_message(command_id="s1", start_shard=pb.StartShard(
            shard_id="gemma-0/0", replica_id="gemma-0", model="gemma", engine="llama.cpp", engine_version=VERSION,
            fingerprint="fp", replica_key=KEY, cpu_cores=2, context_size=2048,
            engine_args=["--no-jinja", "--chat-template", "gemma"],
            weights=[pb.WeightsFile(source=f"{url}gemma.gguf", sha256=GEMMA_SHA256)])))
        ready = await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                    and m.shard_status.state in ("ready", "failed"), timeout=120)
        assert ready.shard_status.state == "ready", ready.shard_status
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ready.shard_status.port}", timeout=60) as client:
            answer = await client.post("/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json={
                "model": "gemma", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4

        missing = hashlib.sha256(b"not bundled").hexdigest()
        await link.send(control_message(command_id="s2", start_shard=pb.StartShard(
            shard_id="other-0/0", replica_id="other-0", model="other", engine="llama.cpp", engine_version=VERSION,
            fingerprint="fp2", replica_key=KEY, cpu_cores=1, context_size=512,
            weights=[pb.WeightsFile(source=f"{url}other.gguf", sha256=missing)])))
        failed = await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                     and m.shard_status.shard_id == "other-0/0"
                                     and m.shard_status.state == "failed", timeout=60)
        assert f"{missing} is not in the offline mirror {mirror}" in failed.shard_status.error
        assert asked == [], asked  # no source on the network was asked for anything
    finally:
        await agent.supervisor.stop_all(5)
        network.shutdown()

    (check,) = offline_checks(tmp_path / "state")
    assert check.status.value == "info" and check.detail.startswith(f"offline-mirror-only: engines, weights and "
                                                                    f"releases are installed from {mirror} only")
    assert "bundle llmgw 0.1.0" in check.detail
    code, out, err = await trio.to_thread.run_sync(lambda: run_llmgw([
        "node", "doctor", "--state-dir", str(tmp_path / "state"), "--json"]))
    offline = [c for c in json.loads(out)["checks"] if c["name"] == "offline"]
    assert offline and offline[0]["detail"].startswith("offline-mirror-only"), (out, err)

    shutil.rmtree(mirror)
    (gone,) = offline_checks(tmp_path / "state")
    assert gone.status.value == "fail" and "is missing: import the bundle again" in gone.detail


async def test_vllm_wheels_come_only_with_the_option_and_an_offline_agent_installs_vllm_from_them(
        made: Made, tmp_path: Path, monkeypatch):
    """A stand-in vLLM lock (build cu129: `vllm` and `torch` stand-ins from a loopback index) bundled with --vllm; an
    offline agent on a GPU node whose driver wants cu129 installs vLLM from the imported mirror's wheels/ and locks/
    with pip --no-index, asking no index (neither the build's extra index nor pip's)."""
    assert made.summary["wheels"] == 0 and not (made.directory / "wheels").exists()  # not by default
    index = tmp_path / "index"
    files = [wheel(index, "torch", "2.13.0", body=TORCH_STANDIN),
             wheel(index, "vllm", "0.32.0", ("torch",), body="print('vllm stand-in imported')\n")]
    lock = tmp_path / "vllm-0.32.0-cu129.txt"
    lock.write_text(render_lock("vllm", "0.32.0", "cu129", ["vllm==0.32.0"], [
        Locked(name, version, "", hashlib.sha256(path.read_bytes()).hexdigest())
        for (name, version), path in zip((("torch", "2.13.0"), ("vllm", "0.32.0")), files)]))
    server, url, asked = serve(index)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip configuration adds its own indexes
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.setitem(builds.INDEXES, "cu129", url)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    try:
        code, out, err = await trio.to_thread.run_sync(lambda: run_llmgw([
            "bundle", "create", str(tmp_path / "bundle"), "--key", str(made.release.secret_key), "--release",
            str(made.release.directory), "--vllm", str(lock), "--index-url", url, "--json"]))
        assert code == 0, err
        assert json.loads(out)["wheels"] == 2
        mirror = tmp_path / "mirror"
        code, _out, err = await trio.to_thread.run_sync(lambda: run_llmgw([
            "bundle", "import", str(tmp_path / "bundle"), str(mirror), "--trusted-key", made.release.trusted_key]))
        assert code == 0, err
        assert (mirror / "locks" / lock.name).is_file() and len(list((mirror / "wheels").glob("*.whl"))) == 2
        asked.clear()

        nvml = FakeNvml([copy.deepcopy(h200_dump()["devices"][0])], driver="570.172.08", cuda=12080)
        config = AgentConfig(node_id="gpu-offline", state_dir=tmp_path / "state", heartbeat_interval=60.0,
                             mirrors=(str(mirror),), offline=True)
        control = ControlSide()
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(run_agent, config, control.connect, nvml=nvml))
            link = await control.links.receive()
            assert (await link.receive()).WhichOneof("body") == "register"
            await link.send(control_message(command_id="i1", install_engine=pb.InstallEngine(
                engine="vllm", version="0.32.0", python_packages=["vllm==0.32.0"])))
            result = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result", timeout=240)
            assert result.command_result.ok, result.command_result.error
            nursery.cancel_scope.cancel()
    finally:
        server.shutdown()
    marker = json.loads((tmp_path / "state" / "engines" / "vllm" / "0.32.0" / "installed.json").read_text())
    assert (marker["build"], marker["lock"], marker["find_links"]) == ("cu129", lock.name, str(mirror / "wheels"))
    assert marker["extra_index_url"] is None and marker["engine_version"] == "0.32.0"
    assert asked == [], asked  # no index was asked for anything


async def test_agents_offline_in_the_settings_makes_a_node_offline_and_false_again_not(made: Made, tmp_path: Path):
    """agents/ `offline: true` (llmgw.yaml's fleet, sent as AgentSettings) turns an agent started without --offline
    into an offline one: doctor says so, an engine the mirror lacks is refused; `offline: false` undoes it."""
    from llmgw.control.commands import agent_settings
    from llmgw.settings import load_directory

    repo = shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "cluster-repo", tmp_path / "repo")
    default = repo / "agents" / "default.yaml"
    default.write_text(default.read_text().replace("# offline: true", "offline: true").replace(
        "mirrors: []", f"mirrors: [{made.directory}]"))
    sent = agent_settings(load_directory(repo), "offline-node")
    assert sent.offline and list(sent.mirrors) == [str(made.directory)]

    config = AgentConfig(node_id="offline-node", state_dir=tmp_path / "state", cache_dir=tmp_path / "cache",
                         heartbeat_interval=60.0)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        assert (await link.receive()).WhichOneof("body") == "register"
        assert offline_checks(tmp_path / "state") == []
        await link.send(control_message(command_id="c1", agent_settings=sent))
        assert (await next_matching(link, lambda m: m.WhichOneof("body") == "command_result")).command_result.ok
        assert agent.config.offline_only
        (check,) = offline_checks(tmp_path / "state")
        assert check.detail.startswith(f"offline-mirror-only: engines, weights and releases are installed from "
                                       f"{made.directory} only (bundle llmgw 0.1.0")
        await link.send(control_message(command_id="i1", install_engine=pb.InstallEngine(
            engine="llama.cpp", version="b1", sdist_version="0.1", sdist_sha256="2" * 64)))
        refused = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result", timeout=60)
        assert "installs from its offline mirror only" in refused.command_result.error

        sent.offline = False
        await link.send(control_message(command_id="c2", agent_settings=sent))
        assert (await next_matching(link, lambda m: m.WhichOneof("body") == "command_result")).command_result.ok
        assert not agent.config.offline_only and offline_checks(tmp_path / "state") == []
        nursery.cancel_scope.cancel()


async def test_a_site_host_with_no_route_out_serves_gemma_from_the_imported_bundle(made: Made, tmp_path: Path,
                                                                                   netns_lab, nursery):
    """`llmgw agent --mirror M --offline` as its own process on a host (a network namespace) whose only route is the
    site's own network: no default route, so nothing outside can be reached. It registers with a control side in
    the test, installs llama.cpp and Gemma from the imported bundle, and the test's request through its relay is
    answered."""
    from llmgw.wire import serve_agents

    mirror = tmp_path / "mirror"
    code, _out, err = await trio.to_thread.run_sync(lambda: run_llmgw([
        "bundle", "import", str(made.tar), str(mirror), "--trusted-key", made.release.trusted_key]))
    assert code == 0, err
    node = netns_lab.host("site-node")
    root = netns_lab.join_root()
    routes = node.run(["ip", "-4", "route"]).stdout
    assert "default" not in routes, routes
    out = node.run([sys.executable, "-c", "import socket\ntry:\n socket.create_connection(('192.0.2.1', 443), 3)\n"
                    "except OSError as e:\n print(e.strerror)"]).stdout
    assert "unreachable" in out.lower(), out  # nothing outside the site can be reached from this host

    links_send, links = trio.open_memory_channel(1)

    async def handler(link, _peer):
        await links_send.send(link)
        await trio.sleep_forever()

    port = await nursery.start(serve_agents, handler, root, 0)
    log = (tmp_path / "agent.log").open("w")
    node.popen([sys.executable, "-m", "llmgw.cli", "agent", "--control-plane", f"{root}:{port}", "--node-id",
                "site-node", "--state-dir", str(tmp_path / "state"), "--mirror", str(mirror), "--offline",
                "--address", node.address, "--no-bandwidth-probe", "--stop-shards-on-exit"],
               env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                    "LLMGW_CACHE": str(tmp_path / "empty-cache")}, stdout=log, stderr=subprocess.STDOUT)
    try:
        with trio.fail_after(90):
            link = await links.receive()
        assert (await link.receive()).WhichOneof("body") == "register"
        await link.send(control_message(command_id="i1", install_engine=pb.InstallEngine(
            engine="llama.cpp", version=VERSION, sdist_version="0.1", sdist_sha256="2" * 64)))
        result = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result", timeout=120)
        assert result.command_result.ok, result.command_result.error
        await link.send(control_message(command_id="s1", start_shard=pb.StartShard(
            shard_id="gemma-0/0", replica_id="gemma-0", model="gemma", engine="llama.cpp", engine_version=VERSION,
            fingerprint="fp", replica_key=KEY, cpu_cores=2, context_size=2048,
            engine_args=["--no-jinja", "--chat-template", "gemma"],
            weights=[pb.WeightsFile(source="hf://google/gemma-3-270m@main/gemma.gguf", sha256=GEMMA_SHA256)])))
        ready = await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                    and m.shard_status.state in ("ready", "failed"), timeout=180)
        assert ready.shard_status.state == "ready", ready.shard_status
        async with httpx.AsyncClient(base_url=f"http://{node.address}:{ready.shard_status.port}",
                                     timeout=60) as client:
            answer = await client.post("/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json={
                "model": "gemma", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        (check,) = offline_checks(tmp_path / "state")
        assert check.detail.startswith(f"offline-mirror-only: engines, weights and releases are installed from "
                                       f"{mirror} only")
        await link.send(control_message(command_id="x1", stop_shard=pb.StopShard(shard_id="gemma-0/0",
                                                                                   grace_seconds=5)))
        await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                            and m.shard_status.state == "stopped", timeout=60)
    finally:
        log.close()
        print((tmp_path / "agent.log").read_text()[-3000:])
