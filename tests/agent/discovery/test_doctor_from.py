"""`llmgw node doctor --from DIR`: the real H200 capture read truthfully, and hand-made capture directories
(tests/fixtures/hand-made/doctor-*, see that README) each giving its warning, in text and in --json."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.agent.discovery.captured import CaptureDir
from llmgw.cli.main import cli
from llmgw.errors import UsageError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
H200 = FIXTURES / "nvidia-h200"
HAND_MADE = FIXTURES / "hand-made"


def doctor(directory: Path, *extra: str):
    return CliRunner().invoke(cli, ["node", "doctor", "--from", str(directory), *extra])


def test_the_h200_capture_prints_its_one_card_truthfully():
    result = doctor(H200)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "driver 580.159.04, CUDA 13.0, 1 card(s)" in lines[0]
    gpu_lines = [line for line in lines if line.split()[1:2] == ["gpu"]]
    # 143771 MiB in nvidia-smi -q -x's fb_memory_usage/total; Gen 5 x16 of x16; ECC Enabled
    assert gpu_lines == ["ok    gpu      GPU 0: NVIDIA H200, class h200-141g, 140.4 GiB, PCIe gen 5 x16 of x16, "
                         "ECC on, placeable"]
    assert "ok    health   GPU 0 (00000000:00:06.0): no health findings" in lines
    assert "info  fabrics  no InfiniBand; no IMEX" in lines
    assert not [line for line in lines if line.startswith(("warn", "fail"))]
    assert lines[-1] == "node doctor: ready"


def test_the_h200_capture_as_json_carries_the_captured_numbers():
    report = json.loads(doctor(H200, "--json").output)
    gpus = report["node"]["gpus"]
    assert (gpus["source"], gpus["driver_version"], gpus["cuda_version"]) == ("nvidia-smi", "580.159.04", "13.0")
    assert len(gpus["gpus"]) == 1
    card = gpus["gpus"][0]
    assert card["name"] == "NVIDIA H200" and card["memory_total_bytes"] == 143771 * 1024**2
    assert (card["pcie_gen_max"], card["pcie_width_current"], card["pcie_width_max"]) == (5, 16, 16)
    assert card["ecc_enabled"] is True and card["mig_enabled"] is False and card["power_limit_watts"] == 700.0
    assert report["node"]["memory_total_bytes"] == 131981020 * 1024  # proc-meminfo.txt's MemTotal
    assert report["ok"] is True and report["health"]["cards"][0]["findings"] == []
    assert report["node"]["fabrics"] == {"infiniband": [], "imex": False}


CASES = [
    ("doctor-pcie-x8", "warn", "PCIe: the link trained at x8 of x16", "pcie-width"),
    ("doctor-remapped-pending", "warn", "a memory row remap waits for a GPU reset", "remap-pending"),
    ("doctor-xid-79", "fail", "Xid 79, GPU has fallen off the bus", "xid"),
    ("doctor-nvlink-unjoined", "warn", "the card has not joined its NVLink domain", "fabric-unjoined"),
    ("doctor-ib-port-down", "warn", "InfiniBand mlx5_3/1 is Down", None),
    ("doctor-two-fabrics", "warn", "InfiniBand ports on 2 physical fabrics (0010e0406d5aa0a0, 7cfe900300a1b2c0",
     None),
]


@pytest.mark.parametrize("name, status, words, code", CASES, ids=[c[0] for c in CASES])
def test_each_hand_made_capture_gives_its_warning_in_text_and_json(name, status, words, code):
    text = doctor(HAND_MADE / name)
    assert [line for line in text.output.splitlines() if words in line][0].startswith(status)
    assert text.exit_code == (1 if status == "fail" else 0)
    report = json.loads(doctor(HAND_MADE / name, "--json").output)
    assert [c for c in report["checks"] if c["status"] == status and words in c["detail"]]
    assert [c for c in report["checks"] if c["status"] in ("warn", "fail")] == \
        [c for c in report["checks"] if words in c["detail"]]  # its warning and no other
    if code is not None:
        assert code in [f["code"] for f in report["health"]["cards"][0]["findings"]]


def test_missing_files_are_said_not_captured_and_never_fail(tmp_path):
    shutil.copy(H200 / "nvidia-smi-q-x.xml", tmp_path)
    result = doctor(tmp_path)
    assert result.exit_code == 0
    for name in ("nvidia-smi-topo-m.txt", "ibstat.txt", "dmesg.txt"):
        assert f"info  capture  not captured: {name}" in result.output.splitlines()
    empty = doctor(tmp_path / "nothing-here")
    assert isinstance(empty.exception, UsageError) and "is not a directory of captured tool output" in str(empty.exception)


def test_an_unreadable_file_is_an_error_naming_it(tmp_path):
    shutil.copy(H200 / "nvidia-smi-q-x.xml", tmp_path)
    (tmp_path / "nvidia-smi-topo-m.txt").mkdir()  # unreadable whoever runs the test (root ignores modes)
    done = subprocess.run([sys.executable, "-m", "llmgw.cli", "node", "doctor", "--from", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert f"error: {tmp_path / 'nvidia-smi-topo-m.txt'} cannot be read" in done.stderr


@pytest.mark.parametrize("files", [(), ("notes.txt", "capture.tar")], ids=["empty", "unrelated-files"])
def test_a_directory_with_nothing_captured_is_an_error_not_ready(tmp_path, files):
    for name in files:
        (tmp_path / name).write_text("not a capture\n")
    done = subprocess.run([sys.executable, "-m", "llmgw.cli", "node", "doctor", "--from", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "ready" not in done.stdout
    assert done.stderr.startswith(f"error: nothing was captured in {tmp_path}")
    assert "deploy/capture-node.sh" in done.stderr and "Traceback" not in done.stderr


def test_one_captured_file_is_enough_to_be_judged(tmp_path):
    (tmp_path / "sminfo-mlx5_0-1.txt").write_text("# $ sminfo -C mlx5_0 -P 1\nnot found\n# exit=127\n")
    assert CaptureDir(tmp_path).captured() == ("sminfo-mlx5_0-1.txt",)
    assert doctor(tmp_path).exit_code == 0


def test_a_failing_card_exits_1_through_the_real_command():
    done = subprocess.run([sys.executable, "-m", "llmgw.cli", "node", "doctor", "--from",
                           str(HAND_MADE / "doctor-xid-79")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == "node doctor: 1 check(s) failed"


def test_per_port_subnet_manager_captures_win_over_the_general_one(tmp_path):
    (tmp_path / "sminfo.txt").write_text("sminfo: sm lid 1 sm guid 0x1, activity count 1 priority 1 state 3 "
                                         "SMINFO_MASTER\n")
    (tmp_path / "sminfo-mlx5_0-1.txt").write_text("# $ sminfo -C mlx5_0 -P 1\nport answer\n# exit=0\n")
    capture = CaptureDir(tmp_path)
    assert capture.run(["sminfo", "-C", "mlx5_0", "-P", "1"]).text == "port answer\n"
    assert capture.run(["sminfo", "-C", "mlx5_1", "-P", "1"]).text.startswith("sminfo: sm lid 1")
    (tmp_path / "ibnetdiscover.txt").write_text("# $ ibnetdiscover\nnot found\n# exit=127\n")
    assert capture.run(["ibnetdiscover", "-C", "mlx5_0", "-P", "1"]) is None  # not installed there
    assert capture.not_captured == []


def test_the_capture_script_makes_a_directory_the_doctor_reads(tmp_path):
    script = Path(__file__).resolve().parents[3] / "deploy" / "capture-node.sh"
    done = subprocess.run(["sh", str(script), str(tmp_path / "node")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    uname = (tmp_path / "node" / "uname.txt").read_text().splitlines()
    assert uname[0] == "# $ uname -a" and uname[-1] == "# exit=0" and len(uname) == 3
    meminfo = CaptureDir(tmp_path / "node").read("proc-meminfo.txt")
    assert meminfo[1] == 0 and meminfo[0].startswith("MemTotal:")
    report = json.loads(doctor(tmp_path / "node", "--json").output)
    assert report["ok"] and report["node"]["memory_total_bytes"] > 0
    if shutil.which("nvidia-smi") is None:  # this machine: the capture says nvidia-smi is not installed
        assert "no GPU captured" in report["checks"][0]["detail"] and report["node"]["gpus"]["gpus"] == []
