"""A weights source naming a whole Hugging Face repository directory (`hf://org/repo@<revision>/[dir/]`): listed
through the Hub's tree API (the stand-in in conftest.py serves it over real HTTP, paginated), each file checked
against the ids the tree publishes (lfs.oid sha256, or the git blob sha1 of a file kept in git), optionally the whole
set against the operator's digest, fetched into the cache and laid out for the engine."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from llmgw.agent.weights_layout import engine_model_path, layout_key
from llmgw.agent.weights_tree import fetch_all, files_of_tree, git_blob_sha1, set_digest, tree_url
from llmgw.errors import WeightsError
from llmgw.wire import pb
from test_multi_file_weights import REPO, REVISION, gguf_splits, sharded_checkpoint

ROOT = f"hf://{REPO}@{REVISION}/"
SHA = "a" * 64
OID = "b" * 40


def publish(hub, files: dict[str, bytes], in_git: tuple[str, ...] = ("config.json", "README.md")) -> None:
    for name, content in files.items():
        hub.state.add(REPO, name, content, revision=REVISION, in_git=name in in_git)


def digest_of(files: dict[str, bytes], prefix: str = "") -> str:
    """The set digest computed here from the contents, independently of the code under test."""
    lines = sorted(f"{n[len(prefix):]}\0{hashlib.sha256(c).hexdigest()}\n" for n, c in files.items())
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@pytest.mark.parametrize(("source", "entries", "expected"), [
    (ROOT, [{"type": "file", "path": "w.safetensors", "size": 3, "oid": OID, "lfs": {"oid": SHA, "size": 3}},
            {"type": "file", "path": "config.json", "size": 2, "oid": OID},
            {"type": "directory", "path": "sub", "size": 0, "oid": OID}],
     [("config.json", None), ("w.safetensors", SHA)]),
    (ROOT + "sub/", [{"type": "file", "path": "sub/a/x.gguf", "size": 3, "oid": OID, "lfs": {"oid": SHA, "size": 3}},
                     {"type": "file", "path": "subway.json", "size": 2, "oid": OID},
                     {"type": "file", "path": "top.json", "size": 2, "oid": OID}],
     [("a/x.gguf", SHA)]),
])
def test_a_tree_becomes_the_files_under_the_directory_named_relative_to_it(source, entries, expected):
    files = files_of_tree(source, entries)
    assert [(f.name, f.sha256) for f in files] == expected
    assert all(f.source == f"hf://{REPO}@{REVISION}/{source[len(ROOT):]}{f.name}" and f.git_sha1 == OID
               for f in files)


@pytest.mark.parametrize(("entries", "allow_pickle", "message"), [
    ([{"type": "file", "path": "w.safetensors", "size": 3, "oid": OID, "lfs": {"oid": "short"}}], False,
     "tree entry for w.safetensors lacks"),
    ([{"type": "file", "path": "w.safetensors", "oid": OID}], False, "tree entry for w.safetensors lacks"),
    ([{"type": "directory", "path": "sub", "oid": OID}], False, "lists no file under it"),
    ([{"type": "file", "path": "pytorch_model.bin", "size": 3, "oid": OID, "lfs": {"oid": SHA}},
      {"type": "file", "path": "training_args.bin", "size": 3, "oid": OID}], False,
     "holds pytorch_model.bin, training_args.bin, in a pickle format"),
])
def test_a_tree_that_cannot_be_trusted_or_holds_pickles_is_refused_naming_the_file(entries, allow_pickle, message):
    with pytest.raises(WeightsError, match=message):
        files_of_tree(ROOT, entries, allow_pickle=allow_pickle)


def test_pickles_in_a_directory_are_listed_with_allow_pickle():
    entries = [{"type": "file", "path": "pytorch_model.bin", "size": 3, "oid": OID, "lfs": {"oid": SHA}}]
    assert [f.name for f in files_of_tree(ROOT, entries, allow_pickle=True)] == ["pytorch_model.bin"]


@pytest.mark.parametrize("content", [b"", b"{}\n", bytes(range(256)) * 40])
def test_the_git_blob_id_is_the_one_git_itself_computes(content):
    git = subprocess.run(["git", "hash-object", "--stdin"], input=content, capture_output=True, check=True)
    assert git_blob_sha1(content) == git.stdout.decode().strip()


@pytest.mark.parametrize(("source", "url"), [
    (ROOT, f"http://hub/api/models/{REPO}/tree/{REVISION}?recursive=true"),
    (ROOT + "sub/dir/", f"http://hub/api/models/{REPO}/tree/{REVISION}/sub/dir?recursive=true"),
])
def test_the_tree_is_asked_for_as_huggingface_hub_asks(source, url):
    assert tree_url(source, "http://hub/") == url


def test_the_set_digest_names_the_laid_out_directory():
    names, digests = ["b/x", "a"], [SHA, "c" * 64]
    assert set_digest(names, digests) == hashlib.sha256(f"a\0{'c' * 64}\nb/x\0{SHA}\n".encode()).hexdigest()
    assert layout_key(names, digests) == set_digest(names, digests)[:16]


async def test_a_directory_source_is_listed_fetched_verified_and_given_to_vllm(tmp_path, hub):
    files = {**sharded_checkpoint(), "README.md": b"# tiny\n"}
    publish(hub, files)
    hub.state.tree_page_size = 2  # several pages, followed by their Link headers
    seen = []
    item = pb.WeightsFile(source=ROOT, sha256=digest_of(files))
    paths, sources, names = await fetch_all([item], tmp_path, hf_endpoint=hub.url,
                                            progress=lambda f, t: seen.append((f, t)))
    assert names == sorted(files) and sources == [ROOT + n for n in names] and seen[-1][0] == 1.0
    assert (0.0, f"{ROOT}: 5 files, set sha256 {digest_of(files)}") in seen
    assert [p.read_bytes() for p in paths] == [files[n] for n in names]
    model = engine_model_path("vllm", sources, paths, tmp_path, names)
    assert model.name == digest_of(files)[:16]
    assert {p.name: p.read_bytes() for p in model.iterdir() if not p.name.startswith(".")} == files
    tree_pages = [path for _, path, _ in hub.state.log if path.startswith("/api/models/")]
    assert len(tree_pages) == 3 and all("recursive=true" in p for p in tree_pages)

    hub.state.log.clear()  # a second start reads the files kept in git from the cache too
    assert (await fetch_all([item], tmp_path, hf_endpoint=hub.url))[0] == paths
    assert not [path for _, path, _ in hub.state.log if "/resolve/" in path]


async def test_a_subdirectory_is_given_to_llama_cpp_as_its_first_split(tmp_path, hub):
    publish(hub, {**gguf_splits(), **sharded_checkpoint()})
    paths, sources, names = await fetch_all([pb.WeightsFile(source=ROOT + "gguf/")], tmp_path, hf_endpoint=hub.url)
    assert names == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert engine_model_path("llama.cpp", sources, paths, tmp_path, names).name == "tiny-00001-of-00003.gguf"


EVIL = b'{"architectures": ["Evil"]}'


@pytest.mark.parametrize(("tampered", "content", "message"), [
    ("model-00002-of-00002.safetensors", EVIL,
     f"hf://{REPO}@{REVISION}/model-00002-of-00002.safetensors has sha256 "),
    ("config.json", EVIL, f"hf://{REPO}@{REVISION}/config.json has git blob id [0-9a-f]{{40}}, but the Hub's tree "
                          "publishes"),
    ("config.json", EVIL * 100_000, f"hf://{REPO}@{REVISION}/config.json has git blob id "),  # longer than listed
])
async def test_a_tampered_file_is_refused_naming_it(tmp_path, hub, tampered, content, message):
    publish(hub, sharded_checkpoint())
    hub.state.tampered[(REPO, REVISION, tampered)] = content
    with pytest.raises(WeightsError, match=message):
        await fetch_all([pb.WeightsFile(source=ROOT)], tmp_path, hf_endpoint=hub.url)
    assert all(p.read_bytes() != content for p in (tmp_path / "sha256").glob("*"))
    if tampered == "config.json":  # nothing recorded for the blob that differed
        assert not list((tmp_path / "git-sha1").glob("*"))


async def test_a_set_that_differs_from_its_digest_is_refused_before_the_large_files(tmp_path, hub):
    files = sharded_checkpoint()
    publish(hub, files)
    wrong = digest_of({**files, "extra.json": b"{}"})
    with pytest.raises(WeightsError, match=f"has digest {digest_of(files)}, but the model pins {wrong}"):
        await fetch_all([pb.WeightsFile(source=ROOT, sha256=wrong)], tmp_path, hf_endpoint=hub.url)
    assert not [path for _, path, _ in hub.state.log if "safetensors" in path]  # no shard was downloaded


async def test_a_pickle_in_the_directory_is_refused_unless_the_model_allows_pickles(tmp_path, hub):
    publish(hub, {**sharded_checkpoint(), "pytorch_model.bin": b"\x80\x04\x95\x00"})
    with pytest.raises(WeightsError, match="holds pytorch_model.bin, in a pickle format"):
        await fetch_all([pb.WeightsFile(source=ROOT)], tmp_path, hf_endpoint=hub.url)
    assert not (tmp_path / "sha256").exists() or not any((tmp_path / "sha256").iterdir())
    _, _, names = await fetch_all([pb.WeightsFile(source=ROOT)], tmp_path, hf_endpoint=hub.url, allow_pickle=True)
    assert "pytorch_model.bin" in names


async def test_a_gated_directory_is_listed_with_the_token(tmp_path, hub):
    publish(hub, sharded_checkpoint())
    hub.state.gated[REPO] = "hf_secret"
    with pytest.raises(WeightsError, match="answered 401; it needs a token"):
        await fetch_all([pb.WeightsFile(source=ROOT)], tmp_path, hf_endpoint=hub.url)
    paths, _, _ = await fetch_all([pb.WeightsFile(source=ROOT, secret_value="hf_secret")], tmp_path,
                                  hf_endpoint=hub.url)
    assert len(paths) == 4
