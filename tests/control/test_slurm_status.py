"""`llmgw slurm status` from what agents report: a heartbeat's SlurmReport through the registry into the status
document, and the view the command prints (controller, slurmdbd, nodes lent or being reclaimed, job steps)."""

from __future__ import annotations

from llmgw.cli.slurm_cmds import _status_lines, slurm_status
from llmgw.control.agents import slurm_summary
from llmgw.control.audit import audit_snapshot, node_documents
from llmgw.control.registry import FleetRegistry
from llmgw.plan.types import NodeState
from llmgw.wire import pb


def daemon(name: str, state: str = "running", **fields) -> pb.SlurmDaemon:
    return pb.SlurmDaemon(name=name, state=state, pid=100, **fields)


def registry_with_reports() -> FleetRegistry:
    registry = FleetRegistry(lost_after=30)
    for node_id in ("ctl", "g1", "g2", "web"):
        registry, _ = registry.register(NodeState(node_id, cpu_cores=8, memory_bytes=16 << 30), now=0.0)
    reports = {
        "ctl": pb.SlurmReport(daemons=[daemon("munged"), daemon("slurmdbd"), daemon("slurmctld")]),
        "g1": pb.SlurmReport(daemons=[daemon("munged"), daemon("slurmd")], lent=True, node_state="mixed",
                             job_steps=3, version="slurm-wlm 22.05.8", users=2),
        "g2": pb.SlurmReport(daemons=[daemon("munged"), daemon("slurmd", "backoff", restarts=2,
                                                               error="slurmd exited with status 1: fatal")],
                             node_state="allocated+drain", node_reason="llmgw: not lent", job_steps=1,
                             warnings=["scontrol could not drain g2: timeout"]),
    }
    for node_id, report in reports.items():
        registry, _ = registry.heartbeat(node_id, 1.0, slurm=slurm_summary(report), slurm_job_steps=report.job_steps)
    return registry


def test_the_status_shows_the_controller_and_each_nodes_part() -> None:
    view = slurm_status({"nodes": node_documents(registry_with_reports().records())})
    assert view["controller"] == {"node": "ctl", "slurmctld": "running", "slurmdbd": "running"}
    assert set(view["nodes"]) == {"g1", "g2"}  # web has no part; ctl runs no slurmd
    assert view["nodes"]["g1"] | {"warnings": []} == {
        "state": "mixed", "reason": "", "lent": True, "reclaiming": False, "job_steps": 3, "slurmd": "running",
        "version": "slurm-wlm 22.05.8", "users": 2, "warnings": []}
    g2 = view["nodes"]["g2"]
    assert g2["reclaiming"] and g2["slurmd"] == "backoff" and g2["warnings"] == ["scontrol could not drain g2: timeout"]
    assert view["job_steps"] == 4
    missing = slurm_status({"nodes": {"g3": {"slurm": {"warnings": ["munged is not installed on this node"]}}}})
    assert missing["nodes"]["g3"]["warnings"] == ["munged is not installed on this node"]  # Slurm missing: shown
    lines = _status_lines(view)
    assert lines[0] == "controller: ctl (slurmctld running, slurmdbd running)"
    assert lines[1] == "g1: lent, Slurm state mixed, 3 job step(s), slurmd running, 2 users"
    assert lines[2] == ("g2: reclaiming, Slurm state allocated+drain (llmgw: not lent), 1 job step(s), slurmd backoff")
    assert lines[-1] == "job steps running: 4"


def test_a_slurm_report_that_changes_with_every_job_is_no_audit_commit_of_its_own() -> None:
    registry = registry_with_reports()
    before = audit_snapshot({"nodes": node_documents(registry.records())})
    registry, _ = registry.heartbeat("g1", 2.0, slurm=slurm_summary(pb.SlurmReport(lent=True, job_steps=7)))
    assert audit_snapshot({"nodes": node_documents(registry.records())}) == before

