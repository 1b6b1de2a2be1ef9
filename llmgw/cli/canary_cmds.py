"""`llmgw canaries [--post FORGE]`: the canary rollouts the control plane knows and their verdicts, and (with --post)
each one's commit status on the forge.

The canaries come from the admin API's status document (`GET /api/v1/status`, `canaries`: a review-scope token
reads it); one line each, as `llmgw status` prints them, or the JSON. `--post github|gitlab|gitea` sets the
commit status `llmgw/canary` on each canary's settings commit (`llmgw.cli.review_posting.post_canary_statuses`:
pending while it runs, success once it held, failure once it failed), with the flags, variables and token of
`llmgw review --post` (no pull request needed). The control plane holds no forge token: a CI job runs this.
"""

from __future__ import annotations

import os

import click

from llmgw.cli.server_cmds import _client_options, _print_json


@click.command("canaries")
@click.option("--post", type=click.Choice(["github", "gitlab", "gitea"]), default=None,
              help="Also set each canary's llmgw/canary commit status on this forge (token: LLMGW_FORGE_TOKEN or the "
                   "forge's CI token, as `llmgw review --post`).")
@click.option("--forge-url", default=None, help="With --post: the forge's API root [default: from CI variables].")
@click.option("--forge-repo", default=None, help="With --post: owner/name (GitLab: project id or path).")
@_client_options
def canaries_cmd(client, as_json, post, forge_url, forge_repo):
    """The canary rollouts and their verdicts; with --post FORGE, each one's llmgw/canary commit status."""
    canaries = client.get("/api/v1/status").get("canaries", {})
    if as_json:
        _print_json(canaries)
    elif not canaries:
        click.echo("no canary rollout (a catalog model's rollout: canary starts one when a change restarts it)")
    for canary in ([] if as_json else canaries.values()):
        click.echo(canary["summary"])
    if post:
        from llmgw.cli.review_posting import forge_target, post_canary_statuses

        target = forge_target(post, dict(os.environ), api_url=forge_url, repository=forge_repo, statuses_only=True)
        for model, commit, state in post_canary_statuses(target, canaries):
            click.echo(f"posted llmgw/canary {state} on {commit[:12]} (canary of {model})", err=as_json)


def register(group: click.Group) -> None:
    """Add the commands of this module (the module docstring lists them) to `group`."""
    group.add_command(canaries_cmd)
