"""Each kind of ControlMessage over an in-process link to a real `run_agent`, and the agent's answer on the wire:
what it sends back (CommandResult, ShardStatus, EngineStatus, LogLines, FabricTestOutput) and in which order, for
every body the control plane sends, for a body this agent does not know, and for a fenced command from a deposed
leader. The handlers behind them are `llmgw.agent.commands.COMMANDS`."""

from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager

import pytest
import trio

from llmgw.agent import (
    AgentConfig, commands, fabric_test, install_command, node_commands, run_agent, shard_commands, training_commands,
    upgrade_command, wiping,
)
from llmgw.agent.config import load_agent_settings
from llmgw.agent.node import Command
from llmgw.agent.fencing import FENCED_COMMANDS
from llmgw.agent.reporting import ENGINES_INSTALLABLE
from llmgw.agent.slurm import without_secrets
from llmgw.wire import control_message, pb

from agent_support import ControlSide, fake_engine_binary, next_matching, tiny_mirror, wait_for

UNKNOWN = "this agent does not understand the command None; upgrade it"

HANDLERS = {
    "start_shard": shard_commands.start_shard, "stop_shard": shard_commands.stop_shard,
    "install_engine": install_command.install_engine, "agent_settings": node_commands.agent_settings,
    "request_logs": node_commands.request_logs, "fabric_test": node_commands.fabric_test,
    "restart": node_commands.restart, "registered": node_commands.registered,
    "slurm_jobs_recorded": node_commands.slurm_jobs_recorded,
    "certificate_renewed": node_commands.certificate_renewed,
    "trust_certificates": node_commands.trust_certificates,
    "upgrade_agent": upgrade_command.upgrade_agent,
    "wipe_node": wiping.wipe_node,
    "start_training": training_commands.start_training, "cancel_training": training_commands.cancel_training,
}


def test_every_body_of_a_control_message_has_its_handler_and_every_fenced_one_is_a_command():
    bodies = {f.name for f in pb.ControlMessage.DESCRIPTOR.oneofs_by_name["body"].fields}
    assert set(commands.COMMANDS) == bodies == set(HANDLERS)
    assert FENCED_COMMANDS <= bodies


@pytest.mark.parametrize("kind", sorted(HANDLERS))
def test_the_registry_routes_each_kind_to_its_handler(kind):
    assert commands.handler_for(kind) is HANDLERS[kind]
    message = control_message(command_id="c1")
    getattr(message, kind).SetInParent()  # an empty body of that kind
    command = commands.command_of(message, link=None)
    assert (command.kind, command.id, command.body) == (kind, "c1", getattr(message, kind))


@pytest.mark.parametrize("kind", [None, "", "reboot_node"])
def test_a_kind_without_a_handler_goes_to_not_understood(kind):
    assert commands.handler_for(kind) is commands.not_understood


def _config(tmp_path, **changes) -> AgentConfig:
    mirror, _ = tiny_mirror(tmp_path / "mirror")
    values = dict(node_id="node-a", state_dir=tmp_path / "state", mirrors=(str(mirror),), heartbeat_interval=60.0,
                  engine_binaries={"llama.cpp@b1": fake_engine_binary(tmp_path)},
                  shard_drain_timeout=0.0)  # stops at once: draining is tests/agent/test_draining.py's
    values.update(changes)
    return AgentConfig(**values)


@asynccontextmanager
async def _agent(tmp_path, **changes):
    """A running agent and the control plane's end of its link, past Register: (NodeAgent, link)."""
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        agent = await nursery.start(run_agent, _config(tmp_path, **changes), control.connect)
        link = await control.links.receive()
        assert (await link.receive()).WhichOneof("body") == "register"
        yield agent, link
        nursery.cancel_scope.cancel()


def _body(message: pb.AgentMessage):
    return getattr(message, message.WhichOneof("body"))


async def _answers(link, command_id: str) -> list:
    """The bodies the agent sends (heartbeats left out) up to and including the CommandResult of `command_id`."""
    bodies = []
    with trio.fail_after(20):
        while True:
            message = await link.receive()
            if message.WhichOneof("body") == "heartbeat":
                continue
            bodies.append(_body(message))
            if message.WhichOneof("body") == "command_result" and message.command_result.command_id == command_id:
                return bodies


