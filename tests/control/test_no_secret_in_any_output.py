"""No secret in any output: known secrets are planted in every place one can come from (the store URL's password,
the settings repository URL's token, a Hub token, the replica key, the admin token, the agent's node secret) and every output is searched
for them: the status document, the audit commits, every log record, the agent's and engines' log lines, the
admin API's and the gateway's answers, the CLI's output and error texts."""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings.model import Listener

from support.in_process_cli import run_llmgw

from .conftest import git, stand_in_agent
from .test_in_process_fleet import push_catalog, replica_states, wait_for

HUBBED_YAML = """\
name: hubbed
engine: llama.cpp
engine_version: b11434
weights:
  - source: hf://acme/private@{rev}/model.gguf
    sha256: {sha}
    secret: hub-token
replicas: 1
resources:
  cpu_cores: 0.1
  memory: 64Mi
context_size: 512
"""


def _planted(name: str) -> str:
    return f"{name}-{secrets.token_hex(12)}"


def _leaks(text: str, planted: dict[str, str]) -> list[str]:
    """The names of the planted secrets found in `text` (whole, or any 12-character piece of one)."""
    found = []
    for name, value in planted.items():
        pieces = {value[i:i + 12] for i in range(0, len(value) - 11)}
        if any(piece in text for piece in pieces):
            found.append(name)
    return found


def _records(caplog) -> str:
    lines = []
    for record in caplog.records:
        lines.append(record.getMessage())
        if record.exc_info:
            lines.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(lines)


