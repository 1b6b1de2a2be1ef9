"""`llmgw server init`: make this machine a control plane, in the layout of deploy/systemd/llmgw-server.service.

    llmgw server init [--from DIR] [--store URL] [--listen ADDRESS] [--journal PATH]

Run as root on the first machine. Each step says what it made or that it found it in place, and everything it makes
goes into the install journal first (llmgw.install), so `llmgw wipe` takes it off again:

    user llmgw                            the control plane's own unprivileged user (home: its state, no login)
    /var/lib/llmgw/server                 state (0750, llmgw): settings.git, ca/, secrets/, the store, admin-token
    /var/lib/llmgw/server/settings.git    the settings repository, seeded from --from DIR or the example
    /var/lib/llmgw/server/ca              the CA of the agents' mutual TLS (`llmgw join-token`, `node join`)
    /var/lib/llmgw/server/secrets/        named secrets (store.password_secret, hf-token, ...), 0700 llmgw
    /var/lib/llmgw/server/admin-token     the admin token (0600), its hash in the store
    /etc/llmgw/server.env                 LLMGW_SERVER_OPTIONS for the unit (read by systemd): --repo, --tls,
                                          the listeners, --store
    /etc/systemd/system/llmgw-server.service   the unit as shipped (deploy/systemd/), and a drop-in
                                          llmgw-server.service.d/llmgw.conf pointing ExecStart at this llmgw
                                          when /opt/llmgw/current (a release) is not there

Where systemd is PID 1 the unit is enabled and started; elsewhere it is written, printed, and the command that runs
the control plane by hand is shown. A second run changes nothing and says so; a file there already that differs
from what init would write (edited by hand) is left as it is, and named.
"""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import click

from llmgw.errors import UsageError

STATE = Path("/var/lib/llmgw/server")
"""The control plane's state, as deploy/systemd/llmgw-server.service has it (its StateDirectory, the user's own)."""
CONFIG = Path("/etc/llmgw")
UNITS = Path("/etc/systemd/system")
RELEASE_BIN = Path("/opt/llmgw/current/bin/llmgw")
USER = "llmgw"
UNIT = "llmgw-server.service"
DROP_IN = f"{UNIT}.d/llmgw.conf"


class _Report:
    """The steps' lines, and whether any changed something."""

    def __init__(self) -> None:
        self.changed = False

    def made(self, text: str) -> None:
        self.changed = True
        click.echo(f"made     {text}")

    def kept(self, text: str) -> None:
        click.echo(f"in place {text}")


def server_env(settings, store_url: str | None, listen: str, repo: str | None = None,
               tls_hostnames: tuple[str, ...] = ()) -> str:
    """The text of /etc/llmgw/server.env for the unit's LLMGW_SERVER_OPTIONS: the repository (`repo`, else
    <state>/settings.git), mutual TLS (with `tls_hostnames` in its certificates), the three listeners on `listen` at
    the ports of llmgw.yaml, and `--store` when given."""
    cluster = settings.cluster
    if repo and any(c in repo for c in "\"'\\$` \n"):
        raise UsageError(f"--repo {repo!r}: a URL with quotes, spaces, $ or backslashes cannot go into server.env")
    options = ["--repo", repo or str(STATE / "settings.git"), "--tls",
               "--gateway", f"{listen}:{cluster.gateway.port}", "--admin", f"{listen}:{cluster.admin.port}",
               "--agents", f"{listen}:{cluster.agents.port}"]
    for name in tls_hostnames:
        if not name or any(c in name for c in "\"'\\$` \n"):
            raise UsageError(f"--tls-hostname {name!r} is not a host name or address")
        options += ["--tls-hostname", name]
    if store_url:
        if any(c in store_url for c in "\"'\\$` \n"):
            raise UsageError(f"--store {store_url!r}: a URL with quotes, spaces, $ or backslashes cannot go into "
                             "server.env as it is; percent-encode them (a password goes in store.password_secret)")
        options += ["--store", store_url]
    return ("# Written by `llmgw server init` (docs/install.md): the options of `llmgw server` in llmgw-server.service.\n"
            f'LLMGW_SERVER_OPTIONS="{" ".join(options)}"\n')  # quoted for sh and systemd alike; split by both


def this_llmgw() -> str:
    """The command that runs this llmgw: its `llmgw` script beside the interpreter, else `python -m llmgw.cli`."""
    script = Path(sys.executable).parent / "llmgw"
    return str(script) if script.is_file() else f"{sys.executable} -m llmgw.cli"


def _chown(path: Path, uid: int, gid: int) -> None:
    """`path` and everything below it to uid:gid (links themselves, not followed)."""
    os.chown(path, uid, gid, follow_symlinks=False)
    if path.is_dir() and not path.is_symlink():
        for directory, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(directory, name), uid, gid, follow_symlinks=False)


