"""A package's re-exported names, each imported from its module on first use (PEP 562's module ``__getattr__``).

A package whose ``__init__`` re-exports names from torch-side modules uses it so that its light modules (an options
model: ``convert.options``, ``calibrate.settings``, ``quantize.options``; ``quant.schemes``) import without torch:
importing ``pkg.options`` runs ``pkg/__init__``, which then imports nothing heavy. The CLI registers every command
with its options model that way, and ``--help`` stays free of torch (tests/unit/test_layers.py).
Imports: nothing of this package.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(package: str, names: dict[str, str], rest: str | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names`` maps each re-exported name to the module that defines it
    (relative to the package: ``".run"``; or absolute); ``rest``: a module whose public names are re-exported too
    (quantize re-exports quant's); the value is imported on first use and kept."""
    pkg = import_module(package)

    def __getattr__(name: str) -> Any:
        where = names.get(name)
        if where is None and rest is not None and not name.startswith("_") and name in import_module(rest).__all__:
            where = rest
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(where, package) if where.startswith(".") else import_module(where), name)
        setattr(pkg, name, value)
        return value

    return __getattr__
