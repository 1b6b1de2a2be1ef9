"""`llmgw model replicas MODEL N | --min A --max B` and `llmgw model adapter add|remove MODEL NAME`: a model's
replica count or autoscaled range, and its LoRA adapters, as commits to its catalog file on the operator's behalf,
made by the control plane (POST /api/v1/models/MODEL/replicas and /adapters: the routes the console's actions use).
`--diff` shows the change without committing it (the routes' `preview`). `llmgw model plan SOURCE`: the model
explorer (`llmgw.cli.model_plan`).
"""

from __future__ import annotations

import click

from llmgw.cli.model_plan import plan_command
from llmgw.cli.server_cmds import _client_options, _git_identity, _print_json, _short
from llmgw.errors import UsageError

AUTHOR = (click.option("--author-name", default=None, help="Commit author [default: git config user.name]."),
          click.option("--author-email", default=None, help="Commit author email [default: git config user.email]."),
          click.option("--diff", "preview", is_flag=True, help="Show the change to the settings; commit nothing."))


def _with_author(command):
    for option in reversed(AUTHOR):
        command = option(command)
    return command


def _post(client, as_json: bool, path: str, body: dict, author_name, author_email, preview: bool, what: str) -> None:
    """POST an edit route as the author; print its diff (with `preview`) or the commit it made."""
    name, email = _git_identity(author_name, author_email)
    answer = client.post(path, {**body, "author_name": name, "author_email": email, "preview": preview})
    if as_json:
        _print_json(answer)
    elif not answer["changed"]:
        click.echo(f"{what}: the settings say so already, nothing to commit (settings at {_short(answer['commit'])})")
    elif preview:
        click.echo(answer["diff"].rstrip("\n"))
    else:
        click.echo(f"{what} (settings commit {_short(answer['commit'])} by {answer.get('author')})")


def register(group: click.Group) -> None:
    """Add the `model` group: `replicas` and `adapter add|remove`."""

    @group.group("model")
    def model_group() -> None:
        """A model's replicas and LoRA adapters (commits to its catalog file as you), and where a model would fit
        (`plan`, read from its metadata)."""

    model_group.add_command(plan_command)

    @model_group.command("replicas")
    @click.argument("model")
    @click.argument("count", type=click.IntRange(0), required=False)
    @click.option("--min", "low", type=click.IntRange(0), default=None, help="Autoscale: the fewest replicas.")
    @click.option("--max", "high", type=click.IntRange(0), default=None, help="Autoscale: the most replicas.")
    @_with_author
    @_client_options
    def replicas_command(client, as_json, model, count, low, high, author_name, author_email, preview) -> None:
        """Run COUNT replicas of MODEL, or autoscale it between --min and --max (targets already set are kept)."""
        if (count is None) == (low is None or high is None) or (count is not None and (low, high) != (None, None)):
            raise UsageError("give MODEL a replica count (`llmgw model replicas MODEL 2`) or a range "
                             "(`llmgw model replicas MODEL --min 1 --max 4`), not both")
        body = {"replicas": count} if count is not None else {"min": low, "max": high}
        wanted = f"{count} replica(s)" if count is not None else f"{low} to {high} replicas"
        _post(client, as_json, f"/api/v1/models/{model}/replicas", body, author_name, author_email, preview,
              f"{model}: {wanted}")

    @model_group.group("adapter")
    def adapter_group() -> None:
        """A model's LoRA adapters (catalog `adapters:`)."""

    @adapter_group.command("add")
    @click.argument("model")
    @click.argument("name")
    @click.argument("files", nargs=-1, required=True, metavar="SOURCE=SHA256...")
    @_with_author
    @_client_options
    def add_command(client, as_json, model, name, files, author_name, author_email, preview) -> None:
        """Add adapter NAME to MODEL, its FILES each SOURCE=SHA256 (one .gguf for llama.cpp; a PEFT adapter's
        adapter_config.json and adapter_model.safetensors for vLLM)."""
        weights = []
        for item in files:
            source, _, sha256 = item.rpartition("=")
            if not source or not sha256:
                raise UsageError(f"{item!r} is not SOURCE=SHA256 (e.g. hf://org/repo@rev/a.gguf=<64 hex>)")
            weights.append({"source": source, "sha256": sha256.lower()})
        _post(client, as_json, f"/api/v1/models/{model}/adapters", {"action": "add", "name": name,
                                                                     "weights": weights},
              author_name, author_email, preview, f"{model}: adapter {name} added")

    @adapter_group.command("remove")
    @click.argument("model")
    @click.argument("name")
    @_with_author
    @_client_options
    def remove_command(client, as_json, model, name, author_name, author_email, preview) -> None:
        """Remove adapter NAME from MODEL."""
        _post(client, as_json, f"/api/v1/models/{model}/adapters", {"action": "remove", "name": name},
              author_name, author_email, preview, f"{model}: adapter {name} removed")
