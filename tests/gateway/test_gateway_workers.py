"""`listeners.gateway.workers: 2`: a real `llmgw server` whose gateway is two worker processes sharing the port,
the official openai SDK as the client over loopback, the llama-server stand-in as an external endpoint.

Quotas are exact across the workers (the shared store: 20 requests per minute admit 20, not 2 x 20); a worker killed
with SIGKILL in the middle of streams loses no completed request's usage, its requests in flight are billed what
they reserved, the store's quota windows agree with the usage records, and the control plane starts the worker again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import psycopg
import pytest

from llmgw.gateway.admission import STATUS_PROCESS_LOST
from llmgw.settings import init_repository
from llmgw.store import open_store
from support.llmgw_processes import LlmgwProcesses
from support.sdk_clients import SdkClients, billing_problems
from support.waiting import wait_for
from support.serving_process import free_port
from support.settings_seed import projects_yaml, write_seed

ROOT = Path(__file__).resolve().parents[2]
FAKE_SERVER = ROOT / "tests" / "support" / "fake_llama_server.py"
RPM = 20
POSTGRES_URL = os.environ.get("LLMGW_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")

MODEL_YAML = """\
name: tiny
engine: llama.cpp
endpoints:
  - url: http://127.0.0.1:{port}
"""

PROJECTS_YAML = projects_yaml({"demo": {"models": ["tiny"], "quota": {"requests_per_minute": RPM}},
                               "bulk": {"models": ["tiny"], "quota": {"tokens_per_day": 10000000}}})


def worker_pids(server_pid: int) -> set[int]:
    """The pids of `llmgw.gateway.worker` processes whose parent is `server_pid` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server_pid and b"llmgw.gateway.worker" in cmdline:
            found.add(int(entry.name))
    return found


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """The store the server and its workers share: its SQLite file, or a fresh schema of the test PostgreSQL
    database (dropped at the end)."""
    if request.param == "sqlite":
        yield str(tmp_path / "state" / "llmgw.sqlite3")
        return
    schema = "llmgw_test_" + secrets.token_hex(6)
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}options=-csearch_path%3D{schema}"
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@contextlib.contextmanager
def workers_server(tmp_path: Path, store_url: str, gateway_port: int = 0):
    """(server process, processes, engine port) of `llmgw server` with `workers: 2` on `gateway_port` in front of the
    stand-in (50 ms between streamed tokens), on the store of `store_url`; stopped at the end."""
    engine_port = free_port()
    log = open(tmp_path / "engine.log", "wb")
    engine = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--host", "127.0.0.1", "--port", str(engine_port),
                               "-a", "tiny", "--fake-token-delay", "0.05"], stdout=log, stderr=subprocess.STDOUT)
    seed = write_seed(tmp_path / "seed", "tiny", MODEL_YAML.format(port=engine_port))
    text = (seed / "llmgw.yaml").read_text().replace(
        "gateway: {host: 127.0.0.1, port: 0}", f"gateway: {{host: 127.0.0.1, port: {gateway_port}, workers: 2}}")
    (seed / "llmgw.yaml").write_text(text)
    (seed / "projects.yaml").write_text(PROJECTS_YAML)
    repo, state = tmp_path / "settings.git", tmp_path / "state"
    init_repository(repo, seed)
    procs = LlmgwProcesses(tmp_path)
    try:
        server = procs.spawn("server", "server", "--repo", str(repo), "--state", str(state), "--admin", "127.0.0.1:0",
                             "--agents", "127.0.0.1:0", "--store", store_url)
        yield server, procs
    finally:
        procs.stop()
        engine.kill()
        engine.wait()


@pytest.fixture
def served(tmp_path, store_url):
    """(gateway base URL, state dir, server process, processes) of `workers_server` once its gateway answers."""
    with workers_server(tmp_path, store_url) as (server, procs):
        wait_for(lambda: "gateway      http" in (tmp_path / "server.log").read_text(), 90, "the server")
        url = (tmp_path / "server.log").read_text().split("gateway      ", 1)[1].split()[0]
        wait_for(lambda: httpx.get(url.removesuffix("/v1") + "/health").status_code == 200, 30, "the gateway")
        yield url, tmp_path / "state", server, procs


