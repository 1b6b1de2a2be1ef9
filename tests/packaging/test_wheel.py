"""llmgw installs as users install it (issue 19, item 11): a wheel built with `pip wheel .` holds every file the
package reads at run time, and once installed into a fresh virtual environment, away from this source tree,
`llmgw validate` checks the example repository and `llmgw repo init` seeds a repository from the packaged example."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".venv", ".git", ".state", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                              ".pytest_cache")


def _tracked_data_files() -> list[str]:
    """Files under llmgw/ in the source tree that are not Python modules (schemas, specifications, .proto, ...)."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "llmgw").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built by `pip wheel .` from a copy of this tree (so no build output lands in the tree)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(ROOT, source, ignore=SKIP)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(work / "dist"), str(source)], check=True, timeout=600)
    [built] = (work / "dist").glob("llmgw-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_the_schemas_the_example_and_every_data_file_of_the_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for kind in ("llmgw", "model", "engines", "agent", "projects", "firewall", "slurm"):
        assert f"llmgw/settings/_schema/{kind}.json" in names
    for example in (ROOT / "examples" / "cluster-repo").rglob("*.yaml"):
        rel = example.relative_to(ROOT / "examples" / "cluster-repo").as_posix()
        assert f"llmgw/settings/_example/{rel}" in names
    assert "llmgw/control/_openapi/admin-api.yaml" in names  # GET /openapi.yaml of the admin API
    for unit in (ROOT / "deploy" / "systemd").glob("*.service"):  # what `llmgw server init` installs
        assert f"llmgw/install/_systemd/{unit.name}" in names
    missing = [path for path in _tracked_data_files() if path not in names]
    assert missing == [], f"files read at run time but left out of the wheel: {missing}"


@pytest.mark.slow
def test_an_installed_wheel_validates_the_example_and_inits_a_repository_outside_the_source_tree(
        wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # The dependencies come from this environment (a path in a .pth file: its editable llmgw is not activated);
    # llmgw itself only from the wheel, installed into the new environment's own site-packages, which comes first.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps-from-the-test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
                   check=True, timeout=300)
    clean_env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    away = tmp_path / "elsewhere"
    away.mkdir()

    where = subprocess.run([str(python), "-c", "import llmgw, llmgw.settings.schemas as s; "
                            "print(llmgw.__file__); print(s.schema_dir())"],
                           capture_output=True, text=True, cwd=away, env=clean_env, check=True).stdout.split()
    assert all(Path(path).is_relative_to(env_dir) for path in where), where  # not this source tree

    example = shutil.copytree(ROOT / "examples" / "cluster-repo", away / "settings")
    llmgw = env_dir / "bin" / "llmgw"
    checked = subprocess.run([str(llmgw), "validate", str(example)], capture_output=True, text=True, cwd=away,
                             env=clean_env, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    made = subprocess.run([str(llmgw), "repo", "init", str(away / "cluster.git")], capture_output=True, text=True,
                          cwd=away, env=clean_env, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    clone = away / "clone"
    subprocess.run(["git", "clone", "--quiet", str(away / "cluster.git"), str(clone)], check=True, timeout=60)
    assert (clone / ".llmgw" / "schema" / "model.json").is_file()
    first = (clone / "catalog" / "gemma-3-270m.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../.llmgw/schema/model.json"
