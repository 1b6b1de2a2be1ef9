"""The admin API answers as docs/admin-api.yaml says, checked by schemathesis against a running control plane.

The control plane (no agents) runs in a trio thread for the module; schemathesis reads the document from the
plane's own GET /openapi.yaml and sends valid (positive) and invalid (negative) requests for every operation,
checking: no 5xx, every status, content type and body as documented, and every invalid request refused. They carry
the admin token, but the invalid requests whose headers are what they break (a missing or wrong Authorization among
them). Until 2026-12-05 every invalid request kept the Authorization schemathesis made, so nearly all were refused
401 before the route read the parameter or body they break (about 1,050 of the coverage phase's 1,090); with the
token about 600 of them are refused 400 for that parameter or field, 220 404 and 150 409. That found the settings
edits (stop, start, a node's verb, replicas) accepting `"expect": ""` (the same as no `expect`, as null) where the
document said 40 hex: the document now says so. A hand-made mutant, GET /api/v1/history taking a `limit` over its
10,000, failed both tests; it passed both before.

POST /api/v1/restart is left out: it would restart the control plane under test. An apply is sent with `wait: false`
(a waiting apply of a fleet without agents lasts its whole timeout).

Two sources of requests:
- the fast test draws FAST_EXAMPLES requests per operation and mode with schemathesis's fuzzing phase (hypothesis,
  derandomized): random values of each parameter's type;
- the slow one (`-m slow`: run in CI and by `make test`) sends every request of schemathesis's coverage phase:
  deterministic, without hypothesis, each enum value and bound of each parameter and body property, each optional
  part present and left out, and each way of breaking them (wrong type, out of range, missing, extra), other
  methods and content types: about 1,400 requests for the 34 operations (made by
  `schemathesis.generation.drivers.CoverageGenerator`, what schemathesis's own runner uses; constraints.txt pins
  schemathesis).

The slow test drew 30 fuzzing examples per operation and mode before (1,951 requests; 150 before that): drawing them
cost about 5 ms of CPU a request (hypothesis and schemathesis's strategies, spread over every draw), more than
sending and checking one (about 3 ms), and with the fast test's they reached 77 distinct (operation, mode, status)
answers of the plane, against 80 with the coverage phase's (measured 2026-12-05: the coverage phase reaches the
refusals of valid requests for the state of the plane, 409, on serve, replicas and SLURM keys, that the 30 drawn did
not; the one answer they had that neither test has now is a 400 for a `since` too large for a date, in GET
/api/v1/usage/gpu-hours). Both tests send over one keep-alive connection pool: schemathesis opens a connection per
request otherwise. docs/testing.md has the times.

The plane's passes are not spaced (`loop.coalesce` 0; `PASS_COALESCE`, 0.25 s, in production): each apply waits for
a pass, and with the spacing each valid apply waited up to 0.25 s for it. What an apply answers does not depend on
that spacing (tests/control/test_control_loop.py checks the spacing itself, tests/control/test_admin_api.py applies
with it).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
import requests
import schemathesis
import trio
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.generation.drivers import CoverageGenerator
from schemathesis.generation.feedback import NO_FEEDBACK
from schemathesis.generation.overrides import Override
from schemathesis.specs.openapi.checks import positive_data_acceptance, unsupported_method

from llmgw.control import ControlConfig, ControlPlane

from .conftest import write_seed

FAST_EXAMPLES = 8
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


@pytest.fixture(scope="module")
def operations(admin) -> list:
    """The operations of the document the plane serves (schemathesis's APIOperation), but LEFT_OUT; read once for
    the module."""
    schema = schemathesis.openapi.from_url(f"{admin[0]}/openapi.yaml")
    found = [result.ok() for result in schema.get_all_operations()]
    return [op for op in found if (op.method.upper(), op.path) not in LEFT_OUT]


def _session() -> requests.Session:
    """One keep-alive connection pool for a test's requests (schemathesis opens a connection per request without
    one), without the environment's proxies (the plane is on loopback)."""
    session = requests.Session()
    session.trust_env = False
    return session


