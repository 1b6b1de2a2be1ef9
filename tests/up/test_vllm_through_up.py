"""The example catalog's gemma-3-270m-vllm served on the real vLLM through the product's own path, under `llmgw up`.

`llmgw up` runs on a copy of examples/cluster-repo (the entry at `replicas: 0`, as `make up` serves it); the test
pushes the README's one settings commit (`replicas: 1`) and checks what a user would: the agent takes the vLLM
`make vllm` installed in the cache (handed to it by `llmgw up` as its vllm@0.32.0, as the llama-server build is),
fetches the converted Gemma from the mirror by sha256 into its weights cache, starts vLLM with the command line it
builds (KV events to its own listener, the hashing seed) and reports it ready; the official openai SDK gets answers
through the gateway; the engine's KV-cache events reach the control plane and a repeated long prefix is routed
precisely (`llmgw_gateway_routing_decisions_total{kind="precise"}` grows); killing vLLM makes the agent kill what is
left of it and start it again, the gateway answering 503 with Retry-After meanwhile, then serving again.

The real vLLM takes minutes to start on 2 cores, and this test starts it twice (the kill), so it holds the run's one
vLLM slot (`vllm_slot`, tests/support/vllm_slot.py): the gateway's real-vLLM tests (run before it) have their vLLM
stopped first. Nothing is skipped: `make vllm`'s set-up is done here when it is missing (cached).

The test machine's choice, as the shared test vLLM's (tests/gateway/vllm_harness.py): `llmgw up` runs with
`VLLM_ENABLE_V1_MULTIPROCESSING=0` (`UP_ENV`), which its agent's engines inherit (`engine_environment`: the agent's
own environment, then the shard's). vLLM's CPU platform then keeps its one-process executor: the model worker runs
inside the EngineCore instead of a third spawned process importing torch and vLLM again (about 18 s of CPU a start,
twice here). The product's command line is unchanged, and the engine runs on one OpenMP thread either way (the
entry's `cpu_cores: 0.5` gives `OMP_NUM_THREADS=1`). vLLM's OpenAI server still runs its EngineCore as a process of
its own (`AsyncLLM` always makes the multiprocess client), so the kill still leaves it for the agent to kill: checked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
import trio
from test_up import REPO_ROOT, UpProcess, ask, wait_until

from llmgw.engines.installing import default_cache_dir
from llmgw.engines.vllm_demo import GEMMA_HF_FILES, ensure_gemma_hf, ensure_vllm, fill_mirror

sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
from settings_seed import git  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m-vllm"
REPLICA = f"{MODEL}-0"
START_LIMIT = 600  # seconds for vLLM to serve after the commit: over 420 s at a load of 10 on 2 shared cores
UP_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # the test machine's choice (the module's docstring)


@contextmanager
def running_up(root: Path) -> Iterator[UpProcess]:
    """`llmgw up` on a copy of examples/cluster-repo under `root`, stopped (engines included) on exit."""
    seed = root / "cluster-repo"
    # not `quick_seed`: no gain measured here, where vLLM's two starts take the time (87-134 s a run either way)
    shutil.copytree(REPO_ROOT / "examples" / "cluster-repo", seed)
    process = UpProcess(root / "state", seed, env=UP_ENV)
    try:
        yield process
    finally:
        if process.process.poll() is None:
            process.process.send_signal(signal.SIGINT)
            try:
                process.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.process.kill()


@pytest.fixture
def up(vllm_slot, tmp_path, llama_server_binary, gemma_mirror):
    """`make vllm`'s set-up (cached), then `llmgw up` holding the run's vLLM slot."""
    began = time.monotonic()
    cache = default_cache_dir()
    fill_mirror(cache, ensure_gemma_hf(cache, trio.run(ensure_vllm, cache)))
    print(f"\nmake vllm's set-up ready in {time.monotonic() - began:.0f} s")
    return vllm_slot.take("llmgw up", lambda: running_up(tmp_path))


def nodes(state: Path) -> dict:
    return json.loads(ask("nodes", "--json", state=state).stdout)["nodes"]


def vllm_shard(state: Path) -> dict:
    """The status document's entry for the vLLM replica's shard (state, pid, restarts, error)."""
    for node in nodes(state).values():
        for shard in node["shards"].values():
            if shard["replica"] == REPLICA:
                return shard
    return {}


def precise_decisions(state: Path) -> float:
    """`llmgw_gateway_routing_decisions_total{model=MODEL, kind="precise"}` from the admin listener's /metrics."""
    url = (state / "admin-url").read_text().strip()
    token = (state / "admin-token").read_text().strip()
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    pattern = re.compile(r'^llmgw_gateway_routing_decisions_total\{([^}]*)\} (\S+)$', re.MULTILINE)
    return sum(float(value) for labels, value in pattern.findall(text)
               if f'model="{MODEL}"' in labels and 'kind="precise"' in labels)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def process_title(pid: int) -> str:
    """`pid`'s command line as one string ("" once it is gone): vLLM retitles its processes (`VLLM::EngineCore`)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return ""


def test_the_example_vllm_entry_serves_through_llmgw_up_routes_on_its_kv_events_and_comes_back_after_a_kill(
        up, tmp_path):
    base = up.wait_for(r"gateway\s+(http://\S+/v1)", timeout=600).group(1)
    key = up.wait_for(r"API key\s+(sk-llmgw-\S+)", timeout=30).group(1)
    up.wait_for(r"vLLM\s+/\S+/bin/python", timeout=5)  # `llmgw up` found make vllm's install

    # The README's commit: replicas 0 -> 1.
    clone = tmp_path / "settings"
    git("clone", "-q", str(up.state / "settings.git"), str(clone), cwd=tmp_path)
    entry = clone / "catalog" / f"{MODEL}.yaml"
    entry.write_text(entry.read_text().replace("\nreplicas: 0\n", "\nreplicas: 1\n", 1))
    git("commit", "-qam", f"serve {MODEL} on vLLM", cwd=clone)
    git("push", "-q", "origin", "HEAD", cwd=clone)
    pushed = time.monotonic()
    up.wait_for(rf"{REPLICA}\s+ready", timeout=START_LIMIT)
    print(f"{REPLICA} ready {time.monotonic() - pushed:.0f} s after the push")
    assert not any("make vllm" in line for line in up.lines)  # the set-up is there: no hint

    # The agent verified the converted files into its own cache and started vLLM from them, reporting its KV events.
    weights = up.state / "agent" / "weights" / "sha256"
    assert all((weights / digest).is_file() for digest in GEMMA_HF_FILES.values())
    pid = wait_until(lambda: vllm_shard(up.state).get("pid"), 30, "the agent to report the engine's pid")
    relay = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    assert relay[1:4] == ["-P", "-m", "llmgw.engines.relay"]  # the shard's process is vLLM's relay (issue 25)
    argv = relay[relay.index("--") + 1:]
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--model") + 1].startswith(str(up.state / "agent" / "weights" / "models"))
    assert "--kv-events-config" in argv and argv[argv.index("--served-model-name") + 1] == MODEL

    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                          max_tokens=12, temperature=0)
    assert chat.model == MODEL and chat.choices[0].message.content and chat.usage.completion_tokens > 0
    text = client.completions.create(model=MODEL, prompt="The old lighthouse on the hill", max_tokens=12,
                                     temperature=0).choices[0].text
    assert text
    print(f"chat: {chat.choices[0].message.content!r}; completion: {text!r}")

    # vLLM's port takes nothing without the replica key: its relay refuses every path, also those vLLM itself
    # answers without a key (issue 25: /invocations, /tokenize, /pooling, /score, /rerank, /classify).
    listen = relay[relay.index("--listen") + 1]
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1}
    for path in ("/invocations", "/tokenize", "/pooling", "/score", "/rerank", "/classify", "/v1/completions",
                 "/v1/models", "/health"):
        refused = httpx.post(f"http://{listen}{path}", json=body, timeout=30)
        assert refused.status_code == 401, (path, refused.status_code, refused.text[:200])

    # A long prefix, repeated: once vLLM's events for it reach the gateway, it is routed precisely.
    before = precise_decisions(up.state)
    prefix = f"{uuid.uuid4()} " + "A lighthouse keeper counts the waves every night. " * 40  # over 3 blocks
    deadline = time.monotonic() + 60
    asked = 0
    while precise_decisions(up.state) == before:
        assert time.monotonic() < deadline, f"no precise routing decision after {asked} requests"
        client.completions.create(model=MODEL, prompt=f"{prefix} Wave {asked}:", max_tokens=1)
        asked += 1
    print(f"precise after {asked} requests sharing the prefix")

    # Kill vLLM: the agent kills what is left of its group (the EngineCore) and starts it again; meanwhile the
    # gateway answers 503 with Retry-After (or, before the agent's report arrives, a 502 naming the model).
    assert any(process_title(member).startswith("VLLM::EngineCore") for member in group_members(pid))
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    outcomes: list[tuple[int, str | None, str | None]] = []
    answer = None
    while answer is None:
        assert time.monotonic() - killed_at < START_LIMIT, f"not serving again after the kill; {outcomes[-5:]}"
        try:
            answer = client.completions.create(model=MODEL, prompt="The old lighthouse on the hill", max_tokens=12,
                                               temperature=0)
        except openai.APIStatusError as refused:
            outcomes.append((refused.status_code, (refused.body or {}).get("code"),
                             refused.response.headers.get("retry-after")))
            time.sleep(0.5 if refused.status_code == 503 else 0.1)
    back = time.monotonic() - killed_at
    unavailable = [o for o in outcomes if o[0] == 503]
    print(f"serving again {back:.0f} s after the kill; {len(outcomes)} refusals, first ones {outcomes[:3]}")
    assert unavailable and all(code == "model_not_ready" and retry for _s, code, retry in unavailable)
    assert {status for status, _c, _r in outcomes} <= {502, 503}
    assert answer.choices[0].text == text  # the same greedy answer from the restarted engine
    assert not group_members(pid)  # nothing of the killed engine is left
    restarted = wait_until(lambda: (s := vllm_shard(up.state)).get("pid") not in (None, pid) and s, 30,
                           "the restarted engine's pid")
    assert restarted["state"] == "ready" and restarted["restarts"] >= 1