async def _echoing_hub(seen: list[bytes], task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A Hub stand-in that answers every request 500 with the request (its Authorization header too) as the body,
    as a careless server might."""
    async def answer(stream: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            request += chunk
        seen.append(request)
        body = b"internal error while serving " + request
        await stream.send_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
                              b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(answer, listeners)


async def _cli(plane: ControlPlane, *args: str, process: bool = False) -> str:
    """`llmgw ARGS` against `plane`: what it printed. `process`: as a real process; else in this process, in a
    thread (its log records are searched too; a process start costs about a second of imports)."""
    env = {"LLMGW_ADMIN_URL": plane.admin_url, "LLMGW_ADMIN_TOKEN": plane.admin_token}
    if process:
        done = await trio.run_process([sys.executable, "-m", "llmgw.cli", *args], env=dict(os.environ, **env),
                                      capture_stdout=True, capture_stderr=True, check=False)
        code, out, err = done.returncode, done.stdout.decode(), done.stderr.decode()
    else:
        code, out, err = await trio.to_thread.run_sync(run_llmgw, list(args), env)
    return f"$ llmgw {' '.join(args)} -> {code}\n{out}{err}"


async def test_no_secret_reaches_status_audit_logs_answers_or_cli_output_of_a_running_fleet(
    tmp_path, settings_repo, weights_mirror, fake_engine, caplog, monkeypatch,
):
    caplog.set_level(logging.DEBUG)
    mirror, sha = weights_mirror
    planted = {"hub token": _planted("hf_hubtoken")}
    (tmp_path / "state" / "secrets").mkdir(parents=True)
    (tmp_path / "state" / "secrets" / "hub-token").write_text(planted["hub token"] + "\n")
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    outputs: list[str] = []
    async with trio.open_nursery() as nursery:
        hub_requests: list[bytes] = []
        hub_port = await nursery.start(_echoing_hub, hub_requests)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub_port}")
        await nursery.start(plane.run)
        planted["admin token"] = plane.admin_token
        planted["replica key"] = plane.replica_key("tiny-0")
        planted["hubbed replica key"] = plane.replica_key("hubbed-0")
        agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(run_agent, agent, plane.local_connector())
        await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready", 30, "tiny-0 ready")
        planted["node secret"] = (tmp_path / "agent" / "node-secret").read_text().strip()  # made by the agent

        # a model whose weights come from the Hub with a token: the Hub answers 500 and echoes the request
        def add_hubbed(checkout: Path) -> None:
            (checkout / "catalog" / "hubbed.yaml").write_text(HUBBED_YAML.format(rev="a" * 40, sha="b" * 64))
            git("add", "catalog/hubbed.yaml", cwd=checkout)
        await push_catalog(tmp_path / "checkout", settings_repo, add_hubbed, "hubbed: weights from the Hub")
        await wait_for(lambda: "hubbed-0" in plane.status()["replicas"]
                       and plane.status()["replicas"]["hubbed-0"]["state"] == "failed", 30,
                       "hubbed-0 failed", plane.status)

        _record, api_key = plane.store.create_api_key("demo")
        async with httpx.AsyncClient(base_url=plane.gateway_url, timeout=10) as client:
            await wait_for(lambda: plane.table.models["tiny"].replicas, 5, "a route to tiny")
            for body in ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                         {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                          "stream": True},
                         {"model": "hubbed", "messages": [{"role": "user", "content": "hi"}]},
                         {"model": "nope", "messages": []}):
                answer = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                                           json=body)
                outputs.append(f"gateway {answer.status_code} {dict(answer.headers)} {answer.text}")
            outputs.append((await client.get("/v1/models", headers={"Authorization": f"Bearer {api_key}"})).text)
            wrong = await client.post("/v1/chat/completions", json={"model": "tiny"},
                                      headers={"Authorization": f"Bearer {planted['admin token']}"})
            outputs.append(f"gateway {wrong.status_code} {wrong.text}")

        auth = {"Authorization": f"Bearer {plane.admin_token}"}
        async with httpx.AsyncClient(base_url=plane.admin_url, timeout=30) as admin:
            for path in ("/api/v1/status", "/api/v1/nodes", "/api/v1/replicas", "/api/v1/history?limit=1000",
                         "/api/v1/fleet", "/api/v1/plan", "/api/v1/logs?node=n1",
                         "/api/v1/logs?node=n1&shard=tiny-0/0", "/api/v1/logs?node=n1&shard=hubbed-0/0",
                         "/api/v1/logs?node=n1&shard=nowhere", "/openapi.yaml"):
                answer = await admin.get(path, headers=auth)
                outputs.append(f"admin {path} {answer.status_code} {answer.text}")
            outputs.append((await admin.get("/api/v1/status")).text)  # no token: the 401's text
        for args in (("status", "--json"), ("status",), ("history",), ("nodes",), ("replicas",), ("logs", "n1"),
                     ("logs", "n1", "--shard", "hubbed-0/0"), ("plan",), ("apply", "--timeout", "5", "--json")):
            outputs.append(await _cli(plane, *args, process=args == ("status", "--json")))

        await plane.audit.flush(10)
        outputs.append(await trio.to_thread.run_sync(
            lambda: git("log", "-p", "--format=%B", "--all", cwd=settings_repo)))
        nursery.cancel_scope.cancel()

    text = "\n".join(outputs)
    # the outputs are the real ones: the failure is there, said in words, and the planted secrets were used
    assert "hubbed-0" in text and "HTTP 500" in text, text[-3000:]
    assert outputs[0].startswith("gateway 200") and outputs[1].startswith("gateway 200")  # the replica key worked
    assert "status.yaml" in text
    assert any(planted["hub token"].encode() in request for request in hub_requests)  # the token was sent
    leaks = {name: [o[:300] for o in outputs if _leaks(o, {name: planted[name]})]
             for name in _leaks(text, planted)}
    log_leaks = _leaks(_records(caplog), planted)
    assert not leaks and not log_leaks, (leaks, log_leaks)


def test_no_store_password_or_repository_token_reaches_errors_status_or_logs(tmp_path, caplog):
    """A mistyped store URL, an unreachable PostgreSQL with a password, and a settings repository URL with a token
    that cannot be fetched: their errors, the status document and the logs name them without the secret."""
    caplog.set_level(logging.DEBUG)
    store_password = _planted("pgpassword")
    repo_token = _planted("ghp_repotoken")
    outputs = []

    def llmgw(*args: str, process: bool = False) -> None:
        """`process`: as a real process (what the interpreter itself prints too); else in this process, whose log
        records are searched as well (a process start costs about a second of imports)."""
        if process:
            done = subprocess.run([sys.executable, "-m", "llmgw.cli", *args], capture_output=True, text=True,
                                  cwd=tmp_path)
            code, out, err = done.returncode, done.stdout, done.stderr
        else:
            code, out, err = run_llmgw(list(args), cwd=tmp_path)
        # what llmgw printed (not the command line the test typed, which holds the URL by design)
        outputs.append(f"$ llmgw {args[0]} ... -> {code}\n{out}{err}")

    # the store's URL, mistyped and unreachable, in llmgw.yaml, on the command line and in the environment
    seed = tmp_path / "seed"
    seed.mkdir()
    for n, url in enumerate((f"postgresq://llmgw:{store_password}@db.invalid/llmgw",
                             f"postgresql://llmgw:{store_password}@127.0.0.1:1/llmgw")):
        (seed / "llmgw.yaml").write_text(f"name: t\nstore:\n  kind: postgresql\n  url: {url}\n")
        llmgw("validate", str(seed), process=True)
        llmgw("diff", "--help")
        llmgw("store", "migrate", "--store", url)
        llmgw("keys", "list", "--store", url)
        llmgw("token", "list", "--store", url)
        llmgw("usage", "--store", url)
        llmgw("store", "copy", str(tmp_path / f"s{n}.sqlite3"), url)

    # the settings repository behind a URL with a token that cannot be fetched
    repo_url = f"http://x-access-token:{repo_token}@127.0.0.1:1/acme/settings.git"
    anywhere = Listener("127.0.0.1", 0)
    plane = ControlPlane(ControlConfig(repo=repo_url, state_dir=tmp_path / "state", poll_interval=0.2,
                                       gateway_listener=anywhere, admin_listener=anywhere, agents_listener=anywhere))

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            await wait_for(lambda: plane.status()["settings"].get("remote_error"), 10, "the fetch error", plane.status)
            outputs.append(json.dumps(plane.status(), default=str))
            async with httpx.AsyncClient(base_url=plane.admin_url, timeout=10) as admin:
                outputs.append((await admin.get("/api/v1/status",
                                                headers={"Authorization": f"Bearer {plane.admin_token}"})).text)
                outputs.append((await admin.get("/api/v1/plan",
                                                headers={"Authorization": f"Bearer {plane.admin_token}"})).text)
            nursery.cancel_scope.cancel()

    trio.run(run)
    text = "\n".join(outputs)
    assert "127.0.0.1:1" in text and "postgresq" in text, text[-3000:]
    planted = {"store password": store_password, "repository token": repo_token}
    leaks = {name: [o[:400] for o in outputs if _leaks(o, {name: planted[name]})] for name in _leaks(text, planted)}
    log_leaks = _leaks(_records(caplog), planted)
    assert not leaks and not log_leaks, (leaks, log_leaks)
