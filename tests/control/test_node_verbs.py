"""`llmgw node cordon|uncordon|drain` and `llmgw slurm lend|reclaim`, run as real processes against a running
control plane with an in-process agent: each is a settings commit by the operator, and the fleet follows."""

from __future__ import annotations

import pygit2
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane

from .conftest import stand_in_agent, write_seed
from .test_cli_over_admin_api import llmgw
from .test_in_process_fleet import replica_states, wait_for

SLURM_YAML = "enabled: false\ncontroller: n1\nnodes:\n  n1: {partition: batch}\npartitions:\n  batch: {}\n"
WHO = ("--author-name", "Ada", "--author-email", "ada@example.com")


async def test_node_verbs_are_commits_and_a_lent_node_gives_up_its_replica(tmp_path, weights_mirror, fake_engine):
    from llmgw.settings import init_repository

    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha)
    (seed / "agents" / "nodes").mkdir()
    (seed / "agents" / "nodes" / "n1.yaml").write_text("{}\n")
    (seed / "slurm.yaml").write_text(SLURM_YAML)
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(run_agent, agent, plane.local_connector())
        code, out, err = await llmgw(plane, "apply", "--timeout", "30")
        assert code == 0, out + err

        code, out, err = await llmgw(plane, "node", "drain", "n1", *WHO)
        assert code == 0 and "n1 drained" in out, err
        head = pygit2.Repository(str(repo)).references["refs/heads/main"].peel(pygit2.Commit)
        assert head.message == "llmgw node drain n1\n" and head.author.name == "Ada"
        code, out, _ = await llmgw(plane, "nodes")
        assert code == 0 and out.splitlines()[0].startswith("n1") and out.splitlines()[0].endswith("(drained)"), out
        code, out, _ = await llmgw(plane, "plan")
        assert "drained" in out  # no room elsewhere: the replica keeps serving, and the plan says why
        await wait_for(lambda: plane.status()["replicas"]["tiny-0"].get("unplaced", {}).get("n1", "").startswith(
            "drained"), 10, "the drained node named in the replica's status")  # the pass after the commit
        replica = plane.status()["replicas"]["tiny-0"]
        assert replica["shards"]["tiny-0/0"]["state"] == "ready"  # still serving: no room elsewhere

        code, out, err = await llmgw(plane, "node", "uncordon", "n1", *WHO)
        assert code == 0 and "n1 uncordoned" in out, err
        head = pygit2.Repository(str(repo)).references["refs/heads/main"].target
        code, out, err = await llmgw(plane, "node", "uncordon", "n1", *WHO)  # already so: said, nothing committed
        assert code == 0 and "n1 was already uncordoned: nothing to commit" in out, err
        assert pygit2.Repository(str(repo)).references["refs/heads/main"].target == head
        code, out, err = await llmgw(plane, "slurm", "lend", "n1", *WHO)
        assert code == 0 and "n1 lent to Slurm" in out, err
        await wait_for(lambda: "ready" not in replica_states(plane).values(), 30, "the lent node's replica stopped")

        code, out, _ = await llmgw(plane, "status")
        assert "lent to Slurm: n1" in out
        code, out, _ = await llmgw(plane, "nodes")
        assert out.splitlines()[0].endswith("(lent to Slurm)") and "drained" not in out, out
        code, out, err = await llmgw(plane, "slurm", "reclaim", "n1", *WHO)
        assert code == 0, err
        await wait_for(lambda: "ready" in replica_states(plane).values(), 30, "a replica placed again")
        code, out, err = await llmgw(plane, "slurm", "status")  # enabled: false: no agent runs any Slurm daemon
        assert code == 0 and out.splitlines()[0].startswith("controller: none reports slurmctld"), out + err

        code, out, err = await llmgw(plane, "node", "cordon", "ghost", *WHO)  # a node no file names: committed
        assert code == 0 and "warning: the control plane knows no node 'ghost'" in err, err
        await wait_for(lambda: "ghost" in (plane.snapshot().settings.cluster.cordoned or ()), 10, "ghost cordoned")
        code, out, err = await llmgw(plane, "slurm", "lend", "ghost", *WHO)  # not lendable: refused with the fix
        assert code == 1 and "slurm.yaml" in err
        nursery.cancel_scope.cancel()
