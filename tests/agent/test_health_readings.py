"""The agent's GPU health reading: nvidia-smi -q -x (the H200 capture), the kernel log read once per line through
journalctl's cursor (or dmesg's timestamps), verdicts from llmgw.tools, and the wire message both ends share."""

from __future__ import annotations

import pytest

import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent.health import HealthReader, dmesg_after, report_message, split_journal_cursor
from llmgw.control.health import health_from_message
from llmgw.tools import Level

from agent_support import ControlSide, next_matching
from health_support import FIRST_BUS, SECOND_BUS, SECOND_UUID, XID_79_SECOND, Tools, counting_clock
from nvml_support import two_h200s


def test_journalctl_cursor_line_is_split_from_the_log_lines():
    text, cursor = split_journal_cursor("line one\nline two\n-- cursor: s=abc;i=12\n")
    assert text == "line one\nline two" and cursor == "s=abc;i=12"
    assert split_journal_cursor("-- No entries --\n") == ("", None)


def test_dmesg_lines_after_the_last_timestamp_are_new_and_continuations_follow_their_line():
    log = "[    1.5] a\n[    2.5] b\n  continuation of b\n[    3.0] c"
    assert dmesg_after(log, None) == (log, 3.0)
    assert dmesg_after(log, 2.0) == ("[    2.5] b\n  continuation of b\n[    3.0] c", 3.0)
    assert dmesg_after(log, 3.0) == ("", 3.0)


def test_h200_capture_reads_two_healthy_cards_with_no_domain(tmp_path):
    tools = Tools(journal=["2026-11-24T10:00:00+00:00 gpu-node kernel: NVRM: loading NVIDIA UNIX Open Kernel"])
    report = HealthReader(tools, sys_root=tmp_path, etc_root=tmp_path).read()
    assert report.source == "nvidia-smi" and report.notes == ()
    assert [(c.index, c.pci_bus_id, c.placeable, c.level) for c in report.health.cards] == [
        (0, FIRST_BUS, True, Level.OK), (1, SECOND_BUS, True, Level.OK)]
    assert report.domain.domain is None and report.ib_ports == () and report.imex is False


def test_an_xid_79_takes_its_card_out_until_the_hold_has_passed_and_no_line_is_read_twice(tmp_path):
    tools = Tools(journal=[XID_79_SECOND])
    clock, advance = counting_clock()
    reader = HealthReader(tools, sys_root=tmp_path, etc_root=tmp_path, xid_hold=3600.0, clock=clock)
    first = reader.read()
    assert first.unplaceable().keys() == {1}
    assert "Xid 79" in first.unplaceable()[1] and first.health.cards[0].placeable
    assert next(c for c in tools.calls if c[0] == "journalctl")[-1] == "-b"  # the first reading covers this boot
    advance(60.0)
    second = reader.read()  # journalctl prints nothing new: the Xid still counts, once
    assert tools.calls[-1][-2:] == ["--after-cursor", "c1"]
    assert "(2 times)" not in second.unplaceable()[1]
    advance(3600.0)
    assert reader.read().unplaceable() == {}


def test_without_journalctl_dmesg_lines_are_counted_once(tmp_path):
    line = "[  171.620236] NVRM: Xid (PCI:0000:00:07): 48, pid=1, name=vllm, An uncorrectable double bit error"
    tools = Tools(missing=("journalctl",), dmesg=[line, line + "\n[  200.000000] NVRM: Xid (PCI:0000:00:07): 48, "
                                                        "pid=1, name=vllm, again"])
    reader = HealthReader(tools, sys_root=tmp_path, etc_root=tmp_path)
    assert "Xid 48" in reader.read().unplaceable()[1]
    assert "(2 times)" in reader.read().unplaceable()[1]  # the old line is not counted again, the new one is


def test_an_ignored_card_is_left_out_with_its_xids(tmp_path):
    reader = HealthReader(Tools(journal=[XID_79_SECOND]), sys_root=tmp_path, etc_root=tmp_path)
    report = reader.read(frozenset({1}))
    assert [c.index for c in report.health.cards] == [0] and report.health.unattributed == ()