def test_workers_answer_from_the_settings_from_their_first_request(tmp_path):
    """Requests sent from the moment the workers accept connections are served by the settings' table: a fresh
    user's trial saw 403 project_unknown from workers that had started on an empty table."""
    store_path = tmp_path / "state" / "llmgw.sqlite3"
    store_path.parent.mkdir(parents=True)
    store = open_store(str(store_path))
    try:
        _, key = store.create_api_key("bulk")
    finally:
        store.close()
    port = free_port()
    statuses: list[int] = []
    with workers_server(tmp_path, str(store_path), port):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and 200 not in statuses:
            try:
                response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=10,
                                      headers={"Authorization": f"Bearer {key}"},
                                      json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 2})
            except httpx.TransportError:  # not listening yet
                time.sleep(0.005)
                continue
            statuses.append(response.status_code)
    assert statuses and statuses[-1] == 200, statuses
    assert 403 not in statuses, statuses


def test_quotas_are_exact_and_usage_complete_across_two_workers_with_one_killed(served, store_url):
    url, state, server, _procs = served
    store = open_store(store_url)
    try:
        _, demo_key = store.create_api_key("demo")
        _, bulk_key = store.create_api_key("bulk")
        assert len(worker_pids(server.pid)) == 2

        # 1. 30 requests on fresh connections (the kernel spreads them over both workers) against 20 per minute; the
        # limit slides (llmgw.store.quotas: the last 60 s, whichever minute of the clock), so a run across a
        # minute of the clock needs no wait, only all 30 inside 60 s
        began = time.monotonic()

        def one(_: int) -> int:
            client = openai.OpenAI(base_url=url, api_key=demo_key, max_retries=0)
            try:
                client.completions.create(model="tiny", prompt="count", max_tokens=2)
                return 200
            except openai.RateLimitError:
                return 429
            finally:
                client.close()

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(one, range(30)))
        assert time.monotonic() - began < 60, "the 30 requests took over a minute: the window let some in again"
        assert statuses.count(200) == RPM and statuses.count(429) == 30 - RPM
        spools = [state / "usage-spool" / f"worker-{k}" / "usage.spool" for k in (0, 1)]
        assert all(path.stat().st_size > 0 for path in spools)  # both workers served some
        admin = httpx.Client(base_url=(state / "admin-url").read_text().strip(), timeout=10, headers={
            "Authorization": f"Bearer {(state / 'admin-token').read_text().strip()}"})
        scrape = admin.get("/metrics").text  # one scrape counts both workers' requests
        assert f'llmgw_gateway_requests_total{{model="tiny",project="demo",status="200"}} {RPM}.0' in scrape
        assert f'llmgw_gateway_requests_total{{model="tiny",project="demo",status="429"}} {30 - RPM}.0' in scrape
        assert 'llmgw_gateway_ready_replicas{model="tiny"} 1.0' in scrape

        # 2. 12 streams in flight, one worker killed with SIGKILL under them, 12 more requests after
        victim = min(worker_pids(server.pid))
        first_chunks = concurrent.futures.ThreadPoolExecutor(12)
        started: list[concurrent.futures.Future] = []
        results: dict[int, tuple[str, str, int | None]] = {}  # index -> (request id, "done"|"broken", tokens)

        def stream(index: int, gate: concurrent.futures.Future | None) -> None:
            client = openai.OpenAI(base_url=url, api_key=bulk_key, max_retries=0)
            try:
                response = client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"stream number {index}"}], max_tokens=40,
                    stream=True, stream_options={"include_usage": True})
                request_id = response.response.headers["x-request-id"]
                tokens = None
                try:
                    for chunk in response:
                        if gate is not None and not gate.done():
                            gate.set_result(True)
                        if chunk.usage is not None:
                            tokens = chunk.usage.prompt_tokens + chunk.usage.completion_tokens
                    results[index] = (request_id, "done" if tokens is not None else "broken", tokens)
                except (openai.APIError, httpx.HTTPError):
                    results[index] = (request_id, "broken", None)
            finally:
                client.close()

        for index in range(12):
            gate: concurrent.futures.Future = concurrent.futures.Future()
            started.append(gate)
            first_chunks.submit(stream, index, gate)
        concurrent.futures.wait(started, timeout=30)
        assert all(gate.done() for gate in started)
        os.kill(victim, 9)
        first_chunks.shutdown(wait=True)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: stream(i, None), range(12, 24)))

        broken = [rid for rid, how, _ in results.values() if how == "broken"]
        done = {rid: tokens for rid, how, tokens in results.values() if how == "done"}
        assert 1 <= len(broken) < 12, results  # the victim had some of the 12 streams, the other worker the rest
        assert len(done) == 24 - len(broken)
        assert all(rid in done for rid, _how, _t in (results[i] for i in range(12, 24)))  # after the kill: all served

        # the control plane starts worker 0 or 1 again; the new one writes what the dead one left in its spool
        wait_for(lambda: len(worker_pids(server.pid)) == 2 and victim not in worker_pids(server.pid), 30,
                 "the killed worker to be started again")
        workers = wait_for(lambda: (lambda w: w if victim not in w["pids"].values() else None)(
            admin.get("/api/v1/status").json()["control_plane"]["gateway_workers"]), 30, "the status to say so")
        assert workers["workers"] == 2 and sorted(workers["restarts"].values()) == [0, 1]
        wait_for(lambda: all(store.usage_of_request(rid) is not None for rid in broken), 30,
                 "the killed worker's requests in flight to be billed")
        for rid, tokens in done.items():  # every completed request: billed what the client was told
            record = store.usage_of_request(rid)
            assert record is not None and record.status == 200
            assert record.prompt_tokens + record.completion_tokens == tokens
        for rid in broken:  # every request cut by the kill: billed what it reserved
            record = store.usage_of_request(rid)
            assert record.status == STATUS_PROCESS_LOST and record.completion_tokens == 40

        # the quota windows hold exactly what the usage records bill, and no reservation is left open
        billed = sum(r.prompt_tokens + r.completion_tokens for r in (store.usage_of_request(rid)
                                                                     for rid in [*broken, *done]))
        windows = [row for row in store.table_rows("quota_windows") if row[0] == "project:bulk" and row[1] == "day"]
        assert sum(row[4] for row in windows) == billed
        assert list(store.table_rows("quota_reservations")) == []

        # SIGTERM stops the server in order, and its workers with it
        workers_now = worker_pids(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers_now), 15, "the workers to end")
    finally:
        store.close()


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_restart_stop_start_and_sigterm_of_two_workers_lose_no_request_under_16_sdk_clients(tmp_path, store_url):
    """Two gateway workers on PostgreSQL behind one port, 16 openai SDK clients (8 streaming, retries off) asking
    throughout: `llmgw restart` (the server re-executes itself, its workers drain and start again), `llmgw stop` and
    `llmgw start`, then SIGTERM of the server. No request that had started fails; the others are refused before they
    start (connection refused while no worker listens, 503 with Retry-After while stopped or draining); every answered
    request is billed exactly once and none twice (matched by x-request-id)."""
    store = open_store(store_url)
    _, key = store.create_api_key("bulk")
    store.close()
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    state = tmp_path / "state"

    def verb(*args: str) -> None:
        # the gateway workers serve before the control plane's admin API has written its address (at the start and
        # after the re-execution of `llmgw restart`): a whole run once ran a verb in between
        wait_for(lambda: (state / "admin-url").exists(), 90, "the admin API's address")
        done = subprocess.run([sys.executable, "-m", "llmgw.cli", *args, "--state", str(state)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"llmgw {' '.join(args)}: {done.stdout}{done.stderr}"

    with workers_server(tmp_path, store_url, port) as (server, _procs):
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200, 90, "the gateway")
        clients = SdkClients(url, key, 16, model="tiny", max_tokens=12).start()
        try:
            clients.answers_after(16, 60, "before the restart")
            workers = worker_pids(server.pid)
            verb("restart")
            wait_for(lambda: len(now := worker_pids(server.pid)) == 2 and not now & workers, 90, "new workers")
            clients.answers_after(16, 90, "after the restart")
            figures = [f"restart: {clients.figures()}"]
            verb("stop")
            refused = len(clients.refused)
            wait_for(lambda: len(clients.refused) > refused, 30, "a refusal while stopped")
            verb("start")
            clients.answers_after(16, 90, "after llmgw start")
            figures.append(f"then stop/start: {clients.figures()}")
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == 0
            refused = len(clients.refused)
            wait_for(lambda: len(clients.refused) > refused, 30, "the clients meeting the closed port")
        finally:
            clients.stop()
    figures.append(f"then SIGTERM: {clients.figures()}")
    print("; ".join(figures))
    assert not clients.failed, (clients.figures(), clients.failed[:5])
    with psycopg.connect(store_url, autocommit=True) as conn:
        rows = [(rid, status) for rid, status in conn.execute(
            "SELECT client_request_id, status FROM usage WHERE client_request_id LIKE 'client-%'")]
    print(f"usage rows of the clients' requests: {len(rows)} ({sum(1 for _, s in rows if s == 200)} of status 200)")
    problems = billing_problems(clients, rows)
    assert not problems, problems[:10]
