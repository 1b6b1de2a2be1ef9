"""XIDs read from kernel logs in their three forms, attributed by PCI address, and judged by NVIDIA's catalog."""

from __future__ import annotations

import pytest

from fixture_files import fixture
from llmgw.tools import XidAction, classify_xid, normalise_bus_id, parse_xids, xid_info
from llmgw.tools.xid import CATALOG_URL, XidInfo


def test_a_healthy_h200_log_with_nvrm_lines_has_no_xid():
    assert parse_xids(fixture("nvidia-h200/dmesg-xid.txt")) == ()


def test_dmesg_T_lines_give_xid_119_with_pid_process_and_message():
    events = parse_xids(fixture("gpud/dmesg-T-xid-119.log"))
    assert [e.xid for e in events] == [119] * 5
    first = events[0]
    assert first.pci_bus_id == "00000000:9B:00.0" and first.pid == 2024380 and first.process == "nvidia-smi"
    assert first.timestamp == "Sun Feb 23 16:24:18 2025"
    assert first.message.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
    assert classify_xid(119).action is XidAction.RESET_GPU


def test_a_dev_kmsg_capture_without_nvrm_has_no_xid():
    assert parse_xids(fixture("gpud/kmsg-head.log")) == ()


@pytest.mark.parametrize("line, bus, xid, pid, process", [
    ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", "00000000:01:00.0", 79, None, ""),
    ("[111111111.111] NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     "00000000:05:00.0", 79, None, ""),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "00000000:03:00.0", 14, None, ""),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     "00000000:10:1C.0", 63, 1896, ""),
    ("4,3964,206764307,-;NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 "
     "(Drain and Reset)", "00000009:01:00.0", 154, None, ""),
    ("Nov 24 11:03:17 gpu-node07 kernel: NVRM: Xid (PCI:0000:2a:00): 94, pid=40377, name=vllm, Contained: SM (0x1).",
     "00000000:2A:00.0", 94, 40377, "vllm"),
    ("2026-11-24T11:03:17+0000 gpu-node07 kernel: NVRM: Xid (PCI:0000:2a:00.0): 95, Uncontained: FBHUB.",
     "00000000:2A:00.0", 95, None, ""),
])
def test_each_log_form_gives_the_card_and_the_xid(line, bus, xid, pid, process):
    (event,) = parse_xids(line)
    assert (event.pci_bus_id, event.xid, event.pid, event.process) == (bus, xid, pid, process)
    assert event.line == line


def test_gb200_nvlink_xids_and_recovery_actions_from_gpud_test_lines():
    events = parse_xids(fixture("gpud/xid-lines-from-kmsg_test.txt"))
    by_xid = {}
    for event in events:
        by_xid.setdefault(event.xid, set()).add(event.pci_bus_id)
    assert by_xid[149] == {"00000009:01:00.0", "00000008:01:00.0"}
    assert by_xid[154] == {"00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0", "00000008:01:00.0"}
    actions = {classify_xid(e.xid, e.message).action for e in events if e.xid == 154}
    assert actions == {XidAction.RESET_GPU}  # 0x4 Drain and Reset, 0x1 GPU Reset Required


def test_the_multiline_fallen_off_the_bus_message_reads_as_xid_79():
    text = ("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
            "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
            "               NVRM: fallen off the bus and is not responding to commands.\n"
            "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n")
    (event,) = parse_xids(text)
    assert (event.pci_bus_id, event.xid, event.from_text) == ("00000000:B3:00.0", 79, True)


def test_a_journalctl_log_gives_every_xid_in_order_and_skips_other_lines():
    events = parse_xids(fixture("hand-made/kernel-log-journalctl.txt"))
    assert [e.xid for e in events] == [13, 31, 94, 63, 48, 95, 79]
    assert events[0].timestamp == "Nov 24 10:41:02" and events[0].process == "python3"


@pytest.mark.parametrize("xid, action", [
    (13, XidAction.RESTART_APP), (31, XidAction.RESTART_APP), (43, XidAction.IGNORE), (48, XidAction.RESET_GPU),
    (63, XidAction.IGNORE), (64, XidAction.RESET_GPU), (74, XidAction.RESET_GPU), (79, XidAction.REBOOT),
    (92, XidAction.WATCH), (94, XidAction.RESTART_APP), (95, XidAction.RESET_GPU), (119, XidAction.RESET_GPU),
    (149, XidAction.RESET_GPU), (77, XidAction.RESTART_APP), (9999, XidAction.WATCH),
])
def test_xid_catalog_gives_each_xid_its_action(xid, action):
    info = xid_info(xid)
    assert info.action is action and info.source.startswith("https://docs.nvidia.com/deploy/xid-errors")


@pytest.mark.parametrize("message, action", [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", XidAction.RESET_GPU),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", XidAction.REBOOT),
    ("GPU recovery action changed from 0x4 (Drain and Reset) to 0x0 (None)", XidAction.IGNORE),
    ("something else", XidAction.WATCH),
])
def test_xid_154_takes_the_action_its_message_names(message, action):
    assert classify_xid(154, message).action is action


