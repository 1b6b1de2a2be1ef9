"""The admin API answers as docs/admin-api.yaml says, checked by schemathesis against a running control plane.

The control plane (no agents) runs in a trio thread for the module; schemathesis reads the document from the
plane's own GET /openapi.yaml and sends generated requests, valid (positive) and invalid (negative) ones, with the
admin token, checking: no 5xx, every status, content type and body as documented. FAST_EXAMPLES per operation and
mode in the fast suite; SLOW_EXAMPLES under `-m slow` (run in CI, and by `make test`). POST /api/v1/restart is left
out: it would restart the control plane under test. An apply is sent with `wait: false` (a waiting apply of a fleet
without agents lasts its whole timeout).

SLOW_EXAMPLES is 30 (it was 150): 30 valid and 30 invalid requests for each of the 17 operations, about 1,000 in
all, ~0.5 s per example count on the 2-core machine. The operations' inputs are small (a few enums, numbers, names
and flat JSON bodies), and by 30 schemathesis has drawn each parameter's kinds and bounds and each way of breaking
them (wrong type, out of range, missing, extra); the other 120 cost 60 s and drew more of the same.

The plane's passes are not spaced (`loop.coalesce` 0; `PASS_COALESCE`, 0.25 s, in production): each apply waits for
a pass, and with the spacing each of the SLOW_EXAMPLES valid applies waited up to 0.25 s for it. What an apply
answers does not depend on that spacing (tests/control/test_control_loop.py checks the spacing itself,
tests/control/test_admin_api.py applies with it).
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
import schemathesis
import trio
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from llmgw.control import ControlConfig, ControlPlane

from .conftest import write_seed

FAST_EXAMPLES = 8
SLOW_EXAMPLES = 30
LEFT_OUT = {("POST", "/api/v1/restart")}
DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "admin-api.yaml"


@pytest.fixture(scope="module")
def admin(tmp_path_factory):
    """(admin URL, admin token) of a control plane without agents, served from a trio thread."""
    from llmgw.settings import init_repository

    root = tmp_path_factory.mktemp("admin-openapi")
    repo = root / "settings.git"
    init_repository(repo, write_seed(root / "seed", "ab" * 32))
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=root / "state"))
    plane.loop.coalesce = 0.0  # an apply's pass at once (see the module docstring)
    ready = threading.Event()
    box: dict = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            box.update(token=trio.lowlevel.current_trio_token(), scope=nursery.cancel_scope)
            ready.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(60), "the control plane did not start"
    yield plane.admin_url, plane.admin_token
    trio.from_thread.run_sync(box["scope"].cancel, trio_token=box["token"])
    thread.join(10)


def test_the_served_document_is_docs_admin_api_yaml_and_every_route_is_in_it(admin):
    url, _token = admin
    served = httpx.get(f"{url}/openapi.yaml")
    assert served.status_code == 200 and served.headers["content-type"] == "application/yaml"
    assert served.content == DOCUMENT.read_bytes()
    from llmgw.control import admin as admin_module

    paths = yaml.safe_load(served.content)["paths"]
    for line in admin_module.__doc__.splitlines():
        words = line.split()
        if len(words) > 1 and words[0] in ("GET", "POST") and words[1].startswith("/api/"):
            for path in words[1:]:
                if path.startswith("/api/"):
                    assert path.split("?")[0] in paths, path


def _run(admin, examples: int) -> None:
    url, token = admin
    schema = schemathesis.openapi.from_url(f"{url}/openapi.yaml")
    checked = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in LEFT_OUT:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def check(case) -> None:
                if operation.path == "/api/v1/apply":
                    if isinstance(case.body, dict):
                        case.body["wait"] = False
                    elif not isinstance(case.body, (list, str, bytes, int, float, bool)):  # no body at all
                        case.body = {"wait": False} if mode is GenerationMode.POSITIVE else {"wait": "soon"}
                # negative cases keep the Authorization schemathesis made (missing or wrong: one of their violations
                # may be that header, and a real token put back would make the request valid again)
                auth = {"Authorization": f"Bearer {token}"} if mode is GenerationMode.POSITIVE else None
                case.call_and_validate(base_url=url, headers=auth, timeout=30, excluded_checks=EXCLUDED)
            try:
                check()
            except Unsatisfiable:
                # nothing of this operation can be made invalid (no parameters, no body): positive mode covers it
                assert mode is GenerationMode.NEGATIVE, operation.path
        checked.append(f"{operation.method.upper()} {operation.path}")
    assert len(checked) >= 13 and "POST /api/v1/join-tokens" in checked, checked


# positive_data_acceptance: valid requests can still be refused for the state the plane is in (logs of a node
# that is not connected: 409; a join token from a plane without TLS: 409; a revision that does not exist: 400).
# missing_required_header / ignored_auth: the routes without a token (health, openapi, the loopback git hook)
# are documented as such; schemathesis's guesses at them do not apply.
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

EXCLUDED = [positive_data_acceptance]


def test_the_admin_api_answers_as_its_openapi_document_says(admin):
    _run(admin, FAST_EXAMPLES)


@pytest.mark.slow
def test_the_admin_api_answers_as_its_openapi_document_says_over_many_requests(admin):
    _run(admin, SLOW_EXAMPLES)