async def _nothing_before_next(link, sent_after: str = "probe") -> None:
    """Send a RequestLogs `sent_after` and check that its LogLines and result are the first things answered: the
    command sent before it was answered with nothing."""
    await link.send(control_message(command_id=sent_after, request_logs=pb.RequestLogs(request_id=sent_after)))
    answers = await _answers(link, sent_after)
    assert [type(a).__name__ for a in answers] == ["LogLines", "CommandResult"], answers
    assert answers[0].request_id == sent_after


def _start(tmp_path, shard_id="m-0/0", engine_version="b1") -> pb.StartShard:
    _, digest = tiny_mirror(tmp_path / "mirror")
    return pb.StartShard(shard_id=shard_id, replica_id=shard_id.split("/")[0], model="m", engine="llama.cpp",
                         engine_version=engine_version, fingerprint="fp1", replica_key="k",
                         weights=[pb.WeightsFile(source="hf://org/m@abc/m.gguf", sha256=digest)])


async def test_registered_is_logged_and_not_answered(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="llmgw.agent")
    async with _agent(tmp_path) as (_, link):
        await link.send(control_message(registered=pb.Registered(node_id="known-as-b", control_plane_version="9")))
        await _nothing_before_next(link)
    assert "registered with the control plane as known-as-b" in caplog.text


async def test_a_certificate_renewed_or_trusted_cas_sent_to_an_agent_without_tls_are_not_answered(tmp_path):
    async with _agent(tmp_path) as (agent, link):
        assert agent.renewer is None  # no --tls: nothing to renew (tests/control/test_certificate_renewal.py)
        await link.send(control_message(certificate_renewed=pb.CertificateRenewed(certificate_pem=b"x")))
        await _nothing_before_next(link)
        await link.send(control_message(trust_certificates=pb.TrustCertificates(ca_pem=b"x", signing_ca_pem=b"x")))
        await _nothing_before_next(link)


async def test_slurm_jobs_recorded_moves_the_accounting_cursor_and_is_not_answered(tmp_path):
    async with _agent(tmp_path) as (agent, link):
        await link.send(control_message(slurm_jobs_recorded=pb.SlurmJobsRecorded(until=1_700_000_000.5)))
        await _nothing_before_next(link)
        assert agent.slurm.finished_since == 1_700_000_000.5


async def test_start_shard_of_an_engine_not_installed_fails_with_a_sentence(tmp_path):
    async with _agent(tmp_path) as (_, link):
        await link.send(control_message(command_id="s1", start_shard=_start(tmp_path, engine_version="b9")))
        answers = await _answers(link, "s1")
        assert [(a.state, a.shard_id) for a in answers[:-1]] == [("pending", "m-0/0"), ("failed", "m-0/0")]
        pending, failed, result = answers
        assert pending.fingerprint == "fp1" and pending.replica_id == "m-0" and pending.model == "m"
        error = ("engine llama.cpp@b9 is not installed on node node-a; it is installed with InstallEngine "
                 "(engines.yaml) before shards can use it")
        assert failed.error == error
        assert result == pb.CommandResult(command_id="s1", ok=False, error=error)


async def test_start_shard_runs_the_engine_and_the_same_start_again_is_answered_at_once(tmp_path):
    async with _agent(tmp_path) as (agent, link):
        await link.send(control_message(command_id="s1", start_shard=_start(tmp_path)))
        answers = await _answers(link, "s1")
        assert [a.state for a in answers[:-1]][:2] == ["pending", "fetching"]
        assert answers[-1] == pb.CommandResult(command_id="s1", ok=True)
        await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status" and m.shard_status.state == "ready")
        pid = agent.supervisor.get("m-0/0").pid

        await link.send(control_message(command_id="s2", start_shard=_start(tmp_path)))  # the same fingerprint
        assert await _answers(link, "s2") == [pb.CommandResult(command_id="s2", ok=True)]
        assert agent.supervisor.get("m-0/0").pid == pid

        await wait_for(lambda: "m-0/0" not in agent.starting)  # its start has seen the engine ready
        await link.send(control_message(command_id="x1", stop_shard=pb.StopShard(shard_id="m-0/0")))
        answers = await _answers(link, "x1")
        assert [a.state for a in answers[:-1]] == ["stopping", "stopped"]
        assert answers[-1] == pb.CommandResult(command_id="x1", ok=True)
        assert agent.supervisor.get("m-0/0") is None


