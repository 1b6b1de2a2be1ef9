"""The admin API's scoped tokens and checked inputs on a running control plane (no agents): a review token reads
plan, fleet and status and nothing else; wrong query parameters and body fields are 400s naming the field; a
join token lives at most 7 days; a webhook signature of any bytes is a 401, never a 500."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import httpx
import pytest
import trio

from llmgw.control import ControlConfig, ControlPlane
from llmgw.errors import UsageError
from llmgw.wire import CertificateAuthority


async def _with_plane(tmp_path, settings_repo, check) -> None:
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        async with httpx.AsyncClient(base_url=plane.admin_url, timeout=30) as client:
            await check(plane, client)
        nursery.cancel_scope.cancel()


async def test_a_review_token_reads_plan_fleet_and_status_and_nothing_else(tmp_path, settings_repo):
    async def check(plane, client):
        _record, review = plane.store.create_token("review")
        _record, metrics = plane.store.create_token("metrics")
        as_review = {"Authorization": f"Bearer {review}"}
        for path in ("/api/v1/plan", "/api/v1/fleet", "/api/v1/status"):
            assert (await client.get(path, headers=as_review)).status_code == 200, path
            assert (await client.get(path, headers={"Authorization": f"Bearer {metrics}"})).status_code == 401
        for method, path in (("GET", "/api/v1/history"), ("GET", "/api/v1/nodes"), ("POST", "/api/v1/stop"),
                             ("POST", "/api/v1/apply"), ("POST", "/api/v1/join-tokens")):
            refused = await client.request(method, path, headers=as_review, json={})
            assert refused.status_code == 401, (method, path)
            assert f"this token is of scope review; {method} {path} needs an admin token: pass --token" in \
                refused.json()["error"]["message"]  # the token is good, its scope is not (it said only "needed")
        # a store token of scope admin passes everything, and a revoked one nothing
        record, admin = plane.store.create_token("admin")
        assert (await client.get("/api/v1/history", headers={"Authorization": f"Bearer {admin}"})).status_code == 200
        plane.store.revoke_token(record.token_id)
        assert (await client.get("/api/v1/status", headers={"Authorization": f"Bearer {admin}"})).status_code == 401

    await _with_plane(tmp_path, settings_repo, check)


async def test_wrong_admin_api_inputs_are_400s_naming_the_field(tmp_path, settings_repo):
    async def check(plane, client):
        auth = {"Authorization": f"Bearer {plane.admin_token}"}

        async def refused(method, path, field, **kwargs):
            answer = await client.request(method, path, headers=auth, **kwargs)
            assert answer.status_code == 400, (path, kwargs, answer.text)
            error = answer.json()["error"]
            assert error["param"] == field and field in error["message"], error

        await refused("GET", "/api/v1/history", "limit", params={"limit": "abc"})
        await refused("GET", "/api/v1/history", "limit", params={"limit": "-1"})
        await refused("GET", "/api/v1/history", "limit", params={"limit": "9" * 30})
        await refused("GET", "/api/v1/logs", "lines", params={"node": "n1", "lines": "abc"})
        for ttl in ('"abc"', "Infinity", "-Infinity", "NaN", "0", "-5", "true", "null", str(8 * 24 * 3600)):
            await refused("POST", "/api/v1/join-tokens", "ttl_seconds", content=f'{{"ttl_seconds": {ttl}}}')
        await refused("POST", "/api/v1/apply", "timeout", json={"timeout": "soon"})
        await refused("POST", "/api/v1/apply", "wait", json={"wait": "yes"})
        await refused("POST", "/api/v1/stop", "author_name", json={"author_name": ["x"]})
        await refused("POST", "/api/v1/restart", "control_plane", json={"control_plane": 1})
        # in range and well typed passes the check (this plane has no TLS: the join token itself is a 409)
        week = await client.post("/api/v1/join-tokens", headers=auth, json={"ttl_seconds": 7 * 24 * 3600})
        assert week.status_code == 409 and "--tls" in week.json()["error"]["message"]

    await _with_plane(tmp_path, settings_repo, check)


async def test_a_non_ascii_webhook_signature_is_a_401_not_a_500(tmp_path, settings_repo):
    async def check(plane, client):
        for signature in ("sha256=é".encode(), b"\xff\xfe", b"sha256=" + b"0" * 64):
            answer = await client.post("/api/v1/hooks/git", content=b"{}",
                                       headers=[(b"X-Hub-Signature-256", signature)])
            assert answer.status_code == 401 and answer.json()["error"]["type"] == "bad_signature", signature

    await _with_plane(tmp_path, settings_repo, check)


@pytest.mark.parametrize("ttl", [0.0, -1.0, math.inf, math.nan, 7 * 24 * 3600.0 + 1])
def test_a_join_token_lives_at_most_seven_days(tmp_path, ttl):
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    with pytest.raises(UsageError, match="7 days"):
        ca.create_join_token(ttl)
    assert ca.create_join_token(7 * 24 * 3600.0).startswith(ca.create_join_token(1.0)[:6])


def test_llmgw_token_creates_lists_and_revokes_scoped_tokens(tmp_path):
    def llmgw(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "llmgw.cli", "token", *args, "--state", str(tmp_path)],
                              capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))

    import json

    # Only `llmgw store init` makes an empty store (issue 26): the token commands refuse a directory without one.
    subprocess.run([sys.executable, "-m", "llmgw.cli", "store", "init", "--state", str(tmp_path)], check=True,
                   capture_output=True)
    made = llmgw("create", "--scope", "review", "--name", "ci", "--json")
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["token"].startswith("llmgw-review-") and created["scope"] == "review"
    plain = llmgw("create", "--scope", "metrics")
    assert plain.returncode == 0 and plain.stdout.startswith("llmgw-metrics-")
    assert "only time the token is shown" in plain.stderr
    listed = llmgw("list", "--json")
    assert [(t["scope"], t["state"]) for t in json.loads(listed.stdout)] == [("review", "active"),
                                                                             ("metrics", "active")]
    assert created["token"] not in listed.stdout and plain.stdout.strip() not in listed.stdout
    table = llmgw("list")
    assert created["id"] in table.stdout and "review" in table.stdout
    assert llmgw("revoke", created["id"]).returncode == 0
    assert json.loads(llmgw("list", "--scope", "review", "--json").stdout)[0]["state"] == "revoked"
    wrong = llmgw("create", "--scope", "root")
    assert wrong.returncode != 0 and "admin" in wrong.stderr and "console" in wrong.stderr
