"""A package interface whose names are imported from their submodules when first read (PEP 562), so that importing
one light submodule of a package (`llmgw.settings.post_receive` in the post-receive hook, `llmgw.control.client` in
`llmgw status`) does not import the whole package with it.

    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {"submodule": ("Name", ...), ...})

in the package's `__init__.py` (with the same imports under `if TYPE_CHECKING:` for type checkers)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def lazy_exports(package: str, namespace: MutableMapping[str, Any], exports: Mapping[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """(`__getattr__`, `__dir__`, `__all__`) for the package `package` whose module globals are `namespace`:
    `exports` maps each submodule's name (relative to the package) to the names it defines for the package's
    interface. A name is imported from its submodule when first read, then kept in `namespace`. Reading a name not
    in `exports` raises AttributeError (as a module without it would); a submodule's ImportError propagates."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__, list(module_of)
