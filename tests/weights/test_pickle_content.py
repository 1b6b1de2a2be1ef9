"""Pickles are refused by their content, not only by their name (issue 19, item 8): a file that is a pickle or a
PyTorch zip checkpoint never becomes `sha256/<digest>` under a name that looks harmless, unless the model sets
`allow_pickle`. Real GGUF and safetensors layouts pass. No torch needed: the files are made here.

Issue 25 (item 6): pickles of protocols 0 and 1 (no PROTO opcode: text opcodes such as `c`, `(`, `.`) are refused
too, including a code-running one cut short or followed by garbage, while the real Gemma GGUF, a real safetensors
header under every 2-byte header length, and every capture in tests/fixtures stay no pickles."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import struct
import zipfile
from pathlib import Path
from urllib.parse import quote

import pytest

from llmgw.agent.pickles import _pickle_protocol
from llmgw.agent.weights import WeightsSpec, fetch, pickle_format
from llmgw.errors import WeightsError


class Payload:
    """Stands for what a hostile pickle would build (torch pickles a dict of tensors the same way)."""

    def __init__(self) -> None:
        self.weights = [0.5] * 64


class Hostile:
    """Unpickling this runs os.system: the payload a hostile weights file carries."""

    def __reduce__(self):
        return os.system, ("echo pwned",)


def a_pickle(protocol: int) -> bytes:
    return pickle.dumps({"state_dict": Payload(), "step": 7}, protocol=protocol)


def a_torch_zip(top: str = "archive") -> bytes:
    """torch.save's layout: `<top>/data.pkl` (the pickled object), `<top>/data/0` (a storage), `<top>/version`."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{top}/data.pkl", a_pickle(2))
        archive.writestr(f"{top}/byteorder", "little")
        archive.writestr(f"{top}/data/0", struct.pack("<64f", *([0.5] * 64)))
        archive.writestr(f"{top}/version", "3\n")
    return buffer.getvalue()


def a_torch_legacy() -> bytes:
    """torch's pre-1.6 format: a pickled magic number, then more pickles, then raw storage bytes."""
    return (pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2)
            + pickle.dumps({"x": 1}, protocol=2) + b"\x00\x01\x02" * 100)


def a_safetensors(header_length: int | None = None) -> bytes:
    """safetensors: u64 little-endian header length, the JSON header (padded to `header_length` bytes when
    given), then the tensor bytes."""
    data = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)

    def header(pad: int) -> bytes:
        return json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, len(data)]},
                           "__metadata__": {"pad": "x" * pad}}).encode()

    text = header(0) if header_length is None else header(header_length - len(header(0)))
    return struct.pack("<Q", len(text)) + text + data


PICKLE_LIKE_LENGTH = 0x0480  # little-endian 80 04 ...: the bytes of a protocol-4 pickle's PROTO opcode


