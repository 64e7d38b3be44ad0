"""ONNX deployment of Hydra Ensembles: export a Hydra folder to one ONNX graph (ensemble and member
logits, dynamic batch and sequence axes), quantise it with ONNX Runtime, and run it through hydra_hf's
own front doors (``OnnxHydraModel``, ``pipeline``, ``hydra-hf evaluate``). See docs/deploy.md.

Everything here needs the optional packages ``onnx``, ``onnxruntime`` and ``onnxscript``
(``pip install hydra-hf[onnx]``); they are imported on first use, so ``import hydra_hf.onnx`` works
without them and a call that needs them raises one :class:`~hydra_hf.errors.HydraInputError` line.
"""

from __future__ import annotations

from .runtime import (
    EXPORT_METADATA,
    OnnxHydraModel,
    OnnxHydraOutput,
    is_onnx_export,
    pipeline,
    require_onnx,
)

__all__ = [
    "EXPORT_METADATA",
    "OnnxHydraModel",
    "OnnxHydraOutput",
    "export_onnx",
    "is_onnx_export",
    "pipeline",
    "require_onnx",
]


def export_onnx(*args, **kwargs):
    """See :func:`hydra_hf.onnx.export.export_onnx` (imported lazily: it imports torch.onnx)."""
    from .export import export_onnx as _export_onnx

    return _export_onnx(*args, **kwargs)
