"""`llmgw validate`, `llmgw diff` (`--at REV`: llmgw.cli.replay_cmds), `llmgw repo init` and `llmgw repo hooks`: the settings repository from the command
line.

Exit codes: validate 0 valid (warnings may be printed: e.g. keys accepted, not acted on yet), 1 invalid (every error on stderr, one per line as
`file:line:column: key.path: reason`), 2 used wrongly (the directory is no settings tree, does not exist, or no
repository holds the revision). diff follows `terraform plan -detailed-exitcode`: 0 no change,
2 changes, 1 error; below the changes it names each changed key the control plane reads only when it starts
(listeners, gateway workers, store, tracing: `llmgw.settings.RESTART_ONLY`) with "run `llmgw restart`" (--json:
"restart_only", their llmgw.yaml paths).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from llmgw.errors import SettingsError, UsageError
from llmgw.settings import (
    DEFAULT_BRANCH, Settings, diff_settings, discover_repository, init_repository, install_hooks, is_not_acted_on,
    load_commit, load_directory, restart_only_changes,
)
from llmgw.settings.reading import open_repository, resolve_commit


def _discover(repo: str | None) -> str:
    start = repo or os.getcwd()
    found = discover_repository(start)
    if found is None:
        raise UsageError(f"{start} is in no git repository; give a directory, or --repo with the repository")
    return found


# Given instead of a settings tree (a source checkout of llmgw, a home directory), say so once, not once per file.
_WHAT_TO_GIVE = ("give the settings repository's directory (`llmgw repo init` makes one), or a "
                 "revision with --repo (`llmgw up` keeps its settings in .state/settings.git)")


def _names_revision(target: str) -> bool:
    """Whether the git repository around the current directory has a commit `target` (a branch such as origin/main)."""
    found = discover_repository(os.getcwd())
    if found is None:
        return False
    try:
        resolve_commit(open_repository(found), target)
    except SettingsError:
        return False
    return True


def _load(target: str, repo: str | None) -> Settings:
    """A directory when `target` is one (and --repo was not given), else a revision of the repository.

    Raises: UsageError when the directory holds neither llmgw.yaml nor catalog/ (it is no settings tree), or when
    `target` does not exist and names no revision of the repository around the current directory.
    """
    if repo is None:
        path = Path(target)
        if path.is_dir():
            if not (path / "llmgw.yaml").exists() and not (path / "catalog").is_dir():
                raise UsageError(f"{target}: is not a settings tree (it has no llmgw.yaml and no catalog/); {_WHAT_TO_GIVE}")
            return load_directory(target)
        if path.exists():
            raise UsageError(f"{target}: is a file, not a directory; {_WHAT_TO_GIVE}")
        if ("/" in target or os.sep in target) and (target.startswith(("/", "./", "../", "~")) or not _names_revision(target)):
            raise UsageError(f"{target}: no such directory; {_WHAT_TO_GIVE}")
        if not _names_revision(target):
            raise UsageError(f"{target}: no such directory, and no revision of that name in the git repository here; "
                             f"{_WHAT_TO_GIVE}")
    return load_commit(_discover(repo), target)


def _print_issues(error: SettingsError) -> None:
    errors = [i for i in error.issues if i.severity == "error"]
    for issue in error.issues:
        click.echo(str(issue), err=True)
    click.echo(f"{len(errors)} error{'s' if len(errors) != 1 else ''}", err=True)


def _issue_json(issue) -> dict:
    return {"file": issue.file, "line": issue.line, "column": issue.column, "key": issue.key_path,
            "reason": issue.message, "severity": issue.severity, "text": str(issue)}


def _not_acted_on_json(issues) -> list[dict]:
    """The keys set but not acted on yet: [{file, line, column, key}] (they are also among the issues, as warnings)."""
    return [{"file": i.file, "line": i.line, "column": i.column, "key": i.key_path} for i in issues if is_not_acted_on(i)]


@click.command("validate")
@click.argument("target", required=False, default=".")
@click.option("--repo", default=None, help="Git repository to take TARGET from as a revision (branch, tag, commit).")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"valid", "commit", "models", "projects", "issues": [{file, line, column, key, reason, '
                   'severity, text}], "not_acted_on": [{file, line, column, key}]} on stdout.')
def validate_cmd(target: str, repo: str | None, as_json: bool) -> None:
    """Check a settings tree (directory, default .) or a commit (REV with --repo); exit 1 listing every error,
    2 when TARGET is no settings tree, no directory and no revision."""
    try:
        settings = _load(target, repo)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from exc
    except SettingsError as exc:
        if as_json:
            click.echo(json.dumps({"valid": False, "issues": [_issue_json(i) for i in exc.issues],
                                   "not_acted_on": _not_acted_on_json(exc.issues)}, indent=2))
        else:
            _print_issues(exc)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps({"valid": True, "commit": settings.commit, "models": sorted(settings.models),
                               "projects": sorted(settings.projects),
                               "issues": [_issue_json(i) for i in settings.warnings],
                               "not_acted_on": _not_acted_on_json(settings.warnings)}, indent=2))
        return
    for warning in settings.warnings:
        click.echo(str(warning), err=True)
    where = f"{target} ({settings.commit[:12]})" if settings.commit else target
    counts = [_count(len(settings.models), "model"), _count(len(settings.projects), "project"),
              _count(len(settings.node_agents), "node override")]
    if settings.warnings:
        counts.append(_count(len(settings.warnings), "warning"))
    click.echo(f"{where}: valid: {', '.join(counts)}")


def _count(number: int, noun: str) -> str:
    """"1 model", "2 models"."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