async def test_stop_shard_of_a_failed_shard_reports_it_stopped_and_of_an_unknown_one_succeeds(tmp_path):
    async with _agent(tmp_path) as (_, link):
        await link.send(control_message(command_id="s1", start_shard=_start(tmp_path, engine_version="b9")))
        await _answers(link, "s1")  # failed: not installed
        await link.send(control_message(command_id="x1", stop_shard=pb.StopShard(shard_id="m-0/0")))
        stopped, result = await _answers(link, "x1")
        assert (stopped.shard_id, stopped.state, stopped.error) == ("m-0/0", "stopped", "")
        assert result == pb.CommandResult(command_id="x1", ok=True)
        await link.send(control_message(command_id="x2", stop_shard=pb.StopShard(shard_id="nothing-0/0")))
        assert await _answers(link, "x2") == [pb.CommandResult(command_id="x2", ok=True)]


async def test_install_engine_of_an_installed_engine_and_of_one_this_agent_cannot_install(tmp_path):
    async with _agent(tmp_path) as (_, link):
        await link.send(control_message(command_id="i1", install_engine=pb.InstallEngine(
            engine="llama.cpp", version="b1")))
        assert await _answers(link, "i1") == [pb.EngineStatus(engine="llama.cpp@b1", state="installed"),
                                              pb.CommandResult(command_id="i1", ok=True)]

        await link.send(control_message(command_id="i2", install_engine=pb.InstallEngine(engine="tgi", version="3")))
        error = f"this agent cannot install tgi yet; it installs {', '.join(ENGINES_INSTALLABLE)}"
        assert await _answers(link, "i2") == [
            pb.EngineStatus(engine="tgi@3", state="installing", progress=0.0, progress_text="starting"),
            pb.EngineStatus(engine="tgi@3", state="failed", error=error),
            pb.CommandResult(command_id="i2", ok=False, error=error),
        ]


async def test_agent_settings_change_the_config_are_kept_and_answered(tmp_path):
    async with _agent(tmp_path) as (agent, link):
        settings = pb.AgentSettings(heartbeat_interval=2.0, labels={"zone": "z"}, fingerprint="f1")
        await link.send(control_message(command_id="c1", agent_settings=settings))
        assert await _answers(link, "c1") == [pb.CommandResult(command_id="c1", ok=True)]
        assert agent.config.heartbeat_interval == 2.0 and agent.config.labels == {"zone": "z"}
        assert load_agent_settings(tmp_path / "state") == without_secrets(settings)


NFT_STAND_IN = """#!/bin/sh
# nft as far as the agent's FirewallKeeper uses it: `list table inet llmgw` and `-f -` (one table kept in a file)
table="$(dirname "$0")/table"
if [ "$1" = list ]; then [ -f "$table" ] && cat "$table" && exit 0; echo "Error: No such file or directory" >&2; exit 1; fi
script=$(cat)
case "$script" in *REFUSED*) echo "Error: syntax error, unexpected REFUSED" >&2; exit 1;; esac
case "$script" in *"{"*) printf '%s\\n' "$script" | sed '1,2d' > "$table";; *) rm -f "$table";; esac
"""


async def test_agent_settings_with_a_firewall_table_nft_refuses_are_answered_with_nfts_message(tmp_path):
    nft = tmp_path / "bin" / "nft"
    nft.parent.mkdir()
    nft.write_text(NFT_STAND_IN)
    nft.chmod(0o755)
    table = 'table inet llmgw {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t}\n}\n'
    async with _agent(tmp_path) as (agent, link):
        agent.firewall.nft = (str(nft),)
        settings = pb.AgentSettings(fingerprint="f1", heartbeat_interval=0.2, firewall=pb.FirewallTable(text=table, digest="a" * 16))
        await link.send(control_message(command_id="c1", agent_settings=settings))
        assert await _answers(link, "c1") == [pb.CommandResult(command_id="c1", ok=True)]
        beat = await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat")
        assert beat.heartbeat.firewall == pb.FirewallReport(digest="a" * 16)

        refused = table.replace("policy accept;", "policy accept;\n\t\tREFUSED")
        settings = pb.AgentSettings(fingerprint="f2", heartbeat_interval=0.2, firewall=pb.FirewallTable(text=refused, digest="b" * 16))
        await link.send(control_message(command_id="c2", agent_settings=settings))
        error = "nft refused the table: Error: syntax error, unexpected REFUSED"
        assert await _answers(link, "c2") == [pb.CommandResult(command_id="c2", ok=False, error=error)]
        beat = await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat")
        assert beat.heartbeat.firewall == pb.FirewallReport(digest="a" * 16, error=error)  # the previous one stays
        assert (nft.parent / "table").read_text() == table

        await link.send(control_message(command_id="c3", agent_settings=pb.AgentSettings(fingerprint="f3")))
        assert await _answers(link, "c3") == [pb.CommandResult(command_id="c3", ok=True)]  # off: removed
        assert not (nft.parent / "table").exists()


