"""How engines are given a model's LoRA adapters: llama-server loads them unapplied, numbered by their order, and a
request applies one by id; vLLM serves each under its name, told the rank when above its default."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.engines import Launch, LoraAdapter, llamacpp, vllm

ADAPTERS = (LoraAdapter("pirate", Path("/w/sha256/aa")), LoraAdapter("poet", Path("/w/sha256/bb")))


def test_llama_server_loads_every_adapter_in_order_at_scale_zero():
    argv, _env = llamacpp.command_line(Launch(binary=Path("/bin/llama-server"), model_path=Path("/m.gguf"),
                                              adapters=ADAPTERS, engine_args=("--no-jinja",)))
    loras = [argv[i + 1] for i, a in enumerate(argv) if a == "--lora-scaled"]
    assert loras == ["/w/sha256/aa:0", "/w/sha256/bb:0"]
    assert "--lora" not in argv  # `--lora` keeps scale 1 as the server's default for every request
    assert argv.count("--lora-init-without-apply") == 1 and argv[-1] == "--no-jinja"
    assert argv[argv.index("--cache-ram") + 1] == "0"  # the host prompt cache ignores adapters


def test_llama_server_without_adapters_gets_no_lora_arguments():
    argv, _env = llamacpp.command_line(Launch(binary=Path("/bin/llama-server"), model_path=Path("/m.gguf")))
    assert not [a for a in argv if "lora" in a]


@pytest.mark.parametrize(("index", "field"), [
    (None, [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]),  # the base model: every adapter at 0
    (0, [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]),
    (1, [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]),  # the second loaded; the first stays at 0
])
def test_a_request_lists_every_adapter_applying_one_by_its_position_or_none(index, field):
    assert llamacpp.lora_request_field(index, 2) == field


def test_vllm_serves_each_adapter_under_its_name():
    argv, _env = vllm.command_line(Launch(binary=Path("/v/bin/python"), model_path=Path("/m"), served_name="gemma",
                                          adapters=ADAPTERS))
    start = argv.index("--lora-modules")
    assert argv[start - 1] == "--enable-lora"
    assert argv[start + 1:start + 3] == ["pirate=/w/sha256/aa", "poet=/w/sha256/bb"]
    assert "--max-lora-rank" not in argv  # ranks unknown (0): vLLM's default


@pytest.mark.parametrize(("ranks", "flag"), [
    ((8, 16), None), ((8, 17), "32"), ((64,), "64"), ((300,), "320"), ((4096,), "512"),
])
def test_vllm_is_told_the_smallest_max_lora_rank_that_admits_every_adapter(ranks, flag):
    adapters = tuple(LoraAdapter(f"a{i}", Path(f"/a{i}"), rank) for i, rank in enumerate(ranks))
    argv, _env = vllm.command_line(Launch(binary=Path("/v/bin/python"), model_path=Path("/m"), adapters=adapters))
    assert (argv[argv.index("--max-lora-rank") + 1] if "--max-lora-rank" in argv else None) == flag


def test_an_operators_own_lora_arguments_are_kept_instead_of_ours():
    argv, _env = vllm.command_line(Launch(
        binary=Path("/v/bin/python"), model_path=Path("/m"), adapters=(LoraAdapter("a", Path("/a"), 64),),
        engine_args=("--enable-lora", "--lora-modules", "mine=/x", "--max-loras", "4")))
    assert argv.count("--enable-lora") == 1 and argv.count("--lora-modules") == 1
    assert argv[-5:] == ["--enable-lora", "--lora-modules", "mine=/x", "--max-loras", "4"]
