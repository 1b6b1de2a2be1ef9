"""Build hook: files llmgw reads at run time that live outside the `llmgw` package in the source tree travel in the
wheel as package data.

    schema/*.json            -> llmgw/settings/_schema/      (the settings schemas; llmgw.settings.schemas.schema_dir)
    examples/cluster-repo/   -> llmgw/settings/_example/     (the default seed of `llmgw repo init`)
    docs/admin-api.yaml      -> llmgw/control/_openapi/      (the admin API's OpenAPI document, GET /openapi.yaml)
    deploy/systemd/          -> llmgw/install/_systemd/      (the units `llmgw server init` installs)

Everything else is in pyproject.toml. In the source tree (and an editable install) llmgw reads the originals.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
RUNTIME_DATA = {"schema": "llmgw/settings/_schema", "examples/cluster-repo": "llmgw/settings/_example",
                "docs/admin-api.yaml": "llmgw/control/_openapi/admin-api.yaml", "deploy/systemd": "llmgw/install/_systemd"}


class BuildPyWithRuntimeData(build_py):
    """build_py, then copy RUNTIME_DATA into the build directory beside the package's modules."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install reads the source tree
        for source, target in RUNTIME_DATA.items():
            destination = Path(self.build_lib) / target
            if (HERE / source).is_file():
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(HERE / source, destination)
                continue
            shutil.rmtree(destination, ignore_errors=True)
            shutil.copytree(HERE / source, destination,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))


setup(cmdclass={"build_py": BuildPyWithRuntimeData})
