"""Start-up logs: devices, offloaded layers and "no usable GPU" read from real captures and their variants."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.engines import clean_line, llamacpp, sglang, vllm

HERE = Path(__file__).parent
CAPTURES = HERE / "captures"


def shared_fixture(*parts: str) -> Path:
    """A file of the real-machine captures kept in tests/fixtures (a copy of the team's shared captures)."""
    return HERE.parent.joinpath("fixtures", *parts)


CUDA_LOG = """\
ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143155 MiB):
  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143155 MiB
load_backend: loaded CUDA backend from /opt/llmgw/engines/llama.cpp/bin/libggml-cuda.so
0.00.101.000 I llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:00:05.0) - 142629 MiB free
0.00.900.000 I load_tensors: offloading output layer to GPU
0.00.900.100 I load_tensors: offloaded 19/19 layers to GPU
0.01.200.000 I srv  llama_server: listening on http://127.0.0.1:8080
"""


def test_real_cpu_build_asked_for_gpu_layers_says_no_usable_gpu_and_fails_a_gpu_shard():
    report = llamacpp.parse_startup_log(CAPTURES.joinpath("llama-server-cpu-ngl.txt").read_text().splitlines())
    assert report.no_usable_gpu
    assert report.ready
    assert report.devices == ()
    reason = llamacpp.startup_failure(report, expects_gpu=True)
    assert reason is not None and "no usable GPU" in reason
    assert llamacpp.startup_failure(report, expects_gpu=False) is None


def test_real_verbose_cpu_log_has_no_devices_no_offload_and_no_errors():
    report = llamacpp.parse_startup_log(CAPTURES.joinpath("llama-server-cpu-verbose.txt").read_text().splitlines())
    assert report == llamacpp.StartupReport(ready=True)


def test_real_cuda_log_with_missing_model_reports_the_load_errors():
    path = shared_fixture("nvidia-h200", "llama-server-cuda", "llama-server-cuda-startup-nomodel.txt")
    report = llamacpp.parse_startup_log(path.read_text().splitlines())
    assert not report.ready and not report.no_usable_gpu
    assert report.errors[0] == "gguf_init_from_file: failed to open GGUF file '/nonexistent.gguf' (No such file or directory)"
    assert report.errors[-1] == "srv  llama_server: exiting due to model loading error"
    assert len(report.errors) == 10  # every E line of the capture


@pytest.mark.parametrize("prefix", [
    "",
    "llm-1  | ",
    "2026-11-29T10:00:01.123456Z ",
    "[12345] ",
    "llama_1 | [4242] 2026-11-29 10:00:01,5 ",
])
def test_cuda_devices_and_offloaded_layers_are_read_through_any_prefix(prefix):
    lines = [prefix + line for line in CUDA_LOG.splitlines()]
    report = llamacpp.parse_startup_log(lines)
    assert report.devices == (llamacpp.GpuDevice(0, "NVIDIA H200", 143155 * 1024 * 1024, "9.0"),)
    assert report.devices_used == ("CUDA0",)
    assert (report.layers_offloaded, report.layers_total) == (19, 19)
    assert report.backends == ("CUDA",)
    assert report.ready
    assert llamacpp.startup_failure(report, expects_gpu=True) is None


def test_zero_offloaded_layers_fails_a_gpu_shard_with_those_words():
    lines = ["llm_load_tensors: offloaded 0/29 layers to GPU"]  # older llama.cpp's prefix
    report = llamacpp.parse_startup_log(lines)
    assert (report.layers_offloaded, report.layers_total) == (0, 29)
    assert "offloaded 0/29 layers to GPU" in llamacpp.startup_failure(report, expects_gpu=True)


def test_rocm_device_line_without_compute_capability_is_a_device():
    report = llamacpp.parse_startup_log([
        "ggml_cuda_init: found 1 ROCm devices:",
        "  Device 0: AMD Radeon RX 7900 XTX, gfx1100 (0x1100), VMM: no, Wave Size: 32, VRAM: 24560 MiB",
    ])
    assert report.devices == (llamacpp.GpuDevice(0, "AMD Radeon RX 7900 XTX", 24560 * 1024 * 1024, None),)
    assert report.backends == ("ROCm",)


@pytest.mark.parametrize("garbage", [["\x00\xff garbage"], ["offloaded x/y layers"], ["Device 0: truncated"], []])
def test_garbage_or_truncated_logs_give_an_empty_report(garbage):
    assert llamacpp.parse_startup_log(garbage) == llamacpp.StartupReport()


@pytest.mark.parametrize("line,text,level", [
    ("0.00.105.883 E gguf_init_from_file: failed", "gguf_init_from_file: failed", "E"),
    ("svc-1  | 0.00.001.790 I srv  llama_server: initializing ...", "srv  llama_server: initializing ...", "I"),
    ("(APIServer pid=811) INFO 11-29 10:00:01 [api_server.py:1880] Starting vLLM API server 0 on http://0.0.0.0:8000",
     "Starting vLLM API server 0 on http://0.0.0.0:8000", "I"),
    ("\x1b[32m[2026-11-29 10:00:01]\x1b[0m The server is fired up and ready to roll!",
     "The server is fired up and ready to roll!", None),
])
def test_log_prefixes_are_stripped_and_levels_kept(line, text, level):
    assert clean_line(line) == (text, level)


def test_vllm_without_gpu_fails_a_gpu_shard_and_reports_readiness_otherwise():
    failing = vllm.parse_startup_log([
        "(EngineCore_DP0 pid=91) ERROR 11-29 10:00:05 [core.py:700] RuntimeError: No CUDA GPUs are available",
    ])
    assert failing.no_usable_gpu and failing.errors
    assert "no usable GPU" in vllm.startup_failure(failing, expects_gpu=True)
    ready = vllm.parse_startup_log(["(APIServer pid=811) INFO:     Application startup complete."])
    assert ready.ready and vllm.startup_failure(ready, expects_gpu=True) is None


def test_sglang_readiness_line_is_recognised():
    report = sglang.parse_startup_log(["[2026-11-29 10:00:09] The server is fired up and ready to roll!"])
    assert report.ready and not report.no_usable_gpu