def test_no_nvidia_smi_means_no_gpu_health_and_no_kernel_log_read(tmp_path):
    tools = Tools(missing=("nvidia-smi",))
    report = HealthReader(tools, sys_root=tmp_path, etc_root=tmp_path).read()
    assert report.source == "none" and report.health.cards == () and "not installed" in report.notes[0]
    assert [c[0] for c in tools.calls] == ["nvidia-smi"]


def test_infiniband_ports_and_imex_come_from_sysfs_and_etc(tmp_path):
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    for name, text in {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)",
                       "link_layer": "InfiniBand"}.items():
        (port / name).write_text(text + "\n")
    (tmp_path / "nvidia-imex").mkdir()
    report = HealthReader(Tools(), sys_root=tmp_path, etc_root=tmp_path).read()
    assert [(p.ca, p.port, p.state, p.rate_gbps) for p in report.ib_ports] == [("mlx5_0", 1, "Active", 400.0)]
    assert report.imex is True


def test_the_wire_message_reads_back_as_the_same_verdicts(tmp_path):
    report = HealthReader(Tools(journal=[XID_79_SECOND]), sys_root=tmp_path, etc_root=tmp_path).read()
    back = health_from_message(report_message(report))
    assert back.health == report.health and back.to_json() == report.to_json()


async def test_register_and_heartbeats_carry_the_health_verdicts(tmp_path):
    config = AgentConfig(node_id="gpu-node", state_dir=tmp_path / "state", heartbeat_interval=0.1)
    reader = HealthReader(Tools(journal=[XID_79_SECOND]), sys_root=tmp_path, etc_root=tmp_path)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_agent(config, control.connect, nvml=two_h200s(),
                                                          health=reader, task_status=task_status))
        link = await control.links.receive()
        register = (await link.receive()).register
        assert register.HasField("health")
        out = {c.uuid: [f.code for f in c.findings if f.blocks_placement] for c in register.health.cards}
        assert out[SECOND_UUID] == ["xid"] and len(out) == 2
        beat = (await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat")).heartbeat
        assert beat.health.cards[1].findings[0].level == "fail"
        nursery.cancel_scope.cancel()


def _active_ib_port(root):
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    for name, text in {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)",
                       "link_layer": "InfiniBand"}.items():
        (port / name).write_text(text + "\n")


def _hand_made(name: str) -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[1] / "fixtures" / "hand-made" / name).read_text()


class SmTools(Tools):
    """Tools that also answer saquery / sminfo with the hand-made captures (unless missing)."""

    def __call__(self, argv):
        if argv[0] in ("saquery", "sminfo") and argv[0] not in self.missing:
            from llmgw.agent.discovery import ToolOutput

            self.calls.append(list(argv))
            name = "saquery-smir-two-sms.txt" if argv[0] == "saquery" else "sminfo-master.txt"
            return ToolOutput(tuple(argv), 0, _hand_made(name))
        return super().__call__(argv)


def test_an_active_infiniband_port_is_named_by_its_fabrics_lowest_sm_guid(tmp_path):
    _active_ib_port(tmp_path)
    tools = SmTools()
    report = HealthReader(tools, sys_root=tmp_path, etc_root=tmp_path).read()
    assert report.port_fabric("mlx5_0", 1) == "0010e0406d5aa0a0"
    assert ["saquery", "SMIR", "-C", "mlx5_0", "-P", "1"] in tools.calls
    only_sminfo = HealthReader(SmTools(missing=("saquery",)), sys_root=tmp_path, etc_root=tmp_path).read()
    assert only_sminfo.port_fabric("mlx5_0", 1) == "0010e0406d5aa0a0"
    neither = HealthReader(SmTools(missing=("saquery", "sminfo")), sys_root=tmp_path, etc_root=tmp_path).read()
    assert neither.port_fabric("mlx5_0", 1) == "" and "saquery and sminfo are not installed" in neither.notes[0]
    back = health_from_message(report_message(report))
    assert back.port_fabric("mlx5_0", 1) == "0010e0406d5aa0a0"