def _write(journal, report: _Report, path: Path, text: str, mode: int, owner: tuple[int, int]) -> None:
    """Write `path` unless it holds `text` already; a different file there is left alone and named."""
    if path.is_file():
        if path.read_text() == text:
            report.kept(str(path))
        else:
            report.kept(f"{path} (differs from what init writes: left as it is; remove it and run init again to get "
                        "llmgw's)")
        return
    journal.write_file(path, text.encode(), mode=mode)
    os.chown(path, *owner)
    report.made(str(path))


def _make_dir(journal, report: _Report, path: Path, mode: int, owner: tuple[int, int]) -> bool:
    if path.is_dir():
        report.kept(str(path))
        return False
    journal.make_dirs(path, mode=mode)
    os.chown(path, *owner)
    report.made(str(path))
    return True


def run_init(seed: Path | None, store_url: str | None, listen: str, journal_path: Path | None,
             repo_url: str | None = None, ca_from: Path | None = None, secrets_from: Path | None = None,
             tls_hostnames: tuple[str, ...] = ()) -> None:
    """Every step of the module docstring, in order. A standby (`llmgw server add`): `repo_url` the shared settings
    repository (no local one is made), `ca_from` the first control plane's CA directory (copied instead of making a
    CA), `secrets_from` named secrets copied into secrets/ (the store's password). Raises UsageError when not root,
    SettingsError when the seed
    does not validate (before anything is made), StoreError when the store cannot be opened, InstallError when the
    journal cannot be written."""
    from llmgw.install import JOURNAL_PATH, CreatedDirectory, InstalledUnit, Journal, create_user, run_command
    from llmgw.install.packaged import units_dir
    from llmgw.install.users import user_exists
    from llmgw.settings import init_repository, load_directory
    from llmgw.settings.packaged import example_dir

    if os.geteuid() != 0:
        raise UsageError("llmgw server init sets this machine up (a user, /var/lib/llmgw/server, /etc/llmgw, a "
                         "systemd unit): run it as root, e.g. `sudo llmgw server init`.")
    seed_dir = seed or example_dir()
    settings = load_directory(seed_dir)  # a bad seed is refused before anything is made
    report = _Report()
    journal = Journal.open(journal_path or JOURNAL_PATH)

    if user_exists(USER):
        report.kept(f"user {USER}")
    else:
        create_user(journal, USER, home=STATE)
        report.made(f"user {USER}")
    llmgw_user = pwd.getpwnam(USER)
    owner = (llmgw_user.pw_uid, llmgw_user.pw_gid)

    _make_dir(journal, report, STATE.parent, 0o755, (0, 0))
    _make_dir(journal, report, STATE, 0o750, owner)
    _make_dir(journal, report, STATE / "secrets", 0o700, owner)
    _make_dir(journal, report, CONFIG, 0o755, (0, 0))

    if secrets_from:
        for source in sorted(p for p in secrets_from.iterdir() if p.is_file()):
            _write(journal, report, STATE / "secrets" / source.name, source.read_text(), 0o600, owner)
    repo = STATE / "settings.git"
    if repo_url:
        report.kept(f"the settings repository {repo_url} (shared with the other control planes)")
    elif repo.exists():
        report.kept(f"{repo} (the settings repository)")
    else:
        journal.record(CreatedDirectory(str(repo)))
        commit = init_repository(repo, seed_dir)
        _chown(repo, *owner)
        report.made(f"{repo}, seeded from {seed_dir} (commit {commit[:12]})")

    ca_dir = STATE / "ca"
    if ca_dir.is_dir():
        report.kept(f"{ca_dir} (the agents' CA)")
    elif ca_from:
        journal.make_dirs(ca_dir, mode=0o700)
        for source in sorted(p for p in ca_from.iterdir() if p.is_file()):
            journal.write_file(ca_dir / source.name, source.read_bytes(), mode=0o600)
        _chown(ca_dir, *owner)
        report.made(f"{ca_dir} (the agents' CA, copied from the first control plane)")
    else:
        from llmgw.wire import CertificateAuthority

        journal.make_dirs(ca_dir, mode=0o700)
        CertificateAuthority.load_or_create(ca_dir)
        _chown(ca_dir, *owner)
        report.made(f"{ca_dir} (the agents' CA)")

    token_file = STATE / "admin-token"
    if token_file.is_file() and token_file.read_text().strip():
        report.kept(f"{token_file}")
    else:
        _admin_token(journal, settings, store_url, token_file, owner)
        report.made(f"{token_file} (its hash in the store: {store_url or 'SQLite, ' + str(STATE / 'llmgw.sqlite3')})")

    _write(journal, report, CONFIG / "server.env", server_env(settings, store_url, listen, repo_url, tls_hostnames),
           0o640, (0, 0))
    _write(journal, report, UNITS / UNIT, (units_dir() / UNIT).read_text(), 0o644, (0, 0))
    if not RELEASE_BIN.exists():
        command = this_llmgw()
        _write(journal, report, UNITS / DROP_IN,
               "# Written by `llmgw server init`: no release in /opt/llmgw/current, so the llmgw that ran init.\n"
               f"[Service]\nExecStart=\nExecStart={command} server --state {STATE} $LLMGW_SERVER_OPTIONS\n",
               0o644, (0, 0))

    systemd = Path("/run/systemd/system").is_dir()
    if systemd and not any(isinstance(e, InstalledUnit) and e.name == UNIT for e in journal):
        journal.record(InstalledUnit(UNIT, enabled=True, started=True))
        for argv in (["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", UNIT]):
            done = run_command(argv)
            if done.returncode:
                raise UsageError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}; see `journalctl -u {UNIT}`, "
                                 "fix it, and run `llmgw server init` again")
        report.made(f"{UNIT} enabled and started")
    elif systemd:
        report.kept(f"{UNIT} (enabled by an earlier init)")
    _next_steps(report, systemd, settings.cluster.agents.port)


