"""`llmgw review --post FORGE`: the review as one pull-request comment, edited in place, and a commit status.

One comment per pull request: the one written by the token's own user (`GET /user`; GitHub Actions' GITHUB_TOKEN,
which may not read /user, posts as `github-actions[bot]`) whose body starts with `<!-- llmgw-review` (the
Markdown's first line) is edited; when there is none, one is created. A marker in anybody else's comment (a pull
request's author can write one first) is never edited. The commit status is named `llmgw/plan` and set on HEAD's commit.
`post_canary_statuses` (`llmgw canaries --post FORGE`) sets `llmgw/canary` on each canary's settings commit.
Blocking HTTP with httpx; every call raises `UsageError` for a refused token or an unknown pull request and
`TemporaryError` when the forge cannot be reached or answers 5xx.

Forge REST APIs, from their published descriptions:
- GitHub (docs.github.com/en/rest): `GET /user` (`login`), `GET|POST /repos/{owner}/{repo}/issues/{number}/comments` (pages via the
  `Link` header), `PATCH /repos/{owner}/{repo}/issues/comments/{id}`, `POST /repos/{owner}/{repo}/statuses/{sha}`
  with `state` error|failure|pending|success and `context`; `Authorization: Bearer`.
- GitLab (docs.gitlab.com/ee/api/notes.html, commits.html, users.html): `GET /user` (`username`), `GET|POST /projects/{id}/merge_requests/{iid}/notes`
  (pages via `X-Next-Page`), `PUT /projects/{id}/merge_requests/{iid}/notes/{note_id}`,
  `POST /projects/{id}/statuses/{sha}` with `state` pending|running|success|failed|canceled and `name`;
  `{id}` is the project id or its URL-encoded path; `PRIVATE-TOKEN` header.
- Gitea / Forgejo (their swagger, /api/swagger): `GET /user` (`login`), `GET|POST /repos/{owner}/{repo}/issues/{index}/comments` (GET
  takes no paging parameters: every comment at once),
  `PATCH /repos/{owner}/{repo}/issues/comments/{id}`, `POST /repos/{owner}/{repo}/statuses/{sha}` with `state`
  pending|success|error|failure|warning and `context`; `Authorization: token`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from llmgw.cli.review_markdown import MARKER, fenced
from llmgw.errors import LlmgwError, TemporaryError, UsageError
from llmgw.http_trust import default_verify

FORGES = ("github", "gitlab", "gitea")
STATUS_NAME = "llmgw/plan"
GITHUB_ACTIONS_LOGIN = "github-actions[bot]"
"""Who comments with a GitHub Actions GITHUB_TOKEN (which cannot read GET /user)."""
_MAX_PAGES = 50

# The verdict of `llmgw review` (its exit code) as each forge's commit status state.
_STATES = {
    "github": {0: "success", 2: "success", 3: "failure", 1: "error"},
    "gitlab": {0: "success", 2: "success", 3: "failed", 1: "failed"},
    "gitea": {0: "success", 2: "success", 3: "failure", 1: "error"},
}
_DESCRIPTIONS = {0: "no change", 2: "the change fits", 3: "some replicas cannot be placed",
                 1: "llmgw review failed"}


@dataclass(frozen=True)
class Target:
    """Where to post: `forge` one of FORGES; `api_url` the API root ("https://api.github.com",
    "https://gitlab.example.com/api/v4", "https://gitea.example.com/api/v1"); `repository` "owner/name" (GitLab:
    the project's id or path); `number` the pull request (GitLab: merge request iid); `token` the API token;
    `target_url` a link for the status (a CI run), may be empty."""

    forge: str
    api_url: str
    repository: str
    number: int
    token: str
    target_url: str = ""


@dataclass(frozen=True)
class Posted:
    """What `post_review` did: `comment_id`, `created` True for a new comment (False: edited), `state` sent."""

    comment_id: int
    created: bool
    state: str


class _Forge:
    def __init__(self, client: httpx.Client, target: Target):
        self.client, self.target = client, target

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise TemporaryError(f"{self.target.forge} at {self.target.api_url} cannot be reached ({exc})") from exc
        if response.status_code < 300:
            return response
        detail = response.text.strip()[:200]
        where = f"{self.target.forge} {method} {response.request.url.path}"
        if response.status_code in (401, 403):
            raise UsageError(f"{where} refused the token ({response.status_code}: {detail}); set "
                             f"LLMGW_FORGE_TOKEN to a token that may comment and set commit statuses")
        if response.status_code == 404:
            raise UsageError(f"{where}: not found ({detail}); check --forge-repo {self.target.repository} and "
                             f"--pr {self.target.number}")
        if response.status_code >= 500:
            raise TemporaryError(f"{where} answered {response.status_code}: {detail}")
        raise LlmgwError(f"{where} answered {response.status_code}: {detail}")

    def comments(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def whoami(self) -> str:
        """The login of the token's user (GitLab: its username), as comments name their author."""
        raise NotImplementedError

    def author(self, comment: dict[str, Any]) -> str:
        """The login (GitLab: username) of `comment`'s author, "" when it names none."""
        raise NotImplementedError

    def find(self, marker: str = MARKER) -> int | None:
        """The id of the first comment the token's own user wrote that starts with `marker`, or None."""
        me = self.whoami()
        for comment in self.comments():
            if self.author(comment) == me and str(comment.get("body") or "").startswith(marker):
                return int(comment["id"])
        return None


class _GitHubLike(_Forge):
    """GitHub and Gitea share these paths; they differ in paging, auth header and status states."""

    def base(self) -> str:
        return f"{self.target.api_url}/repos/{self.target.repository}"

    def whoami(self) -> str:
        try:
            return str(self._call("GET", f"{self.target.api_url}/user").json()["login"])
        except UsageError:
            if self.target.forge != "github":
                raise
            return GITHUB_ACTIONS_LOGIN  # an Actions GITHUB_TOKEN may not read /user; it comments as this user

    def author(self, comment: dict[str, Any]) -> str:
        return str((comment.get("user") or {}).get("login") or "")

    def comments(self) -> list[dict[str, Any]]:
        url: str | None = f"{self.base()}/issues/{self.target.number}/comments"
        if self.target.forge == "gitea":  # no paging parameters: every comment in one answer
            return list(self._call("GET", url).json())
        found: list[dict[str, Any]] = []
        params: dict[str, Any] | None = {"per_page": 100}
        for _ in range(_MAX_PAGES):
            if url is None:
                break
            response = self._call("GET", url, params=params)
            found.extend(response.json())
            url, params = response.links.get("next", {}).get("url"), None
        return found

    def create(self, body: str) -> int:
        return int(self._call("POST", f"{self.base()}/issues/{self.target.number}/comments",
                              json={"body": body}).json()["id"])

    def update(self, comment_id: int, body: str) -> None:
        self._call("PATCH", f"{self.base()}/issues/comments/{comment_id}", json={"body": body})

    def status(self, sha: str, state: str, description: str, name: str = STATUS_NAME) -> None:
        body = {"state": state, "context": name, "description": description}
        if self.target.target_url:
            body["target_url"] = self.target.target_url
        self._call("POST", f"{self.base()}/statuses/{sha}", json=body)


class _GitLab(_Forge):
    def base(self) -> str:
        return f"{self.target.api_url}/projects/{quote(self.target.repository, safe='')}"

    def whoami(self) -> str:
        return str(self._call("GET", f"{self.target.api_url}/user").json()["username"])

    def author(self, comment: dict[str, Any]) -> str:
        return str((comment.get("author") or {}).get("username") or "")

    def comments(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        page: str | None = "1"
        for _ in range(_MAX_PAGES):
            if not page:
                break
            response = self._call("GET", f"{self.base()}/merge_requests/{self.target.number}/notes",
                                  params={"per_page": 100, "page": page, "sort": "asc"})
            found.extend(response.json())
            page = response.headers.get("x-next-page") or None
        return found

    def create(self, body: str) -> int:
        return int(self._call("POST", f"{self.base()}/merge_requests/{self.target.number}/notes",
                              json={"body": body}).json()["id"])

    def update(self, comment_id: int, body: str) -> None:
        self._call("PUT", f"{self.base()}/merge_requests/{self.target.number}/notes/{comment_id}", json={"body": body})

    def status(self, sha: str, state: str, description: str, name: str = STATUS_NAME) -> None:
        body = {"state": state, "name": name, "description": description}
        if self.target.target_url:
            body["target_url"] = self.target.target_url
        self._call("POST", f"{self.base()}/statuses/{sha}", json=body)


def forge_headers(forge: str, token: str) -> dict[str, str]:
    """The headers each forge's API wants for `token`."""
    if forge == "github":
        return {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28"}
    if forge == "gitlab":
        return {"PRIVATE-TOKEN": token}
    return {"Authorization": f"token {token}", "Accept": "application/json"}


@contextmanager
def _opened_forge(target: Target, client: httpx.Client | None) -> Iterator[_GitHubLike | _GitLab]:
    """The forge API of `target` over `client` (None: a client of its own with a 30 s timeout, closed after), its
    token in the headers. Raises UsageError for a forge llmgw does not post to."""
    if target.forge not in FORGES:
        raise UsageError(f"--post takes one of {', '.join(FORGES)}, not {target.forge}")
    http = client or httpx.Client(timeout=30.0, verify=default_verify())
    try:
        http.headers.update(forge_headers(target.forge, target.token))
        yield _GitLab(http, target) if target.forge == "gitlab" else _GitHubLike(http, target)
    finally:
        if client is None:
            http.close()


def post_review(target: Target, markdown: str, exit_code: int, head_sha: str | None, *,
                client: httpx.Client | None = None) -> Posted:
    """Put `markdown` as the pull request's one llmgw comment (edit it, or create it) and, when `head_sha` is
    given, set the `llmgw/plan` status from `exit_code` (0 and 2 success, 3 failure, else error).

    `client`: an httpx.Client to use (closed by the caller); None makes one with a 30 s timeout.
    Raises: UsageError (token refused, repository or pull request unknown), TemporaryError (unreachable, 5xx),
    LlmgwError (any other answer of the forge).
    """
    with _opened_forge(target, client) as forge:
        comment_id, created = _put_comment(forge, markdown, MARKER)
        code = exit_code if exit_code in _DESCRIPTIONS else 1
        state = _STATES[target.forge][code]
        if head_sha:
            forge.status(head_sha, state, _DESCRIPTIONS[code])
        return Posted(comment_id, created, state)


def _put_comment(forge: _GitHubLike | _GitLab, markdown: str, marker: str) -> tuple[int, bool]:
    """Edit the token's user's comment that starts with `marker` to `markdown`, or create one: (its id, created)."""
    existing = forge.find(marker)
    if existing is None:
        return forge.create(markdown), True
    forge.update(existing, markdown)
    return existing, False


def post_comment(target: Target, markdown: str, marker: str, *, client: httpx.Client | None = None) -> Posted:
    """Put `markdown` (which starts with `marker`) as the pull request's one comment of that marker, edited in place
    when the token's user wrote one before; no commit status (`Posted.state` ""). Raises as `post_review`."""
    with _opened_forge(target, client) as forge:
        comment_id, created = _put_comment(forge, markdown, marker)
        return Posted(comment_id, created, "")


CANARY_STATUS_NAME = "llmgw/canary"
# A canary's phase (llmgw.control.canaries) as each forge's commit status state.
_CANARY_STATES = {
    "github": {"running": "pending", "held": "success", "failed": "failure"},
    "gitlab": {"running": "running", "held": "success", "failed": "failed"},
    "gitea": {"running": "pending", "held": "success", "failed": "failure"},
}
_DESCRIPTION_CHARS = 140  # GitHub refuses a longer status description


def post_canary_statuses(target: Target, canaries: dict[str, Any], *,
                         client: httpx.Client | None = None) -> list[tuple[str, str, str]]:
    """Set the `llmgw/canary` commit status of each canary of `canaries` (status.yaml's / `GET /api/v1/status`'s
    `canaries`: model -> {"commit", "phase", "summary", ...}) on its settings commit: pending (GitLab: running)
    while it runs, success once it held, failure (GitLab: failed) once it failed, the description its summary
    (cut to 140 characters). Returns (model, commit, state) per status set, by model. `target.number` is not used.
    Raises as `post_review`.
    """
    with _opened_forge(target, client) as forge:
        done = []
        for model, canary in sorted(canaries.items()):
            state = _CANARY_STATES[target.forge][canary["phase"]]
            summary = str(canary.get("summary") or "")
            description = summary if len(summary) <= _DESCRIPTION_CHARS else summary[:_DESCRIPTION_CHARS - 1] + "…"
            forge.status(canary["commit"], state, description, CANARY_STATUS_NAME)
            done.append((model, canary["commit"], state))
        return done


def error_markdown(head_sha: str | None, message: str) -> str:
    """The comment for a review that could not be made (exit 1): the marker, then llmgw's message verbatim."""
    return (f"{MARKER} base=- head={head_sha or '-'} fleet=- -->\n## llmgw review: failed\n\n"
            + "\n".join(fenced(message.rstrip())) + "\n")


def forge_target(forge: str, env: dict[str, str], *, api_url: str | None = None, repository: str | None = None,
                 number: int | None = None, statuses_only: bool = False) -> Target:
    """Where `--post FORGE` goes: the flags, else what the forge's CI sets in `env`.

    GitHub Actions and Gitea/Forgejo Actions: GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_REF
    ("refs/pull/<n>/merge"), GITHUB_SERVER_URL + GITHUB_RUN_ID for the status link. GitLab CI: CI_API_V4_URL,
    CI_PROJECT_ID, CI_MERGE_REQUEST_IID, CI_PIPELINE_URL. Token: LLMGW_FORGE_TOKEN, else GITHUB_TOKEN,
    GITLAB_TOKEN or GITEA_TOKEN for that forge.
    `statuses_only`: the target sets commit statuses only (no pull request: `number` 0 when not known).
    Raises: UsageError naming the flag or variable that is missing.
    """
    if forge not in FORGES:
        raise UsageError(f"--post takes one of {', '.join(FORGES)}, not {forge}")
    if forge == "gitlab":
        api_url = api_url or env.get("CI_API_V4_URL")
        repository = repository or env.get("CI_PROJECT_ID")
        iid = env.get("CI_MERGE_REQUEST_IID", "")
        number = number or (int(iid) if iid.isdigit() else None)
        link = env.get("CI_PIPELINE_URL", "")
        token = env.get("LLMGW_FORGE_TOKEN") or env.get("GITLAB_TOKEN")
        names = ("CI_API_V4_URL", "CI_PROJECT_ID", "CI_MERGE_REQUEST_IID", "GITLAB_TOKEN")
    else:
        api_url = api_url or env.get("GITHUB_API_URL") or ("https://api.github.com" if forge == "github" else None)
        repository = repository or env.get("GITHUB_REPOSITORY")
        parts = env.get("GITHUB_REF", "").split("/")
        if number is None and len(parts) == 4 and parts[:2] == ["refs", "pull"] and parts[2].isdigit():
            number = int(parts[2])
        server, run = env.get("GITHUB_SERVER_URL"), env.get("GITHUB_RUN_ID")
        link = f"{server}/{repository}/actions/runs/{run}" if server and run and repository else ""
        token = env.get("LLMGW_FORGE_TOKEN") or env.get("GITHUB_TOKEN" if forge == "github" else "GITEA_TOKEN") \
            or env.get("GITHUB_TOKEN")
        names = ("GITHUB_API_URL", "GITHUB_REPOSITORY", "GITHUB_REF", "GITHUB_TOKEN")
    missing = [f"{flag} (or {name})" for flag, name, value in zip(
        ("--forge-url", "--forge-repo", "--pr", "LLMGW_FORGE_TOKEN"), names, (api_url, repository, number, token))
        if not value and not (statuses_only and flag == "--pr")]
    if missing:
        raise UsageError(f"--post {forge} needs {', '.join(missing)}")
    return Target(forge, str(api_url).rstrip("/"), str(repository), int(number or 0), str(token), link)
