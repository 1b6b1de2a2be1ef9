"""One store (issue 26, item 4): `llmgw keys create --state DIR` on a control plane whose store is PostgreSQL puts
the key in that PostgreSQL (it made a new SQLite file in DIR before, and the key worked on no gateway); the password
comes from the secret the settings name, found as the control plane finds it; a directory with no store is refused
with what to pass, and nothing is created there."""

from __future__ import annotations

import json

import pytest
import trio

from control.conftest import write_seed
from llmgw.cli.main import main
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository
from llmgw.store import STORE_RECORD_FILE, open_store
from store.conftest import postgres_schema, schema_url  # noqa: F401


def _cli(argv: list[str]) -> int:
    """`llmgw ARGV`'s exit status."""
    try:
        main(argv)
    except SystemExit as exited:
        return exited.code or 0
    return 0


async def _run_once(config: ControlConfig) -> None:
    plane = ControlPlane(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        nursery.cancel_scope.cancel()


def test_keys_create_with_the_state_of_a_postgresql_control_plane_lands_in_postgresql(
        tmp_path, weights_mirror, postgres_schema, capsys):  # noqa: F811
    url = schema_url(postgres_schema)
    seed = write_seed(tmp_path / "seed", weights_mirror[1])
    llmgw_yaml = seed / "llmgw.yaml"
    llmgw_yaml.write_text(llmgw_yaml.read_text() + f'store:\n  kind: postgresql\n  url: "{url}"\n'
                          "  password_secret: store-password\n")
    repo, state, secrets = tmp_path / "settings.git", tmp_path / "state", tmp_path / "secrets"
    init_repository(repo, seed)
    secrets.mkdir()
    (secrets / "store-password").write_text("not-asked-by-trust-auth\n")
    trio.run(_run_once, ControlConfig(repo=str(repo), state_dir=state, gateway=False, secrets_dir=secrets))
    record = json.loads((state / STORE_RECORD_FILE).read_text())
    assert record == {"url": url, "password_secret": "store-password", "secrets_dir": str(secrets)}

    assert _cli(["keys", "create", "--state", str(state), "--project", "chat", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    store = open_store(url)
    try:
        assert [key.key_id for key in store.list_api_keys("chat")] == [created["id"]]
        assert store.check_api_key(created["key"]).key is not None
    finally:
        store.close()
    assert not (state / "llmgw.sqlite3").exists()

    # without the secret the CLI says where the control plane reads it, and opens nothing
    (secrets / "store-password").unlink()
    assert _cli(["keys", "list", "--state", str(state)]) == 1
    err = capsys.readouterr().err
    assert "store-password" in err and "LLMGW_SECRET_STORE_PASSWORD" in err


def test_a_directory_without_a_store_is_refused_and_nothing_is_created(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["keys", "create", "--state", str(empty), "--project", "chat"],
                 ["token", "create", "--state", str(empty), "--scope", "review"],
                 ["usage", "--state", str(empty)],
                 ["store", "migrate", "--state", str(empty)],
                 ["keys", "list", "--store", str(empty / "elsewhere.sqlite3")]):
        status = _cli(argv)
        err = capsys.readouterr().err
        assert status == 1, argv
        assert "llmgw store init" in err and "--st" in err and "Traceback" not in err, (argv, err)
        assert list(empty.iterdir()) == [], argv
    assert _cli(["store", "init", "--state", str(empty)]) == 0
    assert "Created the store" in capsys.readouterr().out
    assert _cli(["keys", "create", "--state", str(empty), "--project", "chat"]) == 0
    assert (empty / "llmgw.sqlite3").is_file()
