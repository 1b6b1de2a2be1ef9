"""The agent refuses a rendered Slurm file holding keys its renderer never writes (issue 25, item 2): the set is the
renderer's own keys (llmgw.tools.conf_keys, which the writer llmgw.plan.conf_lines enforces). The slurm.conf that
today's main would have rendered from the injected address of issue 25 is refused whole, nothing is written and the
role is not taken; the files llmgw really renders, with the agent's paths filled in, pass."""

from __future__ import annotations

from types import MappingProxyType

import pytest
import trio

from llmgw.agent.slurm import SlurmKeeper, SlurmLayout, refused_files
from llmgw.plan.slurm_conf import SlurmHost
from llmgw.plan.slurm_roles import slurm_roles, slurmdbd_conf
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings
from llmgw.tools.conf_keys import GRES_CONF_KEYS, SLURM_CONF_KEYS, rendered_problem
from llmgw.wire import pb

INJECTED = ('# Written by llmgw from slurm.yaml and the fleet: edits here are overwritten.\nClusterName=llmgw\n'
            'NodeName=n2 NodeAddr=10.0.0.9\nPrologSlurmctld=/x/evil.sh\nProlog=/x/evil.sh # CPUs=8 RealMemory=16384 '
            'State=DRAIN Reason="llmgw: not lent"\n')
"""What main's render_slurm wrote for a node whose Register carried the address of issue 25."""


def settings() -> SlurmSettings:
    return SlurmSettings(enabled=True, controller="n1", accounting=True,
                         nodes=MappingProxyType({"n1": SlurmNode("debug"), "n2": SlurmNode("debug", lent=True)}),
                         partitions=MappingProxyType({"debug": SlurmPartition(default=True)}))


HOSTS = {"n1": SlurmHost("n1", "10.0.0.1", 4, 8192, hostname="host-1"),
         "n2": SlurmHost("n2", "fd00::2", 8, 16384, (("h100", "/dev/nvidia0"),))}


@pytest.mark.parametrize(("text", "words"), [
    (INJECTED, "line 4 sets PrologSlurmctld"),
    ("NodeName=n1 Prolog=/x/evil.sh\n", "sets Prolog,"),
    ("Epilog=/x\n", "sets Epilog,"),
    ("Include /etc/evil.conf\n", "not Key=Value pairs"),
    ("include=/etc/evil.conf\n", "sets include"),
    ('NodeName=n1 Reason="x" # a comment\n', "not Key=Value pairs"),
    ("NodeName=n1\rProlog=/x\n", "not Key=Value pairs"),
    ("NodeName=n1\x00\n", "not Key=Value pairs"),
    ("NodeName=n1\u2028Prolog=/x\n", "not Key=Value pairs"),
    ("NodeName=n1  CPUs=1\n", "not Key=Value pairs"),
    ("NodeName=n1 CPUs=\n", "not Key=Value pairs"),
    ('NodeName=n1 Reason="open\n', "not Key=Value pairs"),
    ("# comment\x1b[2J\n", "control character"),
], ids=["issue-25", "prolog", "epilog", "include", "include-key", "comment-after", "cr", "nul", "u2028",
        "two-spaces", "empty-value", "open-quote", "escape-in-comment"])
def test_a_file_with_keys_or_lines_the_renderer_never_writes_is_refused(text, words):
    problem = rendered_problem("slurm.conf", text, SLURM_CONF_KEYS)
    assert problem is not None and words in problem and problem.startswith("slurm.conf line ")


def test_the_files_llmgw_renders_pass_with_the_agents_paths_filled_in(tmp_path):
    role = slurm_roles(settings(), HOSTS)["n1"]
    wire = pb.SlurmRole(daemons=list(role.daemons), slurm_conf=role.slurm_conf, gres_conf=role.gres_conf,
                        slurmdbd_conf=slurmdbd_conf(settings(), HOSTS, "0123456789abcdef"))
    assert refused_files(SlurmLayout(tmp_path / "slurm"), wire) is None
    assert rendered_problem("gres.conf", role.gres_conf, GRES_CONF_KEYS) is None
    spaced = SlurmLayout(tmp_path / "a dir with spaces")  # slurm.conf cannot hold such a path: refused, not misread
    assert "not Key=Value pairs" in refused_files(spaced, wire)


async def test_the_keeper_refuses_a_role_whose_slurm_conf_was_injected_and_writes_nothing(tmp_path):
    layout = SlurmLayout(tmp_path / "slurm")
    programs = {name: "/bin/true" for name in ("munged", "slurmd", "slurmctld", "slurmdbd")}
    role = pb.SlurmRole(daemons=["slurmd"], node_name="n2", slurm_conf=INJECTED, gres_conf="", munge_key=b"k" * 32)
    async with trio.open_nursery() as nursery:
        keeper = SlurmKeeper(layout, nursery, programs=programs)
        await keeper.apply(role)
        assert len(keeper.warnings) == 1
        assert "slurm.conf line 4 sets PrologSlurmctld" in keeper.warnings[0]
        assert "keeps its earlier files" in keeper.warnings[0]
        assert keeper.role == pb.SlurmRole()  # not taken
        assert not layout.slurm_conf.exists() and not layout.munge_key.exists()
        assert keeper.daemons == {}
        nursery.cancel_scope.cancel()
