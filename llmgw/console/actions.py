"""The console's actions: what a form of the console asks, as the admin-API request that does it.

Every action that changes the cluster is a settings commit made by the admin API's edit routes
(`llmgw.control.admin_edits`) as the person logged in, the routes the CLI uses, so there is one YAML writer. The
console sends each twice: first with `"preview": true` (the diff is shown to confirm, nothing is committed), then,
when the person confirms, with `"expect"`: the head the diff was made against (someone who pushed meanwhile makes
it a 409, and nothing is committed).

    request_of(form, login) -> ActionRequest      pure: the form's fields in, the route, body and a title out

Forms name the action in `action`; the other fields are the action's (see ACTIONS). Raises `ActionError` (400 with a
sentence naming the field) for a form that is not one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from llmgw.console.sessions import Login

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A node id, model or adapter name as it may appear in a route's path."""
FORM_FIELDS = ("action", "node", "model", "replicas", "min", "max", "name", "weights", "email", "key", "engine",
               "gpus", "gpu_class", "tensor_parallel", "cpu_cores", "memory_bytes", "back")
"""The fields an action form may carry; the confirmation form repeats them (hidden), with `expect`."""


class ActionError(ValueError):
    """A console form that is no action the console knows, or a field of it that is wrong: `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ActionRequest:
    """The admin-API request of an action: POST `path` with `body`; `title` says what it does, for people."""

    path: str
    body: dict[str, Any]
    title: str


def _field(form: Mapping[str, str], name: str, pattern: re.Pattern[str] | None = None) -> str:
    value = str(form.get(name) or "").strip()
    if not value:
        raise ActionError(name, f"the form's field {name!r} is empty: fill it in")
    if pattern is not None and not pattern.fullmatch(value):
        raise ActionError(name, f"the form's field {name!r} is {value[:60]!r}: use letters, digits, '.', '_' or '-'")
    return value


def _count(form: Mapping[str, str], name: str) -> int:
    value = _field(form, name)
    if not value.isdigit() or len(value) > 5:
        raise ActionError(name, f"the form's field {name!r} is {value[:20]!r}: give a whole number, 0 or more")
    return int(value)


def _weights(form: Mapping[str, str], directories: bool = False) -> list[dict[str, str]]:
    """`weights`: one file a line, "SOURCE SHA256" (with `directories`, a directory source ending in "/" alone)."""
    files = []
    for number, line in enumerate(_field(form, "weights").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if directories and len(parts) == 1 and parts[0].endswith("/"):
            files.append({"source": parts[0], "sha256": ""})
            continue
        if len(parts) != 2:
            raise ActionError("weights", f"line {number} of the adapter's files is {line.strip()[:80]!r}: write one "
                                         "file a line, its source then its sha256, separated by a space")
        files.append({"source": parts[0], "sha256": parts[1].lower()})
    return files


def _node(verb: str) -> Callable[[Mapping[str, str], Login], ActionRequest]:
    def build(form: Mapping[str, str], login: Login) -> ActionRequest:
        node = _field(form, "node", _NAME)
        return ActionRequest(f"/api/v1/nodes/{quote(node)}/{verb}", {}, f"{verb.capitalize()} node {node}")

    return build


def _serving(stop: bool) -> Callable[[Mapping[str, str], Login], ActionRequest]:
    def build(form: Mapping[str, str], login: Login) -> ActionRequest:
        return ActionRequest(f"/api/v1/{'stop' if stop else 'start'}", {},
                             "Stop serving: every replica stops" if stop else "Start serving again")

    return build


def _replicas(form: Mapping[str, str], login: Login) -> ActionRequest:
    model, count = _field(form, "model", _NAME), _count(form, "replicas")
    return ActionRequest(f"/api/v1/models/{quote(model)}/replicas", {"replicas": count},
                         f"Run {count} replica{'s' if count != 1 else ''} of {model}")


def _replica_range(form: Mapping[str, str], login: Login) -> ActionRequest:
    model, low, high = _field(form, "model", _NAME), _count(form, "min"), _count(form, "max")
    return ActionRequest(f"/api/v1/models/{quote(model)}/replicas", {"min": low, "max": high},
                         f"Autoscale {model} between {low} and {high} replicas")


def _adapter(add: bool) -> Callable[[Mapping[str, str], Login], ActionRequest]:
    def build(form: Mapping[str, str], login: Login) -> ActionRequest:
        model, name = _field(form, "model", _NAME), _field(form, "name", _NAME)
        body: dict[str, Any] = {"action": "add" if add else "remove", "name": name}
        if add:
            body["weights"] = _weights(form)
        return ActionRequest(f"/api/v1/models/{quote(model)}/adapters", body,
                             f"{'Add' if add else 'Remove'} LoRA adapter {name} {'to' if add else 'from'} {model}")

    return build


def _serve(form: Mapping[str, str], login: Login) -> ActionRequest:
    """A new model (the model explorer's serve form): a GPU model when `gpus` is more than 0, else a CPU one."""
    model, engine = _field(form, "model", _NAME), _field(form, "engine", _NAME)
    body: dict[str, Any] = {"engine": engine, "weights": _weights(form, directories=True),
                            "replicas": _count(form, "replicas")}
    gpus = _count(form, "gpus") if form.get("gpus") else 0
    if gpus:
        body.update(gpus=gpus, gpu_class=_field(form, "gpu_class", _NAME),
                    tensor_parallel=_count(form, "tensor_parallel") if form.get("tensor_parallel") else gpus)
        where = f"{gpus} x {body['gpu_class']}"
    else:
        cores = str(form.get("cpu_cores") or "").strip()
        try:
            body["cpu_cores"] = float(cores)
        except ValueError:
            raise ActionError("cpu_cores", f"the form's field 'cpu_cores' is {cores[:20]!r}: give a number of cores, "
                                           "e.g. 2 or 0.5") from None
        if form.get("memory_bytes"):
            body["memory_bytes"] = _bytes(form, "memory_bytes")
        where = f"{cores} cores"
    return ActionRequest(f"/api/v1/models/{quote(model)}/serve", body,
                         f"Serve {model} on {engine}: {body['replicas']} replica(s) of {where}")


def _bytes(form: Mapping[str, str], name: str) -> int:
    value = _field(form, name)
    if not value.isdigit() or len(value) > 16:
        raise ActionError(name, f"the form's field {name!r} is {value[:20]!r}: give a size in bytes")
    return int(value)


def _ssh_key(add: bool) -> Callable[[Mapping[str, str], Login], ActionRequest]:
    def build(form: Mapping[str, str], login: Login) -> ActionRequest:
        # a member's keys are their own: the e-mail is the login's, whatever the form says
        email = login.person if login.role == "member" and login.person else _field(form, "email")
        key = " ".join(_field(form, "key").split())
        shown = key.split(" ")[-1] if len(key.split(" ")) > 2 else key[:40]
        return ActionRequest("/api/v1/slurm/users/keys", {"action": "add" if add else "remove", "email": email,
                                                          "keys": [key]},
                             f"{'Add' if add else 'Remove'} SSH key {shown} {'to' if add else 'from'} {email}")

    return build


ACTIONS: dict[str, Callable[[Mapping[str, str], Login], ActionRequest]] = {
    "stop": _serving(True), "start": _serving(False),
    "cordon": _node("cordon"), "uncordon": _node("uncordon"), "drain": _node("drain"),
    "replicas": _replicas, "replica-range": _replica_range,
    "adapter-add": _adapter(True), "adapter-remove": _adapter(False),
    "ssh-key-add": _ssh_key(True), "ssh-key-remove": _ssh_key(False),
    "serve": _serve,
}
"""Each action's name (a form's `action`) and how its request is built from the form's fields."""


def request_of(form: Mapping[str, str], login: Login) -> ActionRequest:
    """The admin-API request the action form `form` asks for, as `login` (a member's SSH keys are their own).
    Raises ActionError naming the field that is missing or wrong. Pure."""
    action = str(form.get("action") or "")
    build = ACTIONS.get(action)
    if build is None:
        raise ActionError("action", f"the form asks for the action {action[:40]!r}, which the console does not know "
                                    f"(it knows: {', '.join(ACTIONS)})")
    return build(form, login)


def back_of(form: Mapping[str, str]) -> str:
    """Where to go after the action: the form's `back` when it is a console page, else the cluster's page."""
    back = str(form.get("back") or "")
    return back if back.startswith("/console/") and "//" not in back and "\\" not in back else "/console/"
