"""The admin API of a running control plane (no agents): tokens, one apply at a time, errors as JSON."""

from __future__ import annotations

import json

import httpx
import trio

from llmgw.control import ControlConfig, ControlPlane


async def test_tokens_are_required_and_a_second_apply_waits_its_turn_and_says_so(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        assert (tmp_path / "state" / "admin-url").read_text().strip() == plane.admin_url
        assert (tmp_path / "state" / "admin-token").read_text().strip() == plane.admin_token
        async with httpx.AsyncClient(base_url=plane.admin_url, timeout=30) as client:
            assert (await client.get("/api/v1/status")).status_code == 401
            wrong = await client.get("/api/v1/status", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and "admin token" in wrong.json()["error"]["message"]
            # any admin token of the store works too
            other = plane.store.create_admin_token()
            assert (await client.get("/api/v1/status", headers={"Authorization": f"Bearer {other}"})).status_code == 200

            auth = {"Authorization": f"Bearer {plane.admin_token}"}
            events: dict[str, list[dict]] = {"first": [], "second": []}

            async def apply(name: str, timeout: float) -> None:
                async with client.stream("POST", "/api/v1/apply", headers=auth,
                                         json={"wait": True, "timeout": timeout, "who": name}) as response:
                    async for line in response.aiter_lines():
                        if line:
                            events[name].append(json.loads(line))

            async with trio.open_nursery() as applies:
                applies.start_soon(apply, "first", 1.5)   # no agent: tiny cannot be placed, so it times out
                await trio.sleep(0.3)
                applies.start_soon(apply, "second", 0.5)
            assert events["second"][0]["event"] == "waiting" and "first" in events["second"][0]["message"]
            first_done = [e for e in events["first"] if e["event"] == "done"][0]
            assert first_done["converged"] is False and "not converged" in first_done["message"]
            passes = [e for e in events["first"] if e["event"] == "pass"]
            assert passes and "tiny-0 cannot be placed" in passes[0]["unplaced"][0]
            assert events["first"][-1] == {"event": "end", "ok": False}

            missing = await client.get("/api/v1/logs", headers=auth, params={"node": "nowhere"})
            assert missing.status_code == 409 and "not connected" in missing.json()["error"]["message"]
            plan = await client.get("/api/v1/plan", headers=auth, params={"rev": "no-such-rev"})
            assert plan.status_code == 400 and plan.json()["error"]["type"] == "settings"
        nursery.cancel_scope.cancel()