async def test_request_logs_of_the_agent_of_a_shard_and_of_an_unknown_shard(tmp_path):
    async with _agent(tmp_path) as (_, link):
        await link.send(control_message(command_id="l1", request_logs=pb.RequestLogs(request_id="r1", lines=5)))
        lines, result = await _answers(link, "l1")
        assert lines.request_id == "r1" and lines.shard_id == "" and 0 < len(lines.lines) <= 5
        assert result == pb.CommandResult(command_id="l1", ok=True)

        await link.send(control_message(command_id="l2", request_logs=pb.RequestLogs(request_id="r2",
                                                                                     shard_id="gone-0/0")))
        error = "no shard 'gone-0/0' on this node; `llmgw replicas` lists the shards"
        assert await _answers(link, "l2") == [pb.LogLines(request_id="r2", shard_id="gone-0/0"),
                                              pb.CommandResult(command_id="l2", ok=False, error=error)]

        # without a command id (an older control plane) only the lines come back
        await link.send(control_message(request_logs=pb.RequestLogs(request_id="r3", lines=1)))
        message = await next_matching(link, lambda m: m.WhichOneof("body") in ("log_lines", "command_result"))
        assert message.WhichOneof("body") == "log_lines" and message.log_lines.request_id == "r3"
        await _nothing_before_next(link)


async def test_fabric_test_is_answered_with_its_output_and_no_result(tmp_path, monkeypatch):
    (tmp_path / "no-tools").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # no ib_write_bw here
    async with _agent(tmp_path) as (_, link):
        await link.send(control_message(command_id="f1", fabric_test=pb.FabricTest(
            request_id="ft", adapter="mlx5_0", port=1, timeout_seconds=5)))
        message = await next_matching(link, lambda m: m.WhichOneof("body") in ("fabric_test_output", "command_result"))
        assert message.fabric_test_output == pb.FabricTestOutput(request_id="ft", adapter="mlx5_0",
                                                                 error=fabric_test.MISSING)
        await _nothing_before_next(link)


async def test_restart_is_answered_before_the_agent_ends(tmp_path):
    control = ControlSide()
    with trio.fail_after(20):  # run_agent returns (RESTART) by itself: the nursery ends without a cancel
        async with trio.open_nursery() as nursery:
            agent = await nursery.start(run_agent, _config(tmp_path), control.connect)
            link = await control.links.receive()
            await link.receive()
            await link.send(control_message(command_id="r1", restart=pb.Restart()))
            assert await _answers(link, "r1") == [pb.CommandResult(command_id="r1", ok=True)]
    assert agent.restart_requested.is_set()


async def test_an_empty_body_is_answered_as_not_understood_and_without_a_command_id_not_at_all(tmp_path):
    async with _agent(tmp_path) as (_, link):
        await link.send(control_message(command_id="e1"))
        assert await _answers(link, "e1") == [pb.CommandResult(command_id="e1", ok=False, error=UNKNOWN)]
        await link.send(control_message())
        await _nothing_before_next(link)


async def test_not_understood_names_the_kind_it_has_no_handler_for(tmp_path):
    async with _agent(tmp_path) as (agent, link):
        await commands.not_understood(agent, Command(kind="upgrade_agent", body=None, id="u1", link=link))
        assert await _answers(link, "u1") == [pb.CommandResult(
            command_id="u1", ok=False, error="this agent does not understand the command 'upgrade_agent'; upgrade it")]


async def test_a_command_from_a_newer_control_plane_is_answered_as_not_understood(tmp_path):
    # field 99 of ControlMessage, a message this agent's protocol does not have: parsed as an unknown field
    newer = control_message(command_id="n1").SerializeToString() + bytes([0x9a, 0x06, 0x02, 0x08, 0x01])
    message = pb.ControlMessage.FromString(newer)
    assert message.command_id == "n1" and message.WhichOneof("body") is None
    async with _agent(tmp_path) as (_, link):
        await link.send(message)
        assert await _answers(link, "n1") == [pb.CommandResult(command_id="n1", ok=False, error=UNKNOWN)]


