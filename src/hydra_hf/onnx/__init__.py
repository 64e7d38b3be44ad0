"""ONNX deployment of Hydra Ensembles: export a Hydra folder to one ONNX graph (ensemble and member
logits, dynamic batch and sequence axes), quantise it with ONNX Runtime, and run it through hydra_hf's
own front doors (``OnnxHydraModel``, ``pipeline``, ``hydra-hf evaluate``). See docs/deploy.md.

One floor, below evaluation (which runs exports as it runs PyTorch models): :mod:`.runtime` (loading and
running an export), :mod:`.export` (the graph, its check against PyTorch, the export folder's files),
:mod:`.int8` (the int8 recipes) and :mod:`.graph` (what they share). ``hydra-hf export``, which measures the
int8 graph against fp32 with the evaluation code, is :func:`hydra_hf.workflows.export.export`
(``hydra_hf.export_onnx``: the same with keyword options). This package's face holds the runtime only.

Everything here needs the optional packages ``onnx``, ``onnxruntime`` and ``onnxscript``
(``pip install hydra-hf[onnx]``); they are imported on first use, so ``import hydra_hf.onnx`` works
without them and a call that needs them raises one :class:`~hydra_hf.errors.HydraInputError` line.
"""

from __future__ import annotations

from .runtime import EXPORT_METADATA, OnnxHydraModel, OnnxHydraOutput, is_onnx_export, pipeline, require_onnx

__all__ = [
    "EXPORT_METADATA",
    "OnnxHydraModel",
    "OnnxHydraOutput",
    "is_onnx_export",
    "pipeline",
    "require_onnx",
]

