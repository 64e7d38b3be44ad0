"""Import hook installed into the venv by tools/bootstrap.sh on CPU-only machines.

The only torchvision==0.28.0 wheel on PyPI is a CUDA build. Next to the CPU build of torch its
compiled extension ``torchvision/_C.so`` cannot load, and ``import torchvision`` then dies in
``torchvision/_meta_registrations.py`` with ``RuntimeError: operator torchvision::nms does not
exist`` -- which also breaks ``import timm``, ``import open_clip`` and transformers' vision
imports.

This module is imported at interpreter start by ``hydra_hf_torchvision_compat.pth``. It only puts a
finder on ``sys.meta_path``; nothing is imported until ``torchvision`` itself is first imported.
Then it tries to load torchvision's ``_C`` extension, and only if that fails it defines the
schemas of ``torchvision::nms`` and ``torchvision::qnms`` with ``torch.library`` so that
torchvision's fake-kernel registrations succeed. torchvision then imports with its compiled ops
reported unavailable (``torchvision.extension._has_ops() is False``): the pure-Python parts
(transforms, models, datasets) work; the compiled detection ops (nms, roi_align, ...) do not.
"""

from __future__ import annotations

import glob
import importlib.abc
import importlib.machinery
import os
import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY = None  # keeps the torch.library.Library alive for the life of the process


def _prepare_torchvision() -> None:
    global _LIBRARY
    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    import torch

    for folder in spec.submodule_search_locations:
        for path in glob.glob(os.path.join(folder, "_C*.so")) + glob.glob(os.path.join(folder, "_C*.pyd")):
            try:
                torch.ops.load_library(path)
                return  # the real extension loads: nothing to do
            except (OSError, ImportError, RuntimeError):
                pass
    missing = []
    for name in _SCHEMAS:
        try:
            getattr(torch.ops.torchvision, name)
        except (AttributeError, RuntimeError):
            missing.append(name)
    if missing:
        _LIBRARY = torch.library.Library("torchvision", "FRAGMENT")
        for name in missing:
            _LIBRARY.define(_SCHEMAS[name])


class _TorchvisionCompatFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        try:
            _prepare_torchvision()
        except Exception as exc:  # never break the interpreter for a compatibility shim
            print(f"hydra_hf torchvision compat: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None  # let the normal finders import torchvision


def install() -> None:
    if "torchvision" in sys.modules:
        return
    if not any(isinstance(f, _TorchvisionCompatFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionCompatFinder())


install()