@pytest.mark.parametrize("kind", sorted(FENCED_COMMANDS))
async def test_a_fenced_command_from_a_deposed_leader_is_refused_and_not_run(tmp_path, kind):
    bodies = {"start_shard": _start(tmp_path), "stop_shard": pb.StopShard(shard_id="m-0/0"),
              "install_engine": pb.InstallEngine(engine="llama.cpp", version="b1"),
              "agent_settings": pb.AgentSettings(heartbeat_interval=9.0), "restart": pb.Restart(),
              "upgrade_agent": pb.UpgradeAgent(version="9.9.9", data=b"x", total_bytes=1, last=True),
              "wipe_node": pb.WipeNode(),
              "start_training": _job(tmp_path, "m"), "cancel_training": pb.CancelTraining(job_id="j1")}
    async with _agent(tmp_path) as (agent, link):
        await link.send(control_message(command_id="new", fencing_token=7,
                                        agent_settings=pb.AgentSettings(heartbeat_interval=2.0)))
        assert await _answers(link, "new") == [pb.CommandResult(command_id="new", ok=True)]
        await link.send(control_message(command_id="old", fencing_token=6, **{kind: bodies[kind]}))
        [result] = await _answers(link, "old")
        assert not result.ok and "token 6, older than token 7" in result.error
        assert agent.config.heartbeat_interval == 2.0 and not agent.restart_requested.is_set()
        assert agent.supervisor.get("m-0/0") is None and "m-0/0" not in agent.pending and not agent.training
        await _nothing_before_next(link)


async def test_wipe_node_undoes_the_install_journal_answers_what_it_removed_and_the_agent_stops(tmp_path):
    """WipeNode: the journal's entries (its own directory, opt/, opt/llmgw, etc/, etc/agent.env) removed (the code `llmgw wipe` runs), the CommandResult's report lists them,
    and run_agent returns "wiped" (no restart)."""
    from llmgw.install import Journal

    journal = Journal.open(tmp_path / "install" / "journal.json")
    journal.make_dirs(tmp_path / "opt" / "llmgw")
    journal.write_file(tmp_path / "etc" / "agent.env", b"X=1\n", mode=0o640)
    control = ControlSide()
    outcome = []
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            outcome.append(await run_agent(_config(tmp_path, install_journal=journal.path), control.connect))
        nursery.start_soon(run)
        link = await control.links.receive()
        assert (await link.receive()).WhichOneof("body") == "register"
        await link.send(control_message(command_id="w1", wipe_node=pb.WipeNode()))
        result = (await _answers(link, "w1"))[-1]
        with trio.fail_after(20):
            while not outcome:
                await trio.sleep(0.01)
    assert result.ok, result.error
    assert result.report[0] == f"{journal.path} lists 5 things llmgw made on this machine (newest first):"
    assert result.report[1].endswith(f"  file {tmp_path / 'etc' / 'agent.env'}")
    assert result.report[-1] == "wiped: 5 removed or restored, 0 already gone; no journal left"
    assert outcome == ["wiped"]
    assert not (tmp_path / "opt" / "llmgw").exists() and not (tmp_path / "etc" / "agent.env").exists()
    assert not journal.path.exists()


async def test_wipe_node_without_an_install_journal_is_refused_and_the_agent_goes_on(tmp_path):
    async with _agent(tmp_path, install_journal=tmp_path / "none.json") as (_, link):
        await link.send(control_message(command_id="w1", wipe_node=pb.WipeNode(keep_weights=True)))
        result = (await _answers(link, "w1"))[-1]
        assert not result.ok and result.error == (
            f"{tmp_path / 'none.json'}: no install journal on this node: llmgw was not installed here by `llmgw node "
            "add`, so there is nothing the agent can wipe; nothing was removed")
        await _nothing_before_next(link)


FAKE_TRAINER = """#!/bin/sh
# a stand-in for the training venv's python: `python -I train_lora.py JOB BASE OUT` (llmgw.training.running)
echo $$ > "$(dirname "$3")/trainer.pid"
echo 'Loading weights: 100%'
echo '{"event": "step", "step": 1, "steps": 2, "loss": 2.5, "peak_memory_bytes": 1000, "seconds": 0.1}'
grep -q '"model": "slow"' "$3" && exec sleep 60
grep -q '"model": "broken"' "$3" && { echo 'CUDA out of memory'; exit 1; }
echo '{"event": "step", "step": 2, "steps": 2, "loss": 1.0, "peak_memory_bytes": 3000, "seconds": 0.2}'
mkdir -p "$5" && echo '{"r": 4}' > "$5/adapter_config.json" && printf 'weights' > "$5/adapter_model.safetensors"
"""


