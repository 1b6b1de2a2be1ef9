"""Parsers of Slurm's tools (llmgw.tools.slurm) against real Slurm 22.05 captures (tests/fixtures/slurm-22.05) and
the traps of FORMATS.md written as small cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.tools.slurm import parse_gres, parse_sacct, parse_scontrol_nodes, parse_slurmd_config
from llmgw.tools.values import ParseError

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm-22.05"


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()


def test_slurmd_c_of_a_real_node_gives_cpus_memory_and_no_gpus() -> None:
    config = parse_slurmd_config(capture("slurmd_C.txt"))
    assert (config.node_name, config.cpus, config.memory_mib, config.gpus) == ("vm", 2, 24105, {})
    assert (config.sockets_per_board, config.cores_per_socket, config.threads_per_core) == (1, 2, 1)


def test_slurmd_c_with_gpus_counts_them_by_type() -> None:
    text = ("NodeName=g1 CPUs=96 Boards=1 SocketsPerBoard=2 CoresPerSocket=24 ThreadsPerCore=2 RealMemory=1031000 "
            "Gres=gpu:h100:8\nUpTime=3-04:05:06\n")
    assert parse_slurmd_config(text).gpus == {"h100": 8}


@pytest.mark.parametrize("text", ["", "UpTime=0-01:00:00\n", "NodeName=x CPUs=two RealMemory=1\n",
                                  "NodeName=x RealMemory=1\n"])
def test_slurmd_c_without_its_numbers_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="slurmd -C"):
        parse_slurmd_config(text)


@pytest.mark.parametrize(("text", "gpus"), [
    ("gpu:h100:8", {"h100": 8}), ("gpu:a100:4(S:0-1)", {"a100": 4}), ("gpu:4", {"": 4}), ("gpu", {"": 1}),
    ("gpu:h100:2,gpu:a100:1,mps:100", {"h100": 2, "a100": 1}), ("(null)", {}), ("gpu:a100", {"a100": 1}),
])
def test_gres_lists_give_gpus_by_type(text: str, gpus: dict[str, int]) -> None:
    assert parse_gres(text) == gpus


def test_a_node_drained_by_llmgw_reads_its_reason_and_compound_state() -> None:
    [node] = parse_scontrol_nodes(capture("scontrol_drain.txt"))
    assert (node.name, node.state, node.flags, node.drain, node.responding) == ("n1", "idle", ("drain",), True, True)
    assert node.reason == "llmgw: not lent"
    assert (node.cpus, node.cpus_allocated, node.memory_mib, node.gpus) == (2, 0, 24105, {})
    assert node.partitions == ("debug",) and node.version == "22.05.8"


@pytest.mark.parametrize("name", ["scontrol_admin_drain.txt", "scontrol_oneline.txt"])
def test_a_drain_by_hand_keeps_the_whole_reason_with_its_spaces(name: str) -> None:
    [node] = parse_scontrol_nodes(capture(name))
    assert node.reason == "disk swap by admin [root@2026-12-01T03:11:36]"
    assert node.drain and node.memory_mib == 24105 and node.partitions == ("debug",)


def test_several_nodes_and_not_responding_states_are_read_in_order() -> None:
    text = ("NodeName=a CPUTot=8 CPUAlloc=8 State=ALLOCATED RealMemory=100 Gres=gpu:a100:4(S:0-1)\n\n"
            "NodeName=b CPUTot=8 State=DOWN*+NOT_RESPONDING RealMemory=100\n   Reason=Not responding [slurm@2026-11-30]\n")
    a, b = parse_scontrol_nodes(text)
    assert (a.state, a.gpus, a.drain) == ("allocated", {"a100": 4}, False)
    assert (b.state, b.responding, b.flags, b.reason) == ("down", False, ("not_responding",), "Not responding [slurm@2026-11-30]")


def test_no_nodes_gives_nothing_and_garbage_is_a_parse_error() -> None:
    assert parse_scontrol_nodes("No nodes in the system\n") == ()
    with pytest.raises(ParseError, match="scontrol show node"):
        parse_scontrol_nodes("slurm_load_node error: Unable to contact slurm controller\n")


def test_sacct_counts_each_job_once_without_its_steps_and_keeps_pending_arrays() -> None:
    jobs = parse_sacct(capture("sacct.txt"))
    assert [j.job_id for j in jobs] == ["1", "2", "3_[1-2]"]
    first = jobs[0]
    assert (first.name, first.partition, first.account, first.user, first.state) == ("hostname", "debug", "root",
                                                                                     "root", "completed")
    assert (first.cpus, first.gpus, first.elapsed_seconds, first.ended) == (1, 0, 0, True)
    assert jobs[1].elapsed_seconds == 2 and jobs[2].state == "pending" and not jobs[2].ended
    assert jobs[2].array_job == "3" and jobs[2].start == ""


def test_sacct_array_tasks_are_jobs_of_their_array() -> None:
    jobs = parse_sacct(capture("sacct_arrays.txt"))
    assert [(j.job_id, j.array_job) for j in jobs] == [("1", ""), ("2", ""), ("3_1", "3"), ("3_2", "3")]
    assert all(j.state == "completed" for j in jobs)


HEADER = "JobID|JobName|Partition|Account|User|State|ElapsedRaw|AllocCPUS|AllocTRES|Start|End\n"


@pytest.mark.parametrize(("tres", "gpus", "typed"), [
    ("billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64G,node=1", 2, {"a100": 2}),
    ("cpu=8,gres/gpu=3,mem=64G,node=1", 3, {}),
    ("cpu=8,gres/gpu:a100=1,gres/gpu:h100=2,mem=64G,node=1", 3, {"a100": 1, "h100": 2}),
    ("cpu=8,mem=64G,node=1", 0, {}),
])
def test_sacct_gpus_typed_and_untyped_are_counted_once(tres: str, gpus: int, typed: dict[str, int]) -> None:
    [job] = parse_sacct(HEADER + f"77|train|gpu|ml|alice|COMPLETED|3600|8|{tres}|2026-11-30T10:00:00|2026-11-30T11:00:00\n"
                        f"77.batch|batch||ml||COMPLETED|3600|8|{tres}|2026-11-30T10:00:00|2026-11-30T11:00:00\n"
                        f"77.extern|extern||ml||COMPLETED|3600|8|{tres}|2026-11-30T10:00:00|2026-11-30T11:00:00\n")
    assert (job.gpus, job.gpu_types) == (gpus, typed)


def test_sacct_cancelled_by_a_uid_is_cancelled() -> None:
    [job] = parse_sacct(HEADER + "5054326_1|x|gpu|ml|bob|CANCELLED by 7547|60|2|cpu=2|2026-11-30T10:00:00|2026-11-30T10:01:00\n")
    assert (job.state, job.array_job, job.ended) == ("cancelled", "5054326", True)


@pytest.mark.parametrize("text", [HEADER + "1|x|gpu\n", "JobName|State\nx|COMPLETED\n",
                                  HEADER + "1|x|gpu|a|u|COMPLETED|lots|1|cpu=1|now|later\n"])
def test_sacct_lines_that_do_not_fit_the_header_are_parse_errors(text: str) -> None:
    with pytest.raises(ParseError, match="sacct"):
        parse_sacct(text)


@pytest.mark.parametrize(("capture_name", "lent", "verdict"), [
    ("scontrol_drain.txt", True, "resume"), ("scontrol_drain.txt", False, None),
    ("scontrol_admin_drain.txt", True, None), ("scontrol_admin_drain.txt", False, None),
])
def test_llmgw_resumes_only_its_own_drain_and_never_an_administrators(capture_name: str, lent: bool, verdict) -> None:
    from llmgw.tools.slurm import drain_verdict

    [node] = parse_scontrol_nodes(capture(capture_name))
    assert drain_verdict(node, lent, "llmgw: not lent") == verdict


def test_llmgw_drains_an_idle_node_that_is_not_lent() -> None:
    from llmgw.tools.slurm import drain_verdict

    [node] = parse_scontrol_nodes("NodeName=n1 CPUTot=2 State=IDLE RealMemory=1\n")
    assert drain_verdict(node, False, "llmgw: not lent") == "drain" and drain_verdict(node, True, "x") is None
