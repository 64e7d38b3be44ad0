"""What the ONNX export and the int8 recipes share: a quiet exporter, the products of a graph that an
activation feeds (the MLP output projections), and ONNX Runtime's dynamic int8 quantisation.

Below both :mod:`.export` and :mod:`.int8` (which import it, and not each other's helpers).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from typing import Any

from .runtime import require_onnx


@contextlib.contextmanager
def quiet_exporter():
    """The dynamo exporter prints its progress and warns about every traced transformers helper; its
    optimiser (onnx_ir) and ONNX Runtime's quantiser (the root logger) log every node at INFO."""
    root = logging.getLogger()
    noisy = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [root.level] + [lg.level for lg in noisy]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for lg in [root, *noisy]:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip([root, *noisy], levels):
                lg.setLevel(level)


# Kept in fp32 by default: the MLP output projections, found in the graph as the products whose input
# is an activation's output (GELU, its erf / tanh forms, SiLU, QuickGELU, ReLU). That input has a few
# values far larger than the rest, and dynamic quantisation gives each batch one uint8 range per
# tensor, too coarse for the many small ones: on the demo model (MiniLM, 3 members), quantising them
# changed 5.5 % of the validation labels and the Guardian OOD AUROC by -0.020; keeping them in fp32,
# 1.3 % and -0.004 (docs/deploy.md).
ACTIVATION_OPS = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Erf", "Tanh", "Sigmoid", "Relu"}
_ELEMENTWISE = {"Mul", "Add", "Div", "Reshape", "Cast", "Transpose", "Identity", "Squeeze", "Unsqueeze", "Flatten"}


def activation_fed_products(graph: Any, depth: int = 6) -> list[str]:
    """Names of the MatMul / Gemm nodes of ``graph`` whose first input is an activation's output:
    walking back from it through element-wise and shape operators (at most ``depth`` nodes) reaches an
    activation before any other product, softmax or normalisation."""
    producer = {out: node for node in graph.node for out in node.output}
    found = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        frontier, seen = [node.input[0]], set()
        for _ in range(depth):
            parents = [producer[name] for name in frontier if name in producer and name not in seen]
            seen.update(frontier)
            if any(parent.op_type in ACTIVATION_OPS for parent in parents):
                found.append(node.name)
                break
            frontier = [i for parent in parents if parent.op_type in _ELEMENTWISE for i in parent.input]
            if not frontier:
                break
    return found


def quantize_int8(
    source: str | os.PathLike, target: str | os.PathLike, keep_mlp_output_fp32: bool = True
) -> dict[str, Any]:
    """ONNX Runtime dynamic quantisation: int8 (QInt8) weights on every MatMul / Gemm with a constant
    weight, except (by default) the MLP output projections (:func:`activation_fed_products`);
    activations are quantised per batch at run time. Returns counts of the operators and the names of
    the products kept in fp32.
    """
    (onnx,) = require_onnx("onnx")
    require_onnx("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic  # the onnx extra: pip install hydra-hf[onnx]

    kept = (
        activation_fed_products(onnx.load(str(source), load_external_data=False).graph) if keep_mlp_output_fp32 else []
    )
    # the quantiser first rewrites a Gemm as "<name>_MatMul" + Add: exclude both names
    exclude = kept + [f"{name}_MatMul" for name in kept]
    with quiet_exporter():
        quantize_dynamic(
            str(source),
            str(target),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm"],
            nodes_to_exclude=exclude,
        )
    graph = onnx.load(str(target), load_external_data=False).graph
    ops = [node.op_type for node in graph.node]
    counts: dict[str, Any] = {
        "MatMulInteger": ops.count("MatMulInteger"), "DynamicQuantizeLinear": ops.count("DynamicQuantizeLinear"),
        "MatMul (float, left)": ops.count("MatMul"), "Gemm (float, left)": ops.count("Gemm"),
        "kept_fp32": sorted(kept),
    }
    if counts["MatMulInteger"] == 0:
        raise RuntimeError(
            f"dynamic quantisation of {str(source)!r} quantised no MatMul: the weights are not constants"
        )
    names = {node.name for node in graph.node if node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul")}
    leaked = [k for k in kept if any(n.startswith(k + "_") or n.startswith(k + "_MatMul_") for n in names)]
    if leaked:
        raise RuntimeError(f"products meant to stay fp32 were quantised: {leaked[:3]}; please report this")
    return counts