@click.command("diff", context_settings={"ignore_unknown_options": False})
@click.argument("revisions", nargs=-1, metavar="OLD NEW | --live [REV] | --at REV")
@click.option("--repo", default=None, help="Git repository holding OLD and NEW when they are revisions (default: the one around the current directory).")
@click.option("--live", is_flag=True,
              help="Compare REV (default: the branch head) with the live fleet: what would start, stop or move, "
                   "and what cannot be placed and why (asks the control plane; same as `llmgw plan`).")
@click.option("--state", "state_dir", default=None, type=click.Path(path_type=Path),
              help="With --live or --at: state directory of `llmgw up` / `llmgw server` [default: .state].")
@click.option("--at", "at", is_flag=True,
              help="Plan REV against the fleet as it was when REV was applied (recorded in the audit commit of the "
                   "first pass that planned it; read from --repo, no control plane needed).")
@click.option("--json", "as_json", is_flag=True, help="Print the difference as JSON.")
@click.pass_context
def diff_cmd(ctx: click.Context, revisions: tuple[str, ...], repo: str | None, live: bool, state_dir: Path | None,
             at: bool, as_json: bool) -> None:
    """Show what changes from settings OLD to NEW (directories, commits or branches), with --live what
    REV would change on the running fleet, or with --at REV what REV changed on the fleet when it was applied. Keys read only when the control plane starts (listeners, gateway
    workers, store, tracing) are named again below, with "run `llmgw restart`".

    Exit 0: no change; 2: changes; 1: an error (invalid settings, unknown revision).
    """
    if at:
        if len(revisions) != 1 or live:
            raise click.UsageError("--at takes one settings revision: llmgw diff --at REV")
        from llmgw.cli.replay_cmds import diff_at_command

        sys.exit(diff_at_command(revisions[0], repo, state_dir, as_json))
    if live:
        if len(revisions) > 1:
            raise click.UsageError("--live takes at most one revision: llmgw diff --live [REV]")
        from llmgw.cli.server_cmds import plan_cmd

        ctx.invoke(plan_cmd, rev=revisions[0] if revisions else None, at=None, repo=None, url=None, token=None,
                   state_dir=state_dir, as_json=as_json)
        return
    if len(revisions) != 2:
        raise click.UsageError("give two settings versions: llmgw diff OLD NEW (or llmgw diff --live [REV])")
    old, new = revisions
    try:
        before, after = _load(old, repo), _load(new, repo)
    except SettingsError as exc:
        _print_issues(exc)
        sys.exit(1)
    difference = diff_settings(before, after)
    restart = restart_only_changes(before.cluster, after.cluster)
    if as_json:
        click.echo(json.dumps({**difference.to_json(), "restart_only": [c.path for c in restart]}, indent=2))
    else:
        if sys.stdout.isatty():
            _print_rich(difference)
        else:
            click.echo(difference.to_text() or "no changes", nl=not difference)
        for change in restart:
            click.echo(f"restart: {change.path} takes effect only when the control plane starts again: run "
                       "`llmgw restart` once this is applied")
    sys.exit(2 if difference else 0)


def _print_rich(difference) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console()
    if not difference:
        console.print("no changes")
        return
    styles = {"added": "green", "removed": "red", "changed": "yellow"}
    for line in difference.to_text().splitlines():
        if line.startswith(("+", "-", "~")):
            action = {"+": "added", "-": "removed", "~": "changed"}[line[0]]
            console.print(Text(line, style=f"bold {styles[action]}"))
        else:
            console.print(Text(line))


@click.group("repo")
def repo_group() -> None:
    """Settings repositories."""


@repo_group.command("init")
@click.argument("path")
@click.option("--from", "seed", default=None, help="Directory to seed the first commit from (default: the example "
              "repository, examples/cluster-repo). The schemas are added under .llmgw/schema/ for editors.")
@click.option("--notify-url", default=None, help="URL the post-receive hook POSTs to after a push (a running control plane).")
@click.option("--branch", default=DEFAULT_BRANCH, show_default=True,
              help="The settings branch: the only ref pushes may move (give `llmgw server` the same --branch).")
def repo_init_cmd(path: str, seed: str | None, notify_url: str | None, branch: str) -> None:
    """Create a bare settings repository at PATH with validating hooks: pushes may only move the settings branch
    forward, to settings that validate."""
    from llmgw.settings.packaged import example_dir

    seed_dir = Path(seed) if seed else example_dir()
    try:
        commit = init_repository(path, seed_dir, notify_url=notify_url, branch=branch)
    except SettingsError as exc:
        _print_issues(exc)
        sys.exit(1)
    click.echo(f"{path}: bare settings repository, {branch} at {commit[:12]} (seeded from {seed_dir})")


@repo_group.command("hooks")
@click.argument("path")
def repo_hooks_cmd(path: str) -> None:
    """Rewrite the git hooks of the settings repository at PATH with this llmgw's (after an upgrade)."""
    try:
        discover = discover_repository(path)
        if discover is None:
            raise UsageError(f"{path} is not a git repository; give the settings repository `llmgw repo init` made")
        install_hooks(discover)
    except OSError as exc:
        raise UsageError(f"cannot write the hooks of {path}: {exc}") from exc
    click.echo(f"{path}: pre-receive and post-receive hooks rewritten")


def register(group: click.Group) -> None:
    """Add validate, diff and repo (init, hooks) to the `llmgw` command group."""
    group.add_command(validate_cmd)
    group.add_command(diff_cmd)
    group.add_command(repo_group)