def _send(case, mode: GenerationMode, url: str, token: str, session: requests.Session) -> None:
    """Send `case` to the plane and check its answer against the document; raises schemathesis's failure (with a
    curl line that reproduces it) when a check fails."""
    if case.operation.path == "/api/v1/apply":
        if isinstance(case.body, dict):
            case.body["wait"] = False
        elif not isinstance(case.body, (list, str, bytes, int, float, bool)):  # no body at all
            case.body = {"wait": False} if mode is GenerationMode.POSITIVE else {"wait": "soon"}
    # A negative case whose headers are what it breaks keeps the headers schemathesis made (the Authorization among
    # them, missing or wrong: a real token put back could make the request valid again); every other case carries
    # the admin token, so that a broken query, path or body reaches the route and its refusal is checked (without
    # the token each was refused 401 before its inputs were read).
    headers = case.meta.components.get(ParameterLocation.HEADER) if case.meta is not None else None
    broken_headers = mode is GenerationMode.NEGATIVE and (headers is None or headers.mode is GenerationMode.NEGATIVE)
    auth = None if broken_headers else {"Authorization": f"Bearer {token}"}
    case.call_and_validate(base_url=url, session=session, headers=auth, timeout=30, excluded_checks=EXCLUDED)


# positive_data_acceptance: valid requests can still be refused for the state the plane is in (logs of a node
# that is not connected: 409; a join token from a plane without TLS: 409; a revision that does not exist: 400).
# missing_required_header / ignored_auth: the routes without a token (health, openapi, the loopback git hook)
# are documented as such; schemathesis's guesses at them do not apply.
# unsupported_method (the coverage phase's requests with a method the document does not list, which it wants
# answered 405): /api/v1/health answers 200 to every method and the git hook 401 to its other methods (they need
# the admin token, as every route but those two); "no 5xx" and the other checks still apply to those requests.
EXCLUDED = [positive_data_acceptance, unsupported_method]


def test_the_admin_api_answers_as_its_openapi_document_says(admin, operations):
    """FAST_EXAMPLES drawn requests per operation and mode (schemathesis's fuzzing phase, derandomized)."""
    url, token = admin
    checked = []
    with _session() as session:
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                @given(case=operation.as_strategy(generation_mode=mode))
                @settings(max_examples=FAST_EXAMPLES, deadline=None, database=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
                def check(case) -> None:
                    _send(case, mode, url, token, session)
                try:
                    check()
                except Unsatisfiable:
                    # nothing of this operation can be made invalid (no parameters, no body): positive mode covers it
                    assert mode is GenerationMode.NEGATIVE, operation.path
            checked.append(f"{operation.method.upper()} {operation.path}")
    assert len(checked) >= 13 and "POST /api/v1/join-tokens" in checked, checked


@pytest.mark.slow
def test_the_admin_api_answers_as_its_openapi_document_says_over_many_requests(admin, operations):
    """Every request of schemathesis's coverage phase: for each operation its valid requests (each enum value, each
    bound, each optional part present and left out) and its invalid ones (each parameter and property of the wrong
    type, out of its bounds, missing when required, extra; other methods; other content types)."""
    url, token = admin
    counts: Counter = Counter()
    with _session() as session:
        for operation in operations:
            generation = operation.schema.config.generation_for(operation=operation, phase="coverage")
            cases = CoverageGenerator(operation=operation, generation_modes=list(GenerationMode),
                                      generation_config=generation, auth_storage=None, override=Override(),
                                      feedback=NO_FEEDBACK)
            for case in cases:
                mode = case.meta.generation.mode
                _send(case, mode, url, token, session)
                counts[operation.path, operation.method.upper(), mode] += 1
    sent = {(path, method) for path, method, _mode in counts}
    assert len(sent) == len(operations) >= 33 and ("/api/v1/join-tokens", "POST") in sent, sorted(sent)
    for path, method in sent:  # every operation got valid and invalid requests
        assert counts[path, method, GenerationMode.POSITIVE] >= 1, (method, path)
        assert counts[path, method, GenerationMode.NEGATIVE] >= 1, (method, path)
    assert sum(counts.values()) >= 1000, sum(counts.values())
