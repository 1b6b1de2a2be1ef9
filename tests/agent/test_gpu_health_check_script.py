"""The device check tests/device/gpu_health_check.py (run by hand on a real GPU; pytest does not collect
tests/device/): its comparison, on the H200's NVML stand-in against the same card's nvidia-smi capture, finds every
field equal and names a field that differs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from nvml_support import FakeNvml

from captures import capture
from llmgw.agent.nvml_health import read_nvml_health
from llmgw.tools import parse_smi_health

SCRIPT = Path(__file__).resolve().parents[1] / "device" / "gpu_health_check.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_health_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_h200_compares_equal_field_by_field_and_a_pending_remap_is_a_diff():
    check = load()
    smi = parse_smi_health(capture("nvidia-smi-q-x.xml"))
    rows = check.compare(read_nvml_health(FakeNvml.h200()).cards, smi)
    assert {r["status"] for r in rows} == {"ok", "(volatile)", "(no NVML call)"}
    assert {r["field"] for r in rows} >= {"pcie.gen_max", "ecc.volatile_uncorrected", "remapped_rows.pending",
                                           "fabric.cluster_uuid", "mig_enabled"}
    worn = check.compare(read_nvml_health(FakeNvml.h200(remapped_rows=[0, 0, 1, 0])).cards, smi)
    assert [r["field"] for r in worn if r["status"] == "DIFF"] == ["remapped_rows.pending"]


def test_on_a_machine_without_an_nvidia_driver_the_script_says_so_and_exits_2(capsys):
    import pynvml
    import pytest

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass  # no driver: the real library fails to start, as here
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is here: run tests/device/gpu_health_check.py itself")
    assert load().main([]) == 2 and "NVML did not start" in capsys.readouterr().err