def _job(tmp_path, model: str) -> pb.StartTraining:
    from llmgw.training.jobs import HyperParameters, TrainingJob

    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "config.json").write_text("{}")
    job = TrainingJob("j1", model, str(base), (("q", "a"),), hyper=HyperParameters(steps=2))
    return pb.StartTraining(job_id="j1", spec_json=job.to_json())


async def _reports(link, until: str) -> list:
    """The TrainingReport and TrainingPiece bodies the agent sends until a report in state `until`. The deadline is
    against a hang only: a job fetching Gemma's 0.5 GB base (tests/agent/test_training_base_weights.py) took over 20 s
    in a whole run at a load of 11-15."""
    seen = []
    with trio.fail_after(180):
        while True:
            message = await link.receive()
            if message.WhichOneof("body") in ("training_report", "training_piece"):
                seen.append(_body(message))
                if message.WhichOneof("body") == "training_report" and message.training_report.state == until:
                    return seen


async def test_start_training_runs_the_trainer_reports_each_step_and_sends_the_adapter_back(tmp_path):
    trainer = tmp_path / "python"
    trainer.write_text(FAKE_TRAINER)
    trainer.chmod(0o755)
    async with _agent(tmp_path, training_python=trainer) as (_, link):
        await link.send(control_message(command_id="t1", start_training=_job(tmp_path, "m")))
        seen = await _reports(link, "done")
        reports = [(r.state, r.step, r.loss, list(r.losses)) for r in seen if isinstance(r, pb.TrainingReport)]
        assert reports == [("running", 0, 0.0, []), ("running", 1, 2.5, [2.5]), ("running", 2, 1.0, [2.5, 1.0]),
                           ("sending", 2, 1.0, [2.5, 1.0]), ("done", 2, 1.0, [2.5, 1.0])]
        assert seen[-1].peak_memory_bytes == 3000
        piece = next(p for p in seen if isinstance(p, pb.TrainingPiece))
        assert (piece.name, piece.index, piece.count, piece.size) == ("adapter.tar", 0, 1, len(piece.data))

        await link.send(control_message(command_id="t2", start_training=_job(tmp_path, "broken")))
        failed = (await _reports(link, "failed"))[-1]
        assert failed.error.startswith("the training process failed (exit 1):\nLoading weights: 100%\nCUDA out of")


async def test_a_training_is_cancelled_its_process_killed_and_a_job_without_base_or_environment_is_refused(tmp_path):
    trainer = tmp_path / "python"
    trainer.write_text(FAKE_TRAINER)
    trainer.chmod(0o755)
    async with _agent(tmp_path, training_python=trainer, heartbeat_interval=0.2) as (agent, link):
        await link.send(control_message(command_id="t1", start_training=_job(tmp_path, "slow")))
        await _reports(link, "running")
        beat = await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat")
        assert list(beat.heartbeat.training_jobs) == ["j1"]  # what runs there (a restarted agent lists none)
        await wait_for(lambda: (tmp_path / "state" / "training" / "j1" / "trainer.pid").is_file(), 10)
        pid = int((tmp_path / "state" / "training" / "j1" / "trainer.pid").read_text())
        await link.send(control_message(command_id="c1", cancel_training=pb.CancelTraining(job_id="j1")))
        assert (await _answers(link, "c1"))[-1] == pb.CommandResult(command_id="c1", ok=True)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False
        await wait_for(gone, 10)
        assert "j1" not in agent.training

        no_base = _job(tmp_path, "m")
        no_base.spec_json = no_base.spec_json.replace(str(tmp_path / "base"), "/nowhere")
        await link.send(control_message(command_id="t2", start_training=no_base))
        answer = (await _answers(link, "t2"))[-1]
        assert not answer.ok and answer.error.startswith("node node-a has no base weights at /nowhere")
    async with _agent(tmp_path / "other", training_python=tmp_path / "missing") as (_, link):
        await link.send(control_message(command_id="t3", start_training=_job(tmp_path, "m")))
        answer = (await _answers(link, "t3"))[-1]
        assert not answer.ok and answer.error.startswith("node node-a has no training environment")
