"""A stand-in forge on loopback: the REST endpoints `llmgw review --post` uses, for GitHub, GitLab and Gitea.

Request and answer shapes follow the forges' published API descriptions (fields trimmed to the ones named there
for these endpoints; values made up):
- GitHub, docs.github.com/en/rest/issues/comments and /rest/commits/statuses: issue comments listed with
  `per_page` and a `Link: <...>; rel="next"` header, created (201) and edited with PATCH (200); commit statuses
  (201) with `state` in error, failure, pending, success; `Authorization: Bearer` or `token`; errors
  `{"message": ..., "documentation_url": ...}`.
- GitLab, docs.gitlab.com/ee/api/notes.html and /api/commits.html ("Set the pipeline status of a commit"):
  merge-request notes listed with `page`/`per_page` and `X-Next-Page`, created (201), edited with PUT (200);
  statuses (201) with `state` in pending, running, success, failed, canceled, skipped and `name`; the project as
  its id or URL-encoded path; `PRIVATE-TOKEN`; errors `{"message": "401 Unauthorized"}`.
- Gitea, its swagger (issueGetComments, issueCreateComment, issueEditComment, repoCreateStatus): comments all at
  once, created (201), PATCH (200); statuses (201) with `state` in pending, success, error, failure, warning;
  `Authorization: token`.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

TOKEN = "forge-token-1234"
BOT = "llmgw-bot"
"""The user TOKEN belongs to: GET /user answers it, and the comments made with TOKEN are its."""
STATES = {"github": {"error", "failure", "pending", "success"},
          "gitlab": {"pending", "running", "success", "failed", "canceled", "skipped"},
          "gitea": {"pending", "success", "error", "failure", "warning"}}


@dataclass
class Forge:
    """The state of the stand-in: comments per (repository, number), statuses per (repository, sha), requests."""

    kind: str
    page_size: int = 2
    comments: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    statuses: dict[tuple[str, str], list[dict]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    next_id: int = 100
    url: str = ""

    def seed(self, repository: str, number: int, *bodies: str) -> None:
        """Open pull request `number` of `repository` with comments by someone else."""
        self.comments[(repository, number)] = []
        for body in bodies:
            self.add(repository, number, body, "alice")

    def add(self, repository: str, number: int, body: str, login: str) -> dict:
        self.next_id += 1
        comment = {"id": self.next_id, "body": body, "created_at": "2026-12-01T02:00:00Z",
                   "updated_at": "2026-12-01T02:00:00Z"}
        if self.kind == "gitlab":
            comment.update({"type": None, "author": {"id": 1, "username": login}, "system": False,
                            "noteable_id": 9000 + number, "noteable_type": "MergeRequest", "noteable_iid": number,
                            "resolvable": False})
        else:
            comment.update({"user": {"login": login, "id": 1},
                            "html_url": f"{self.url}/{repository}/pull/{number}#issuecomment-{self.next_id}"})
        self.comments[(repository, number)].append(comment)
        return comment

    def ours(self, repository: str, number: int) -> list[dict]:
        """The llmgw comments of the pull request written with TOKEN."""
        author = "author" if self.kind == "gitlab" else "user"
        key = "username" if self.kind == "gitlab" else "login"
        return [c for c in self.comments[(repository, number)]
                if c["body"].startswith("<!-- llmgw-review") and c[author][key] == BOT]


def _handler(forge: Forge):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def answer(self, status: int, data, headers: dict[str, str] | None = None) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def error(self, status: int, message: str) -> None:
            if forge.kind == "gitlab":
                self.answer(status, {"message": message})
            else:
                self.answer(status, {"message": message, "documentation_url": "https://docs.example/rest"})

        def authorised(self) -> bool:
            if forge.kind == "gitlab":
                return self.headers.get("PRIVATE-TOKEN") == TOKEN
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            allowed = {"bearer", "token"} if forge.kind == "github" else {"token"}
            return scheme.lower() in allowed and token == TOKEN

        def body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def handle_any(self, method: str) -> None:
            url = urlparse(self.path)
            forge.requests.append((method, url.path))
            if not self.authorised():
                return self.error(401, "401 Unauthorized" if forge.kind == "gitlab" else "Bad credentials")
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            route = _GITLAB if forge.kind == "gitlab" else _GITHUB
            for pattern, verb, action in route:
                match = re.fullmatch(pattern, url.path)
                if match and verb == method:
                    return action(self, forge, *[unquote(g) for g in match.groups()], query=query)
            return self.error(404, "404 Not Found" if forge.kind == "gitlab" else "Not Found")

        def do_GET(self):  # noqa: N802
            self.handle_any("GET")

        def do_POST(self):  # noqa: N802
            self.handle_any("POST")

        def do_PATCH(self):  # noqa: N802
            self.handle_any("PATCH")

        def do_PUT(self):  # noqa: N802
            self.handle_any("PUT")

    return Handler


def _list(handler, forge: Forge, repository: str, number: str, *, query) -> None:
    key = (repository, int(number))
    if key not in forge.comments:
        return handler.error(404, "404 Not found" if forge.kind == "gitlab" else "Not Found")
    every = forge.comments[key]
    if forge.kind == "gitea":
        return handler.answer(200, every)
    size = min(int(query.get("per_page", 30)), forge.page_size)
    page = int(query.get("page", 1))
    chunk = every[(page - 1) * size: page * size]
    more = page * size < len(every)
    if forge.kind == "gitlab":
        return handler.answer(200, chunk, {"X-Page": str(page), "X-Per-Page": str(size),
                                           "X-Next-Page": str(page + 1) if more else "", "X-Total": str(len(every))})
    headers = {}
    if more:
        headers["Link"] = (f'<{forge.url}/repos/{repository}/issues/{number}/comments?per_page={size}&'
                           f'page={page + 1}>; rel="next"')
    return handler.answer(200, chunk, headers)


def _create(handler, forge: Forge, repository: str, number: str, *, query) -> None:
    key = (repository, int(number))
    if key not in forge.comments:
        return handler.error(404, "Not Found")
    body = handler.body().get("body")
    if not isinstance(body, str) or not body:
        return handler.error(400 if forge.kind == "gitlab" else 422, "body is missing")
    return handler.answer(201, forge.add(repository, int(number), body, BOT))


def _user(handler, forge: Forge, *, query) -> None:
    return handler.answer(200, {"id": 2, "username": BOT} if forge.kind == "gitlab" else {"id": 2, "login": BOT})


def _edit(handler, forge: Forge, repository: str, *ids: str, query) -> None:
    comment_id = int(ids[-1])
    for (repo, _number), comments in forge.comments.items():
        for comment in comments:
            if repo == repository and comment["id"] == comment_id:
                comment["body"] = handler.body()["body"]
                comment["updated_at"] = "2026-12-01T03:00:00Z"
                return handler.answer(200, comment)
    return handler.error(404, "Not Found")


def _status(handler, forge: Forge, repository: str, sha: str, *, query) -> None:
    data = handler.body()
    if data.get("state") not in STATES[forge.kind]:
        return handler.error(400 if forge.kind == "gitlab" else 422, f"state {data.get('state')!r} is not valid")
    name = data.get("name") or data.get("context") or "default"
    record = {"id": len(forge.statuses) + 1, "state" if forge.kind != "gitlab" else "status": data["state"],
              "description": data.get("description"), "target_url": data.get("target_url"),
              "created_at": "2026-12-01T02:00:00Z"}
    record["name" if forge.kind == "gitlab" else "context"] = name
    if forge.kind == "gitlab":
        record["sha"] = sha
    forge.statuses.setdefault((repository, sha), []).append(record)
    return handler.answer(201, record)


_REPO = r"/repos/([^/]+/[^/]+)"
_GITHUB = [
    (r"/user", "GET", _user),
    (_REPO + r"/issues/(\d+)/comments", "GET", _list),
    (_REPO + r"/issues/(\d+)/comments", "POST", _create),
    (_REPO + r"/issues/comments/(\d+)", "PATCH", _edit),
    (_REPO + r"/statuses/([0-9a-f]{40})", "POST", _status),
]
_PROJECT = r"/projects/([^/]+)"
_GITLAB = [
    (r"/user", "GET", _user),
    (_PROJECT + r"/merge_requests/(\d+)/notes", "GET", _list),
    (_PROJECT + r"/merge_requests/(\d+)/notes", "POST", _create),
    (_PROJECT + r"/merge_requests/(\d+)/notes/(\d+)", "PUT", _edit),
    (_PROJECT + r"/statuses/([0-9a-f]{40})", "POST", _status),
]


class running_forge:
    """`with running_forge("github") as forge:` serves `forge` on 127.0.0.1 (port 0) in a thread; `forge.url`
    is its API root (GitLab's ends in /api/v4, Gitea's in /api/v1, as on the real ones)."""

    def __init__(self, kind: str):
        self.forge = Forge(kind)

    def __enter__(self) -> Forge:
        prefix = {"github": "", "gitlab": "/api/v4", "gitea": "/api/v1"}[self.forge.kind]
        handler = _handler(self.forge)
        outer = handler

        class Prefixed(outer):
            def handle_any(self, method: str) -> None:
                if not self.path.startswith(prefix):
                    return self.error(404, "Not Found")
                self.path = self.path[len(prefix):] or "/"
                return super().handle_any(method)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Prefixed)
        self.forge.url = f"http://127.0.0.1:{self.server.server_address[1]}{prefix}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self.forge

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