def test_a_failing_nvidia_smi_judges_no_card_but_reports_the_kernel_logs_xids(tmp_path):
    from llmgw.agent.discovery import ToolOutput

    class Failing(Tools):
        def __call__(self, argv):
            if argv[0] == "nvidia-smi":
                self.calls.append(list(argv))
                return ToolOutput(tuple(argv), 15, "Unable to determine the device handle for GPU 0000:00:07.0")
            return super().__call__(argv)

    report = HealthReader(Failing(journal=[XID_79_SECOND]), sys_root=tmp_path, etc_root=tmp_path).read()
    assert report.source == "none" and report.health.cards == ()
    assert "Xid 79" in report.health.unattributed[0].message and "exited 15" in report.notes[0]


def test_judging_again_with_other_ignored_cards_runs_no_tool(tmp_path):
    tools = Tools(journal=[XID_79_SECOND])
    reader = HealthReader(tools, sys_root=tmp_path, etc_root=tmp_path)
    assert reader.read().unplaceable().keys() == {1}
    calls = len(tools.calls)
    again = reader.judge(frozenset({1}))
    assert len(tools.calls) == calls and [c.index for c in again.health.cards] == [0]
    assert again.health.unattributed == () and reader.judge().unplaceable().keys() == {1}


@pytest.mark.parametrize(("answer", "up", "note"), [
    ("imex-ctl-N-j-up.json", True, None),
    ("imex-ctl-N-j-peer-down.json", False, "IMEX domain is DOWN (nvidia-imex-ctl -N)"),
    (None, True, "IMEX configured (/etc/nvidia-imex) but nvidia-imex-ctl is not installed: taken as up"),
])
def test_imex_is_up_only_when_nvidia_imex_ctl_says_so(tmp_path, answer, up, note):
    from pathlib import Path

    from llmgw.agent.discovery import ToolOutput

    (tmp_path / "nvidia-imex").mkdir()
    tools = Tools()
    hand_made = Path(__file__).resolve().parents[1] / "fixtures" / "hand-made"

    def run(argv):
        if argv[0] == "nvidia-imex-ctl":
            return ToolOutput(tuple(argv), 0, (hand_made / answer).read_text()) if answer else None
        return tools(argv)

    report = HealthReader(run, sys_root=tmp_path, etc_root=tmp_path, own_names=("gpu-node-1",)).read()
    assert report.imex is up and (note in report.notes if note else not report.notes)


def test_each_active_port_is_placed_under_its_leaf_by_the_fabric_map_read_every_five_minutes(tmp_path):
    from llmgw.agent.discovery import ToolOutput
    from llmgw.plan import interconnect_of

    _active_ib_port(tmp_path)
    (tmp_path / "class" / "infiniband" / "mlx5_0" / "node_guid").write_text("1070:fd03:00c0:0001\n")

    class MapTools(SmTools):
        def __call__(self, argv):
            if argv[0] == "ibnetdiscover":
                self.calls.append(list(argv))
                return ToolOutput(tuple(argv), 0, _hand_made("ibnetdiscover-two-leaves-hdr.txt"))
            return super().__call__(argv)

    tools = MapTools()
    clock, advance = counting_clock()
    reader = HealthReader(tools, sys_root=tmp_path, etc_root=tmp_path, clock=clock)
    report = reader.read()
    assert report.port_leaf("mlx5_0", 1) == "b8599f0300a000a0"  # leaf-a, as node01 mlx5_0 is cabled
    back = health_from_message(report_message(report))
    assert interconnect_of(back, {(c, p): leaf for c, p, leaf in back.port_leaves}).adapters == (
        ("mlx5_0", "0010e0406d5aa0a0", "b8599f0300a000a0"),)
    advance(60.0)
    reader.read()
    advance(300.0)
    reader.read()
    runs = [c for c in tools.calls if c[0] == "ibnetdiscover"]
    assert runs == [["ibnetdiscover", "-C", "mlx5_0", "-P", "1"]] * 2  # the first reading, then five minutes on
