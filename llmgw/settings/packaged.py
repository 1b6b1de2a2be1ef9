"""Files llmgw reads at run time besides its modules: the settings schemas and the example settings repository.

In an installed wheel they are package data beside this module (`_schema/`, `_example/`, copied there by the build,
see setup.py); in the source tree and in an editable install they are `schema/` and `examples/cluster-repo/` at the
root of the tree. Both functions only look at the file system.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SOURCE_ROOT = _HERE.parents[1]


def schema_dir() -> Path:
    """The directory holding the settings schemas (`<kind>.json`): the wheel's package data, else `schema/` of the
    source tree."""
    packaged = _HERE / "_schema"
    return packaged if packaged.is_dir() else _SOURCE_ROOT / "schema"


def example_dir() -> Path:
    """The example settings repository (the default seed of `llmgw repo init`): the wheel's package data, else
    `examples/cluster-repo/` of the source tree."""
    packaged = _HERE / "_example"
    return packaged if packaged.is_dir() else _SOURCE_ROOT / "examples" / "cluster-repo"
