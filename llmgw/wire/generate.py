"""Regenerate `agent_pb2.py`, `agent_pb2_grpc.py` and `agent_pb2.pyi` from `agent.proto`.

Run `python -m llmgw.wire.generate` after editing `agent.proto` and commit the result; a test compares the
committed files with freshly generated ones and fails when they are stale. Needs `grpcio-tools` (a test
dependency only: installed nodes use the committed code).

protoc writes `import agent_pb2 as agent__pb2` into the gRPC module (it assumes a top-level module); that line is
rewritten to the package-relative `from . import agent_pb2 as agent__pb2` so the code works as `llmgw.wire.agent_pb2`.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from llmgw.errors import WireError

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO_NAME = "agent.proto"
GENERATED_NAMES = ("agent_pb2.py", "agent_pb2_grpc.py", "agent_pb2.pyi")

_ABSOLUTE_IMPORT = re.compile(r"^import agent_pb2 as agent__pb2$", re.MULTILINE)


def generate_sources(proto_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """Run protoc (from grpcio-tools) on `proto_dir/agent.proto` and return {file name: text}.

    The names are those of GENERATED_NAMES; imports are made package-relative.
    Raises: WireError if grpcio-tools is missing or protoc rejects the file (its message included).
    """
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as exc:
        raise WireError(
            "grpcio-tools is not installed, so agent.proto cannot be compiled; "
            "install the test extras (`pip install -e .[test]`) and run again."
        ) from exc
    import importlib.resources

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as out:
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_dir}",
                f"-I{include}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                str(proto_dir / PROTO_NAME),
            ]
        )
        if status != 0:
            raise WireError(f"protoc failed on {proto_dir / PROTO_NAME} (exit status {status}); see its message above.")
        sources = {name: (Path(out) / name).read_text() for name in GENERATED_NAMES}
    sources["agent_pb2_grpc.py"] = _ABSOLUTE_IMPORT.sub(
        "from . import agent_pb2 as agent__pb2", sources["agent_pb2_grpc.py"]
    )
    return sources


def stale_files(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Names of generated files in `package_dir` that differ from what `agent.proto` generates now ([] = fresh)."""
    fresh = generate_sources(package_dir)
    stale = []
    for name, text in fresh.items():
        path = package_dir / name
        if not path.exists() or path.read_text() != text:
            stale.append(name)
    return stale


def main(argv: list[str] | None = None) -> int:
    """Write the generated files next to agent.proto; with `--check`, only report stale files (exit 1 if any)."""
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        stale = stale_files()
        for name in stale:
            print(f"{PACKAGE_DIR / name} is stale: run `python -m llmgw.wire.generate`", file=sys.stderr)
        return 1 if stale else 0
    for name, text in generate_sources().items():
        (PACKAGE_DIR / name).write_text(text)
        print(f"wrote {PACKAGE_DIR / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