def _admin_token(journal, settings, store_url: str | None, token_file: Path, owner: tuple[int, int]) -> None:
    from llmgw.control.keys import SecretResolver
    from llmgw.store import open_store_from_settings

    store = open_store_from_settings(settings.cluster.store, STATE, SecretResolver(STATE / "secrets").get,
                                     override_url=store_url)
    try:
        token = store.create_admin_token()
    finally:
        store.close()
    for path in STATE.glob("llmgw.sqlite3*"):  # the SQLite store (and its journal files), for the user llmgw
        os.chown(path, *owner)
    journal.write_file(token_file, (token + "\n").encode(), mode=0o600)
    os.chown(token_file, *owner)


def _next_steps(report: _Report, systemd: bool, agents_port: int) -> None:
    if not report.changed:
        click.echo("nothing to do: this machine was set up already (every step above was in place).")
    if not systemd:
        click.echo(f"\nsystemd is not running here (PID 1 is {Path('/proc/1/comm').read_text().strip()}): "
                   f"{UNITS / UNIT} is written but not started. Run the control plane by hand:\n"
                   f"  set -a; . {CONFIG / 'server.env'}; set +a\n"
                   f"  runuser -u {USER} -- {this_llmgw() if not RELEASE_BIN.exists() else RELEASE_BIN} server "
                   f"--state {STATE} $LLMGW_SERVER_OPTIONS")
    click.echo(f"""
Next:
  - your admin token is in {STATE / 'admin-token'}: `llmgw status --state {STATE}` on this machine
  - settings: `git clone {STATE / 'settings.git'}`, edit, push (a push that does not validate is refused)
  - nodes: `llmgw node add HOST --release DIR --settings SETTINGS --state {STATE}` over ssh (or
    `llmgw join-token --state {STATE}` here and `llmgw node join` there); agents connect to this machine's port
    {agents_port} with mutual TLS
  - releases: `llmgw release keygen` where releases are built; its public key goes in llmgw.yaml
    releases.trusted_keys
  - take it all off again: `llmgw wipe` (it lists what init made first)""")


@click.command("init")
@click.option("--from", "seed", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Seed the settings repository from this directory [default: the example settings].")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="The store: postgresql://user@host/db (its password from llmgw.yaml store.password_secret, a "
                   "file in /var/lib/llmgw/server/secrets) [default: SQLite in /var/lib/llmgw/server].")
@click.option("--listen", default="0.0.0.0", show_default=True, metavar="ADDRESS",
              help="Address of the gateway, admin and agents' listeners (ports from llmgw.yaml).")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The install journal [default: /var/lib/llmgw-install/journal.json].")
@click.option("--repo", "repo_url", default=None, metavar="URL",
              help="A standby's shared settings repository (`llmgw server add`) [default: a new one in the state].")
@click.option("--ca-from", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Copy the agents' CA from this directory (`llmgw server add`) [default: make a new CA].")
@click.option("--secrets-from", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Copy these named secrets into the state's secrets/ (`llmgw server add`: the store's password).")
@click.option("--tls-hostname", "tls_hostnames", multiple=True, metavar="NAME",
              help="A name or address agents and admin clients dial, put in the control plane's certificates "
                   "(repeatable) [default: the --listen address; for 0.0.0.0 this machine's name and addresses].")
def init_cmd(seed: Path | None, store_url: str | None, listen: str, journal_path: Path | None,
             repo_url: str | None, ca_from: Path | None, secrets_from: Path | None, tls_hostnames: tuple[str, ...]) -> None:
    """Set this machine up as a control plane: state, CA, admin token, settings repository, store, systemd unit."""
    run_init(seed, store_url, listen, journal_path, repo_url, ca_from, secrets_from, tls_hostnames)