def a_gguf() -> bytes:
    """GGUF v3: magic, version, tensor count, metadata count (a header with nothing in it, then padding)."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + b"\x00" * 32


def write(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("content,kind", [
    (a_pickle(0), "a pickle (protocol 0)"),
    (a_pickle(1), "a pickle (protocol 1)"),
    (a_pickle(2), "a pickle (protocol 2)"),
    (a_pickle(4), "a pickle (protocol 4)"),
    (a_pickle(5), "a pickle (protocol 5)"),
    (a_torch_legacy(), "a pickle (protocol 2)"),
    (a_torch_zip(), "a PyTorch checkpoint (zip holding archive/data.pkl)"),
    (a_torch_zip("pytorch_model"), "a PyTorch checkpoint (zip holding pytorch_model/data.pkl)"),
], ids=["pickle-0", "pickle-1", "pickle-2", "pickle-4", "pickle-5", "torch-legacy", "torch-zip",
        "torch-zip-named"])
def test_pickles_and_torch_checkpoints_are_recognised_by_content(tmp_path, content, kind):
    assert pickle_format(write(tmp_path, "model.safetensors", content)) == kind


@pytest.mark.parametrize("content", [
    a_gguf(),
    a_safetensors(),
    a_safetensors(PICKLE_LIKE_LENGTH),  # a header length whose first byte is 0x80 like a pickle's PROTO
    b"",
    b"\x80",
    b"\x80\x02\x00\x00\x00\x00\x00\x00{",
], ids=["gguf", "safetensors", "safetensors-0x80-length", "empty", "one-byte", "proto-then-garbage"])
def test_gguf_safetensors_and_other_files_are_no_pickles(tmp_path, content):
    assert pickle_format(write(tmp_path, "model.bin", content)) is None


PLAIN_DATA = [{"step": 7, "name": "model"}, [1.5] * 20000, {"a": [1, 2, (3, 4)], "b": {"c": None}}]


@pytest.mark.parametrize("protocol", range(6))
@pytest.mark.parametrize("obj", [Payload(), {"weights": Payload()}, Hostile(), {1, 2}, *PLAIN_DATA],
                         ids=["object", "dict-of-objects", "hostile", "set", "dict", "long-list", "nested"])
def test_pickles_of_every_protocol_are_refused_by_content(tmp_path, protocol, obj):
    kind = pickle_format(write(tmp_path, "model.safetensors", pickle.dumps(obj, protocol=protocol)))
    assert kind == f"a pickle (protocol {protocol})" if protocol >= 2 else kind in (
        "a pickle (protocol 0)", "a pickle (protocol 1)")


@pytest.mark.parametrize("content", [
    b"cos\nsystem\n(S'echo pwned'\ntR.",
    b"cos\nsystem\n(S'echo pwned'\ntR",  # no STOP: the unpickler runs system() before it finds the end
    b"cos\nsystem\n(S'echo pwned'\ntR\x00\x01 not a pickle any more",  # garbage after the call
    b"cposix\nsystem\np0\n(Vecho pwned\np1\ntp2\nRp3\n.",
    b"(S'echo pwned'\nios\nsystem\np0\n.",  # INST
    pickle.dumps(Hostile(), protocol=0)[:20],  # cut short after the import
], ids=["global-reduce", "no-stop", "garbage-after", "memo", "inst", "cut-short"])
def test_hostile_protocol_0_pickles_are_refused_however_they_end(tmp_path, content):
    assert pickle_format(write(tmp_path, "tokenizer.json", content)) == "a pickle (protocol 0)"


def test_the_safetensors_case_really_starts_like_a_pickle():
    assert a_safetensors(PICKLE_LIKE_LENGTH)[:2] == b"\x80\x04"


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("path", sorted(p for p in FIXTURES.rglob("*") if p.is_file()),
                         ids=lambda p: str(p.relative_to(FIXTURES)))
def test_no_capture_in_the_fixtures_is_a_pickle(path):
    assert pickle_format(path) is None


def test_the_real_gemma_gguf_is_no_pickle(gemma_gguf):
    assert pickle_format(gemma_gguf) is None


def real_safetensors_header() -> bytes:
    """The first 64 KiB after the length of the Gemma 3 270M safetensors (`make vllm` makes it), else a header of
    the same shape: tensor names with dots, dtypes F32/BF16, offsets."""
    from llmgw.engines.vllm_demo import model_dir

    cache = Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")  # tests/conftest.py's cache_dir
    real = model_dir(cache) / "model.safetensors"
    if real.is_file():
        with real.open("rb") as handle:
            return handle.read(64 * 1024 + 8)[8:]
    tensors = {f"model.layers.{i}.self_attn.{p}_proj.weight": {"dtype": ("BF16", "F32")[i % 2], "shape": [640, 640],
                                                               "data_offsets": [i * 819200, (i + 1) * 819200]}
               for i in range(18) for p in "qkvo"}
    return json.dumps({"__metadata__": {"format": "pt"}, **tensors}).encode()


def test_a_safetensors_header_of_any_two_byte_length_is_no_pickle():
    """Every header length below 65536 (the first two bytes may be any pickle opcode), whole and cut to 200 bytes."""
    body = real_safetensors_header()
    found = [length for length in range(1 << 16) for cut in (64 * 1024, 208)
             if _pickle_protocol((struct.pack("<Q", length) + body)[:cut]) is not None]
    assert found == []


@pytest.mark.parametrize("path", ["pytorch_model.bin/", "download?file=pytorch_model.bin", "model.safetensors",
                                  "model.gguf"])
@pytest.mark.parametrize("content", [a_pickle(4), a_pickle(0), a_torch_zip()],
                         ids=["pickle", "pickle-0", "torch-zip"])
async def test_a_pickle_under_any_name_is_refused_after_download_and_never_cached(tmp_path, hub, path, content):
    digest = hub.state.add("org/repo", quote(path), content)  # the stand-in matches the path as requested
    spec = WeightsSpec(f"hf://org/repo/{path}", digest)
    with pytest.raises(WeightsError, match="which can run code when loaded.*allow_pickle: true"):
        await fetch([spec], tmp_path / "w", hf_endpoint=hub.url)
    assert not (tmp_path / "w" / "sha256" / digest).exists()
    assert [p.name for p in (tmp_path / "w" / "partial").iterdir() if not p.name.endswith(".lock")] == []
    [fetched] = await fetch([spec], tmp_path / "w", hf_endpoint=hub.url, allow_pickle=True)
    assert fetched.read_bytes() == content


@pytest.mark.parametrize("where", ["file", "mirror"])
async def test_a_pickle_from_a_file_or_a_mirror_is_refused_and_the_original_stays(tmp_path, where):
    content = a_torch_zip()
    digest = hashlib.sha256(content).hexdigest()
    if where == "file":
        original = write(tmp_path, "weights.gguf", content)
        spec, mirrors = WeightsSpec(f"file://{original}", digest), []
    else:
        (tmp_path / "mirror" / "sha256").mkdir(parents=True)
        original = write(tmp_path / "mirror" / "sha256", digest, content)
        spec, mirrors = WeightsSpec("https://127.0.0.1:9/never/asked.gguf", digest), [tmp_path / "mirror"]
    with pytest.raises(WeightsError, match="is a PyTorch checkpoint"):
        await fetch([spec], tmp_path / "w", mirrors)
    assert not (tmp_path / "w" / "sha256" / digest).exists()
    assert original.read_bytes() == content


async def test_a_pickle_another_model_allowed_into_the_cache_is_still_refused_to_a_model_that_does_not(tmp_path):
    content = a_pickle(4)
    digest = hashlib.sha256(content).hexdigest()
    original = write(tmp_path, "ok.gguf", content)
    spec = WeightsSpec(f"file://{original}", digest)
    [cached] = await fetch([spec], tmp_path / "w", allow_pickle=True)
    with pytest.raises(WeightsError, match="is a pickle"):
        await fetch([spec], tmp_path / "w")
    assert cached.is_file()  # the model that allowed it keeps it


@pytest.mark.parametrize("content", [a_gguf(), a_safetensors(PICKLE_LIKE_LENGTH)], ids=["gguf", "safetensors"])
async def test_gguf_and_safetensors_files_are_fetched_as_before(tmp_path, hub, content):
    digest = hub.state.add("org/repo", "model.bin/", content)
    [fetched] = await fetch([WeightsSpec("hf://org/repo/model.bin/", digest)], tmp_path, hf_endpoint=hub.url)
    assert fetched.read_bytes() == content
