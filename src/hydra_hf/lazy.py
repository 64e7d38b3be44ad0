"""Heavy packages imported on first use: what keeps ``import hydra_hf`` and ``hydra-hf COMMAND --help`` light.

``datasets = lazy_module("datasets")`` at the top of a module stands for ``import datasets``: the module reads
``datasets.Dataset`` as before, and the package is imported the first time one of its attributes is read (then
from ``sys.modules``, as any import). The alternative, an ``import`` inside every function that uses the
package, would scatter ~30 local imports over the data, pruning and fine-tuning modules; a proxy keeps the
import at the top, in one line, where a reader looks for it. ``tests/repo/test_layout.py`` allows a lazy module
only for the heavy optional packages of its ``LAZY_ALLOWED`` (datasets with pandas and pyarrow, scikit-learn,
open_clip, timm, ...), and ``tests/repo/test_import_cost.py`` fails when ``import hydra_hf`` loads one of them.

Annotations name the real types (``datasets.Dataset``): modules that use a lazy module start with
``from __future__ import annotations``, so annotations are never evaluated at import.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["LazyModule", "lazy_module"]


class LazyModule:
    """A stand-in for the module ``name``, imported when one of its attributes is first read."""

    __slots__ = ("_name", "_module", "_hooks")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None
        self._hooks: list[Callable[[ModuleType], None]] = []

    def _load(self) -> ModuleType:
        if self._module is None:
            self._module = importlib.import_module(self._name)
            for hook in self._hooks:
                hook(self._module)
        return self._module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    @property
    def is_loaded(self) -> bool:
        """Whether the package is imported (by this stand-in, or by anyone: then the next read is free)."""
        return self._module is not None or self._name in sys.modules

    def on_load(self, hook: Callable[[ModuleType], None]) -> None:
        """Call ``hook(module)`` now if the package is imported, else right after it is (e.g. to apply a
        setting to it without importing it)."""
        if self.is_loaded:
            hook(self._load())
        elif hook not in self._hooks:
            self._hooks.append(hook)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r} ({'loaded' if self.is_loaded else 'not loaded yet'})>"


_LAZY: dict[str, LazyModule] = {}


def lazy_module(name: str) -> LazyModule:
    """The one stand-in of the module ``name`` (shared by every module that names it)."""
    if name not in _LAZY:
        _LAZY[name] = LazyModule(name)
    return _LAZY[name]