@pytest.mark.parametrize("bus, normal", [
    ("0000:3b:00", "00000000:3B:00.0"), ("00000000:3B:00.0", "00000000:3B:00.0"), ("0009:01:00", "00000009:01:00.0"),
    ("3b:00", "00000000:3B:00.0"),
])
def test_pci_addresses_are_normalised_to_nvidia_smi_form(bus, normal):
    assert normalise_bus_id(bus) == normal


def test_the_fallen_off_the_bus_message_through_journalctl_reads_as_one_xid_79():
    text = ("Feb 14 05:03:41 gpu-1 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0\n"
            "Feb 14 05:03:41 gpu-1 kernel: NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
            "Feb 14 05:03:41 gpu-1 kernel: NVRM: fallen off the bus and is not responding to commands.\n"
            "Feb 14 05:03:42 gpu-1 kernel: NVRM: The NVIDIA GPU 0000:c1:00.0 (PCI ID: 10de:2330)\n"
            "Feb 14 05:03:42 gpu-1 kernel: NVRM: installed in this system is not supported by this driver.\n")
    (event,) = parse_xids(text)
    assert (event.pci_bus_id, event.xid, event.timestamp) == ("00000000:B3:00.0", 79, "Feb 14 05:03:41")


def test_an_xid_63_syslog_line_with_pid_but_no_name():
    (event,) = parse_xids(fixture("ml-engineering/xid-63-syslog-line.txt"))
    assert (event.pci_bus_id, event.xid, event.pid, event.process) == ("00000000:10:1C.0", 63, 1896, "")
    assert event.message.startswith("Row Remapper: New row marked for remapping")
    assert classify_xid(63).action is XidAction.IGNORE


def test_an_xid_entry_carries_its_code_description_note_and_the_catalog_address():
    assert xid_info(79) == XidInfo(79, "GPU has fallen off the bus", XidAction.REBOOT,
                                   "catalog: restart the bare-metal machine", CATALOG_URL)
    assert xid_info(9999) == XidInfo(9999, "not in llmgw's copy of NVIDIA's XID catalog", XidAction.WATCH,
                                     "look it up in NVIDIA's catalog", CATALOG_URL)


@pytest.mark.parametrize("message, action, now", [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", XidAction.RESET_GPU,
     "GPU Reset Required"),
    ("GPU recovery action changed from 0x0 (None) to 0x4 ( Drain and Reset )", XidAction.RESET_GPU,
     "Drain and Reset"),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", XidAction.REBOOT,
     "Node Reboot Required"),
    ("GPU recovery action changed from 0x0 (None) to 0x8 (Something New)", XidAction.WATCH, "Something New"),
    ("GPU recovery action changed from 0x0 (None) to 0xa (Hex Digits)", XidAction.WATCH, "Hex Digits"),
])
def test_xid_154_keeps_its_catalog_entry_and_says_which_action_its_message_named(message, action, now):
    assert classify_xid(154, message) == XidInfo(154, "GPU Recovery Action Changed", action,
                                                  f"recovery action now {now!r}", CATALOG_URL)


def test_only_xid_154_reads_an_action_from_its_message():
    message = "GPU recovery action changed from 0x0 (None) to 0x0 (None)"
    assert classify_xid(79, message) == xid_info(79)
    assert classify_xid(155, message) == xid_info(155)
    assert classify_xid(154, "no action named") == xid_info(154)
