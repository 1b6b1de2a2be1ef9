"""`llmgw review BASE HEAD` (what a settings change does to the live fleet, for a pull request) and
`llmgw fleet snapshot` (the fleet as a JSON file that `review --fleet` reads). docs/review.md describes both.

Exit codes of review: 0 no change, 2 a change that fits, 3 something cannot be placed, 1 an error (invalid
settings, unknown revision, no fleet). With `--check REVIEW.json`: 0 the stored review still holds, 4 it is stale
(what changed is printed on stderr), 1 an error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
import pygit2

from llmgw.errors import LlmgwError, SettingsError, UsageError
from llmgw.cli.server_cmds import counted

EXIT_STALE = 4


class SideNotLoading(SettingsError):
    """BASE or HEAD does not load: `side` ("HEAD my-branch") and every issue, one per line."""

    def __init__(self, side: str, issues):
        super().__init__(issues)
        self.side = side

    def __str__(self) -> str:
        return f"{self.side} does not load:\n" + "\n".join(f"  {issue}" for issue in self.issues)




def _discover(repo: str | None) -> str:
    start = repo or os.getcwd()
    found = pygit2.discover_repository(start)
    if found is None:
        raise UsageError(f"{start} is in no git repository; run in the settings repository or pass --repo")
    return found


def _load_settings(target: str, repo: str | None):
    """A directory when `target` is one (and --repo was not given), else a revision of the repository."""
    from llmgw.settings import load_commit, load_directory

    if repo is None and Path(target).is_dir():
        return load_directory(target)
    return load_commit(_discover(repo), target)


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise UsageError(f"{what} {path} is not JSON: {exc}") from exc


def _admin_snapshot(url: str | None, token: str | None, state_dir: Path | None) -> tuple[dict, str]:
    """The snapshot JSON from `GET /api/v1/fleet` and a description of where it came from."""
    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

    url, token = resolve_admin(url, token, state_dir)
    with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
        data = client.get("/api/v1/fleet")
    return data, f"admin API {url}"


def _fleet(fleet_file: Path | None, url: str | None, token: str | None, state_dir: Path | None):
    from llmgw.plan.snapshot import snapshot_from_json

    if fleet_file is not None:
        if url:
            raise click.UsageError("give the fleet one way: --fleet FILE or --admin URL, not both")
        return snapshot_from_json(_read_json(fleet_file, "fleet snapshot"), str(fleet_file)), f"snapshot {fleet_file}"
    data, source = _admin_snapshot(url, token, state_dir)
    return snapshot_from_json(data, source), source


def _write(path: Path | None, text: str) -> None:
    if path is None:
        click.echo(text, nl=False)
        return
    try:
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from exc


@click.command("review")
@click.argument("base")
@click.argument("head")
@click.option("--repo", default=None, help="Settings repository holding BASE and HEAD (default: the one around the "
              "current directory). Without it, a BASE or HEAD that is a directory is read as a settings tree.")
@click.option("--fleet", "fleet_file", type=click.Path(path_type=Path), default=None,
              help="A fleet snapshot (JSON, from `llmgw fleet snapshot`) to plan against.")
@click.option("--admin", "url", default=None, help="Admin API of the control plane to read the live fleet from "
              "[default: $LLMGW_ADMIN_URL or <state>/admin-url].")
@click.option("--token", default=None, help="Token for --admin [default: $LLMGW_ADMIN_TOKEN or <state>/admin-token].")
@click.option("--state", "state_dir", type=click.Path(path_type=Path), default=None,
              help="State directory of a local `llmgw up` / `llmgw server` [default: $LLMGW_STATE or .state].")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True,
              help="Markdown for a pull-request comment, or the JSON document.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--output", "-o", type=click.Path(path_type=Path), default=None,
              help="Write the document to this file instead of stdout.")
@click.option("--json-file", type=click.Path(path_type=Path), default=None,
              help="Also write the JSON document here (keep it to --check later).")
@click.option("--post", type=click.Choice(["github", "gitlab", "gitea"]), default=None,
              help="Also post the Markdown as the pull request's one llmgw comment (edited in place) and set the "
                   "commit status llmgw/plan on HEAD; where and with which token comes from the forge's CI "
                   "variables or the flags below and LLMGW_FORGE_TOKEN (docs/review.md).")
@click.option("--forge-url", default=None, help="With --post: the forge's API root [default: from CI variables].")
@click.option("--forge-repo", default=None, help="With --post: owner/name (GitLab: project id or path).")
@click.option("--pr", "pr_number", type=int, default=None, help="With --post: the pull (merge) request number.")
@click.option("--check", "check_file", type=click.Path(path_type=Path), default=None,
              help="Compare with a stored JSON review of BASE and HEAD instead of printing one: exit 0 when it "
                   "still holds, 4 when it is stale.")
def review_cmd(base: str, head: str, repo: str | None, fleet_file: Path | None, url: str | None, token: str | None,
               state_dir: Path | None, fmt: str, as_json: bool, output: Path | None, json_file: Path | None,
               post: str | None, forge_url: str | None, forge_repo: str | None, pr_number: int | None,
               check_file: Path | None) -> None:
    """Review the settings change from BASE to HEAD (revisions or directories) against the fleet.

    One document: the settings diff, HEAD's plan per node (replicas started, stopped, moved), what cannot be
    placed and each node's reason, GPU and CPU headroom before and after, quota and price changes per
    project, and warnings. Exit 0: no change; 2: a change that fits; 3: something cannot be placed; 1: an error.
    """
    from llmgw.plan.reviewing import review_to_json, staleness

    target = None
    if post is not None:
        from llmgw.cli.review_posting import forge_target

        target = forge_target(post, dict(os.environ), api_url=forge_url, repository=forge_repo, number=pr_number)
    try:
        review = _review(base, head, repo, fleet_file, url, token, state_dir)
    except LlmgwError as exc:
        if target is not None:
            from llmgw.cli.review_posting import error_markdown, post_review

            sha = _commit_of(head, repo)
            post_review(target, error_markdown(sha, str(exc)), 1, sha)
        raise
    document = review_to_json(review)
    if check_file is not None:
        recorded = _read_json(check_file, "stored review")
        try:
            reasons = staleness(recorded, review)
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{check_file} is not a review written by `llmgw review --json` ({exc!r})") from exc
        if reasons:
            click.echo(f"the review in {check_file} is stale:", err=True)
            for reason in reasons:
                click.echo(f"  {reason}", err=True)
            sys.exit(EXIT_STALE)
        click.echo(f"the review in {check_file} still holds (base {(review.base_commit or '-')[:12]}, "
                   f"fleet {review.fleet_revision[:19]})")
        sys.exit(0)
    from llmgw.cli.review_markdown import review_markdown

    markdown = review_markdown(review)
    if json_file is not None:
        _write(json_file, json.dumps(document, indent=2) + "\n")
    _write(output, json.dumps(document, indent=2) + "\n" if as_json or fmt == "json" else markdown)
    if target is not None:
        from llmgw.cli.review_posting import post_review

        posted = post_review(target, markdown, review.exit_code, review.head_commit)
        click.echo(f"{target.forge} {target.repository} #{target.number}: comment {posted.comment_id} "
                   f"{'created' if posted.created else 'edited'}, llmgw/plan {posted.state}", err=True)
    sys.exit(review.exit_code)


def _commit_of(rev: str, repo: str | None) -> str | None:
    """The commit id `rev` names in the settings repository, or None (a directory, or no such revision)."""
    try:
        found = pygit2.Repository(_discover(repo)).revparse_single(rev).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError, UsageError):
        return None
    return str(found.id)


def _review(base: str, head: str, repo: str | None, fleet_file: Path | None, url: str | None, token: str | None,
            state_dir: Path | None):
    """The `Review` of BASE to HEAD against the fleet. Raises SettingsError naming which side does not load."""
    from llmgw.control.reports import capacity_view
    from llmgw.plan.reviewing import build_review

    loaded = []
    for which, target in (("BASE", base), ("HEAD", head)):
        try:
            loaded.append(_load_settings(target, repo))
        except SettingsError as exc:
            raise SideNotLoading(f"{which} {target}", exc.issues) from exc
    snapshot, source = _fleet(fleet_file, url, token, state_dir)
    return build_review(loaded[0], loaded[1], snapshot, base_ref=base, head_ref=head, fleet_source=source,
                        view=capacity_view)


@click.group("fleet")
def fleet_group() -> None:
    """The fleet as the control plane sees it."""


@fleet_group.command("snapshot")
@click.option("--url", "--admin", "url", default=None, help="Admin API [default: $LLMGW_ADMIN_URL or "
              "<state>/admin-url].")
@click.option("--token", default=None, help="Admin token [default: $LLMGW_ADMIN_TOKEN or <state>/admin-token].")
@click.option("--state", "state_dir", type=click.Path(path_type=Path), default=None,
              help="State directory of a local `llmgw up` / `llmgw server` [default: $LLMGW_STATE or .state].")
@click.option("--output", "-o", type=click.Path(path_type=Path), default=None, help="Write here instead of stdout.")
def snapshot_cmd(url: str | None, token: str | None, state_dir: Path | None, output: Path | None) -> None:
    """Write the live fleet as a snapshot (JSON; the format is in docs/review.md) for `llmgw review --fleet`."""
    from llmgw.plan.snapshot import snapshot_from_json, snapshot_to_json

    data, source = _admin_snapshot(url, token, state_dir)
    snapshot = snapshot_from_json(data, source)
    _write(output, json.dumps(snapshot_to_json(snapshot), indent=2) + "\n")
    if output is not None:
        click.echo(f"{output}: {counted(len(snapshot.fleet.nodes), 'node')}, taken {snapshot.taken_at or '(time unknown)'}, "
                   f"revision {snapshot.revision[:19]}", err=True)


def register(group: click.Group) -> None:
    """Add review and fleet (snapshot) to the `llmgw` command group."""
    group.add_command(review_cmd)
    group.add_command(fleet_group)
