"""`llmgw forecast-check REVIEW.json`: a review's forecast against what the fleet measured once the change ran
(`llmgw.plan.forecast_check`), printed, and with `--post FORGE` put on the pull request as a comment of its own.
docs/review.md, "Checking the forecast", describes it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from llmgw.cli.review_forecast import figure, seconds_text, window
from llmgw.errors import UsageError
from llmgw.units import parse_duration

MARKER = "<!-- llmgw-forecast-check"


def _percent(error: float | None) -> str:
    return "?" if error is None else f"{error:+.0%}"


def _rate(value: float | None) -> str:
    return "?" if value is None else figure(value)


def check_markdown(review: dict, checks, load_window: float, until: str, source: str) -> str:
    """The check as Markdown for a pull-request comment: the marker (with the head commit), one row per model."""
    head = (review.get("head") or {}).get("commit") or "-"
    lines = [f"{MARKER} head={head} -->", f"## llmgw forecast check of `{head[:12]}`", "",
             f"What the replicas did over the {window(load_window)} up to {until or '(time unknown)'} ({source}), "
             f"against what the review forecast. Error: measured / forecast - 1.", "",
             "| model | requests/s at the busiest hour: forecast, measured (traffic moved) | completion tokens/s: "
             "forecast, measured (error) | TTFT p90: forecast, measured (error) |", "| --- | --- | --- | --- |"]
    for c in checks:
        lines.append(f"| `{c.model}` | {_rate(c.rate_forecast)}, {_rate(c.rate_measured)} ({_percent(c.rate_error)}) "
                     f"| {_rate(c.tokens_forecast)}, {_rate(c.tokens_measured)} ({_percent(c.tokens_error)}) | "
                     f"{seconds_text(c.ttft_p90_forecast)}, {seconds_text(c.ttft_p90_measured)} ({_percent(c.ttft_p90_error)}) |")
    if not checks:
        lines.append("| (the review forecast no model) | | | |")
    return "\n".join(lines) + "\n"


@click.command("forecast-check")
@click.argument("review_file", type=click.Path(path_type=Path))
@click.option("--window", "window_text", default="1h", show_default=True,
              help="How far back to measure (the time since the change ran, at most): 90m, 1h, 2d ...")
@click.option("--fleet", "fleet_file", type=click.Path(path_type=Path), default=None,
              help="A fleet snapshot holding the load to check against, instead of the admin API.")
@click.option("--admin", "url", default=None, help="Admin API [default: $LLMGW_ADMIN_URL or <state>/admin-url].")
@click.option("--token", default=None, help="Token for --admin (a review-scope token is enough).")
@click.option("--state", "state_dir", type=click.Path(path_type=Path), default=None,
              help="State directory of a local `llmgw up` / `llmgw server` [default: $LLMGW_STATE or .state].")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.option("--post", type=click.Choice(["github", "gitlab", "gitea"]), default=None,
              help="Also put the Markdown on the pull request as its one forecast-check comment (edited in place).")
@click.option("--forge-url", default=None, help="With --post: the forge's API root [default: from CI variables].")
@click.option("--forge-repo", default=None, help="With --post: owner/name (GitLab: project id or path).")
@click.option("--pr", "pr_number", type=int, default=None, help="With --post: the pull (merge) request number.")
def forecast_check_cmd(review_file: Path, window_text: str, fleet_file: Path | None, url: str | None,
                       token: str | None, state_dir: Path | None, as_json: bool, post: str | None,
                       forge_url: str | None, forge_repo: str | None, pr_number: int | None) -> None:
    """Compare the forecast of REVIEW_FILE (`llmgw review --json-file`) with what the fleet measured over the last
    --window: requests/s and completion tokens/s at the busiest hour, and TTFT p90, each with its error."""
    from llmgw.cli.review_cmds import _read_json
    from llmgw.plan.forecast_check import check_forecast
    from llmgw.plan.snapshot import snapshot_from_json

    try:
        seconds = parse_duration(window_text)
    except ValueError as exc:
        raise UsageError(f"--window {window_text!r}: {exc}") from None
    review = _read_json(review_file, "review")
    if not isinstance(review, dict) or not isinstance(review.get("forecast"), dict):
        raise UsageError(f"{review_file} holds no forecast: write it with `llmgw review --json-file` of this llmgw")
    if fleet_file is not None:
        data, source = _read_json(fleet_file, "fleet snapshot"), f"snapshot {fleet_file}"
    else:
        from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

        url, token = resolve_admin(url, token, state_dir)
        with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
            data = client.get("/api/v1/fleet", window=max(60, int(seconds)))
        source = f"admin API {url}"
    snapshot = snapshot_from_json(data, source)
    if snapshot.load is None:
        raise UsageError(f"{source} recorded no load (a control plane without a store?): nothing to check against")
    try:
        checks = check_forecast(review["forecast"].get("models") or [], snapshot.load)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{review_file} is not a review written by `llmgw review --json` ({exc!r})") from exc
    markdown = check_markdown(review, checks, snapshot.load.window_seconds, snapshot.load.until, source)
    click.echo(json.dumps([c.to_json() for c in checks], indent=2) if as_json else markdown, nl=as_json)
    if post is not None:
        from llmgw.cli.review_posting import forge_target, post_comment

        target = forge_target(post, dict(os.environ), api_url=forge_url, repository=forge_repo, number=pr_number)
        posted = post_comment(target, markdown, MARKER)
        click.echo(f"{target.forge} {target.repository} #{target.number}: comment {posted.comment_id} "
                   f"{'created' if posted.created else 'edited'}", err=True)


def register(group: click.Group) -> None:
    """Add forecast-check to the `llmgw` command group."""
    group.add_command(forecast_check_cmd)
