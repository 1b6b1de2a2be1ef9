"""Gateway workers start as `python -P -m llmgw.gateway.worker` (issue 25, item 6): a `llmgw/` directory in the
control plane's working directory does not shadow llmgw in the workers, and the workers still find the llmgw the
tests run (PYTHONPATH, or the editable install in the venv). Real worker processes."""

from __future__ import annotations

import httpx
import trio

from llmgw.gateway import GatewayWorkers


async def test_a_llmgw_directory_in_the_working_directory_does_not_shadow_the_workers_llmgw(store, tmp_path,
                                                                                             monkeypatch):
    shadow = tmp_path / "cwd" / "llmgw"
    (shadow / "gateway").mkdir(parents=True)
    for module in ("__init__.py", "gateway/__init__.py", "gateway/worker.py"):
        (shadow / module).write_text("import sys\nsys.exit('this is the shadowing llmgw/ of the working directory')\n")
    monkeypatch.chdir(tmp_path / "cwd")
    async with trio.open_nursery() as nursery:
        workers = GatewayWorkers(1, "127.0.0.1", 0, store_url=str(store.path), spool_root=tmp_path / "spools",
                                 metrics_dir=tmp_path / "metrics")
        with trio.fail_after(60):
            port = await nursery.start(workers.serve)  # raises WorkerStartError when the worker does not serve
        async with httpx.AsyncClient(timeout=30) as client:
            answer = await client.get(f"http://127.0.0.1:{port}/health")
        assert answer.status_code in (200, 503), answer.text
        nursery.cancel_scope.cancel()
