"""Weights fetched from a Hub-like server, mirrors and files into the content-addressed cache, always verified."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest
import trio

from llmgw.agent.weights import WeightsSpec, fetch, hub_url
from llmgw.errors import WeightsError

CONTENT = random.Random(15).randbytes(3 * 1024 * 1024 + 17)  # fixed: the digest names a test (pytest-xdist)
DIGEST = hashlib.sha256(CONTENT).hexdigest()


def cache_files(weights_dir: Path) -> list[str]:
    """Files under the weights directory, except the empty per-digest lock files."""
    return sorted(p.relative_to(weights_dir).as_posix() for p in weights_dir.rglob("*")
                  if (p.is_file() or p.is_symlink()) and not p.name.endswith(".lock"))


async def test_hub_source_is_resolved_redirected_verified_and_cached_by_digest(tmp_path, hub):
    hub.state.add("google/gemma-3-270m", "model.gguf", CONTENT, revision="a" * 40)
    seen = []
    paths = await fetch([WeightsSpec(f"hf://google/gemma-3-270m@{'a' * 40}/model.gguf", DIGEST)], tmp_path,
                        hf_endpoint=hub.url, progress=lambda f, t: seen.append(f))
    assert paths == [tmp_path / "sha256" / DIGEST]
    assert paths[0].read_bytes() == CONTENT
    assert cache_files(tmp_path) == [f"sha256/{DIGEST}"]
    assert hub.state.log[0][1] == f"/google/gemma-3-270m/resolve/{'a' * 40}/model.gguf"
    assert seen[-1] == 1.0 and all(0 <= f <= 1 for f in seen)


async def test_hf_endpoint_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.internal:8080/")
    assert hub_url("hf://org/repo/sub/dir/f.gguf") == "http://hub.internal:8080/org/repo/resolve/main/sub/dir/f.gguf"


async def test_gated_repository_answers_401_without_token_and_serves_with_it(tmp_path, hub):
    digest = hub.state.add("meta/gated", "w.safetensors", CONTENT)
    hub.state.gated["meta/gated"] = "hf_secret"
    spec = WeightsSpec("hf://meta/gated/w.safetensors", digest)
    with pytest.raises(WeightsError, match="401; it needs a token"):
        await fetch([spec], tmp_path, hf_endpoint=hub.url)
    with pytest.raises(WeightsError, match="401; the token was refused"):
        await fetch([spec], tmp_path, hf_endpoint=hub.url, token="hf_wrong")
    [path] = await fetch([spec], tmp_path, hf_endpoint=hub.url, token="hf_secret")
    assert path.read_bytes() == CONTENT  # and the CDN never saw the token (it answers 400 if it does)


async def test_interrupted_download_resumes_with_a_range_request(tmp_path, hub):
    hub.state.add("org/repo", "big.gguf", CONTENT)
    spec = WeightsSpec("hf://org/repo/big.gguf", DIGEST)
    hub.state.cut_after = 1024 * 1024
    with pytest.raises(WeightsError, match="resumes from byte 1048576"):
        await fetch([spec], tmp_path, hf_endpoint=hub.url)
    assert (tmp_path / "partial" / DIGEST).stat().st_size == 1024 * 1024
    assert not (tmp_path / "sha256" / DIGEST).exists()
    hub.state.cut_after = None
    [path] = await fetch([spec], tmp_path, hf_endpoint=hub.url)
    assert path.read_bytes() == CONTENT
    assert hub.state.log[-1][2].get("Range") == "bytes=1048576-"
    assert cache_files(tmp_path) == [f"sha256/{DIGEST}"]


async def test_server_ignoring_range_restarts_the_file_cleanly(tmp_path, hub):
    hub.state.add("org/repo", "big.gguf", CONTENT)
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / DIGEST).write_bytes(CONTENT[:5000])
    hub.state.ignore_range = True
    [path] = await fetch([WeightsSpec("hf://org/repo/big.gguf", DIGEST)], tmp_path, hf_endpoint=hub.url)
    assert path.read_bytes() == CONTENT


async def test_stale_complete_partial_is_replaced_once(tmp_path, hub):
    hub.state.add("org/repo", "f.gguf", CONTENT)
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / DIGEST).write_bytes(b"x" * (len(CONTENT) + 10))  # longer than the file: 416
    [path] = await fetch([WeightsSpec("hf://org/repo/f.gguf", DIGEST)], tmp_path, hf_endpoint=hub.url)
    assert path.read_bytes() == CONTENT


async def test_wrong_checksum_deletes_the_file_and_names_both_digests(tmp_path, hub):
    hub.state.add("org/repo", "f.gguf", CONTENT)
    expected = "0" * 64
    with pytest.raises(WeightsError) as caught:
        await fetch([WeightsSpec("hf://org/repo/f.gguf", expected)], tmp_path, hf_endpoint=hub.url)
    assert DIGEST in str(caught.value) and expected in str(caught.value)
    assert cache_files(tmp_path) == []


async def test_mirror_on_the_same_file_system_is_hard_linked_without_network(tmp_path):
    mirror = tmp_path / "mirror"
    (mirror / "sha256").mkdir(parents=True)
    (mirror / "sha256" / DIGEST).write_bytes(CONTENT)
    weights = tmp_path / "weights"
    [path] = await fetch([WeightsSpec("https://127.0.0.1:9/unreachable.gguf", DIGEST)], weights, [mirror])
    assert path.stat().st_ino == (mirror / "sha256" / DIGEST).stat().st_ino
    assert cache_files(weights) == [f"sha256/{DIGEST}"]


async def test_mirror_on_another_file_system_is_copied_and_verified(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.fail("this test needs /dev/shm on another file system than the temporary directory")
    mirror = shm / f"llmgw-test-mirror-{os.getpid()}"
    try:
        (mirror / "sha256").mkdir(parents=True)
        (mirror / "sha256" / DIGEST).write_bytes(CONTENT)
        [path] = await fetch([WeightsSpec("https://127.0.0.1:9/x.gguf", DIGEST)], tmp_path, [mirror])
        assert path.read_bytes() == CONTENT
        assert path.stat().st_ino != (mirror / "sha256" / DIGEST).stat().st_ino
    finally:
        for p in sorted(mirror.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        mirror.rmdir()


async def test_corrupt_mirror_file_fails_with_both_digests_and_the_mirror_keeps_its_file(tmp_path):
    mirror = tmp_path / "mirror"
    (mirror / "sha256").mkdir(parents=True)
    (mirror / "sha256" / DIGEST).write_bytes(b"bit rot")
    with pytest.raises(WeightsError, match=f"expected {DIGEST}"):
        await fetch([WeightsSpec("https://127.0.0.1:9/x", DIGEST)], tmp_path / "w", [mirror])
    assert (mirror / "sha256" / DIGEST).read_bytes() == b"bit rot"
    assert cache_files(tmp_path / "w") == []


async def test_file_source_is_copied_in(tmp_path):
    source = tmp_path / "my model.gguf"
    source.write_bytes(CONTENT)
    [path] = await fetch([(source.as_uri(), DIGEST)], tmp_path / "w")
    assert path.read_bytes() == CONTENT


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "x.pth", "x.ckpt", "x.PKL"])
async def test_pickle_formats_are_refused_unless_allowed(tmp_path, hub, name):
    digest = hub.state.add("org/repo", name, CONTENT)
    spec = WeightsSpec(f"hf://org/repo/{name}", digest)
    with pytest.raises(WeightsError, match="pickle format"):
        await fetch([spec], tmp_path, hf_endpoint=hub.url)
    assert hub.state.log == []  # refused before any request
    [path] = await fetch([spec], tmp_path, hf_endpoint=hub.url, allow_pickle=True)
    assert path.is_file()


@pytest.mark.parametrize("source,digest,words", [
    ("hf://org/repo/f.gguf", "abc", "not 64 hex digits"),
    ("s3://bucket/f.gguf", DIGEST, "unknown source"),
    ("hf://org-only", DIGEST, "not a Hub source"),
])
async def test_bad_requests_say_what_to_write(tmp_path, source, digest, words):
    with pytest.raises(WeightsError, match=words):
        await fetch([WeightsSpec(source, digest)], tmp_path)


async def test_a_full_disk_fails_clearly_and_leaves_no_partial_file(tmp_path, hub):
    hub.state.add("org/repo", "f.gguf", CONTENT)
    (tmp_path / "partial").mkdir()
    # The kernel's /dev/full answers every write with ENOSPC, exactly as a full file system does.
    (tmp_path / "partial" / DIGEST).symlink_to("/dev/full")
    with pytest.raises(WeightsError, match="disk under .* is full"):
        await fetch([WeightsSpec("hf://org/repo/f.gguf", DIGEST)], tmp_path, hf_endpoint=hub.url)
    assert cache_files(tmp_path) == []


async def test_many_files_are_fetched_at_most_four_at_a_time(tmp_path, hub, monkeypatch):
    from llmgw.agent import weights

    contents = [os.urandom(200_000) for _ in range(9)]
    specs = [WeightsSpec(f"hf://org/repo/part-{i}.gguf", hub.state.add("org/repo", f"part-{i}.gguf", c))
             for i, c in enumerate(contents)]
    running = peak = 0
    original = weights._download

    async def counting(*args, **kwargs):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(0.05)
        try:
            await original(*args, **kwargs)
        finally:
            running -= 1

    monkeypatch.setattr(weights, "_download", counting)
    paths = await fetch(specs + specs[:2], tmp_path, hf_endpoint=hub.url)  # duplicates fetched once
    assert [p.read_bytes() for p in paths] == contents + contents[:2]
    assert peak == 4


async def test_two_shards_fetching_the_same_file_at_once_download_it_once(tmp_path, hub):
    hub.state.add("org/repo", "f.gguf", CONTENT)
    spec = WeightsSpec("hf://org/repo/f.gguf", DIGEST)
    results = []

    async def one():
        results.append(await fetch([spec], tmp_path, hf_endpoint=hub.url))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
    assert results[0] == results[1] == [tmp_path / "sha256" / DIGEST]
    assert sum(path.startswith("/cdn/") for _, path, _ in hub.state.log) == 1
    assert (tmp_path / "sha256" / DIGEST).read_bytes() == CONTENT
