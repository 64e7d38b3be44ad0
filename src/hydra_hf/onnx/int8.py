"""int8 recipes for an exported graph: constant folding (so that every member's stacked projection
weights are constants a quantiser sees), SmoothQuant-style migration of the MLP output projection's
activation outliers into its weights, and ONNX Runtime dynamic quantisation with per-channel weights.
Recipes are registered by name (:data:`INT8_RECIPES`; ``hydra-hf export --int8-recipe``).

Why each step (measured, docs/deploy.md):

- In the exported Hydra graph the members' Q/K/V and output projections read slices of one stacked
  weight (Gather / Slice / Transpose of an initializer), which ``quantize_dynamic`` does not treat as
  constants: they stayed fp32, the int8 Hydra was slower than eager Single. ONNX Runtime's basic
  optimisation folds those slices into one constant weight per member (:func:`fold_constants`), so
  every product is quantisable, with per-channel scales (each member's product is its own MatMul).
- The input of the MLP output projection (fc2) is the activation's output, a few of whose channels
  are far larger than the rest: one int8 range per tensor loses the many small values. SmoothQuant
  (Xiao et al., 2023) divides channel j of that input by ``s_j = amax(X_j)^alpha / amax(W_j)^(1-alpha)``
  and multiplies row j of the weight by it (the product is unchanged in exact arithmetic), moving the
  outliers into the weights, which are quantised per output channel. ``amax(X_j)`` and ``alpha`` are
  calibrated on labelled in-distribution data (:func:`smoothquant_int8`).
- Static QDQ (ranges fixed at calibration) was measured too: int8 activations ran 2x slower than
  dynamic uint8 in ONNX Runtime's CPU kernels and uint8 no faster than dynamic, so it is not a recipe.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HydraInputError
from .graph import activation_fed_products, quantize_int8, quiet_exporter

logger = logging.getLogger(__name__)

ALPHAS = (0.5, 0.65, 0.8)  # SmoothQuant migration strengths smoothquant_int8 tries (the paper: 0.5 - 0.85)
SMOOTH_SUFFIX = "_smooth_inv_scale"


def fold_constants(source: str | os.PathLike, target: str | os.PathLike) -> dict[str, int]:
    """ONNX Runtime's basic (semantics-preserving, standard-operator) optimisation of ``source`` written
    to ``target``: constant folding turns the per-member slices of the stacked projection weights into
    constants. Returns how many MatMul / Gemm products have a constant weight before and after."""
    import onnx  # the onnx extra: pip install hydra-hf[onnx]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
    before = _constant_products(onnx.load(str(source)).graph)
    after = _constant_products(onnx.load(str(target)).graph)
    return {"products": after[1], "constant_weight_before": before[0], "constant_weight_after": after[0]}


def _constant_products(graph: Any) -> tuple[int, int]:
    inits = {i.name for i in graph.initializer}
    products = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")]
    return sum(1 for n in products if n.input[1] in inits), len(products)


def _weight(graph: Any, node: Any) -> tuple[Any, np.ndarray, int] | None:
    """``(initializer, array, input axis)`` of a product's constant weight (None when it is computed):
    the axis of the weight that meets the activation's channels (0 for MatMul, 1 for Gemm transB=1)."""
    from onnx import numpy_helper  # the onnx extra: pip install hydra-hf[onnx]

    inits = {i.name: i for i in graph.initializer}
    if node.input[1] not in inits:
        return None
    trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0) if node.op_type == "Gemm" else 0
    array = numpy_helper.to_array(inits[node.input[1]])
    if array.ndim != 2:
        return None
    return inits[node.input[1]], array, 1 if trans_b else 0


def activation_amax(model_path: str | os.PathLike, tensors: Sequence[str],
                    feeds: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-channel (last axis) largest ``|x|`` of the named intermediate tensors over the batches ``feeds``.

    Shape: each result is ``(channels,)``.
    """
    import onnx  # the onnx extra: pip install hydra-hf[onnx]
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    present = {o.name for o in model.graph.output}
    for name in tensors:
        if name not in present:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
    amax: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, value in zip(tensors, session.run(list(tensors), dict(feed))):
            flat = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)  # (channels,)
            amax[name] = flat if name not in amax else np.maximum(amax[name], flat)
    return amax


def smooth_products(source: str | os.PathLike, target: str | os.PathLike, products: Sequence[str],
                    amax: Mapping[str, np.ndarray], alpha: float) -> int:
    """SmoothQuant on the named products of ``source`` (a graph with constant weights): their input
    ``X`` is multiplied by ``1 / s`` (a new Mul node) and the weight's input rows by ``s``, with
    ``s_j = amax(X_j)^alpha / amax(W_j)^(1-alpha)``; ``amax`` maps each product's input tensor name to
    ``amax(X_j)`` (:func:`activation_amax`). Writes ``target``; returns how many products were smoothed.
    The graph computes the same function (up to float rounding)."""
    import onnx  # the onnx extra: pip install hydra-hf[onnx]
    from onnx import numpy_helper  # the onnx extra: pip install hydra-hf[onnx]

    model = onnx.load(str(source))
    graph = model.graph
    nodes = {n.name: n for n in graph.node}
    done = 0
    for name in products:
        node = nodes[name]
        found = _weight(graph, node)
        if found is None or node.input[0] not in amax:
            continue
        init, w, axis = found
        x_max = np.maximum(amax[node.input[0]].astype(np.float64), 1e-5)  # (in,)
        w_max = np.maximum(np.abs(w).max(axis=1 - axis).astype(np.float64), 1e-5)  # (in,)
        if x_max.shape != w_max.shape:
            continue
        s = np.clip(x_max**alpha / w_max ** (1 - alpha), 1e-4, 1e4)  # (in,)
        w_new = w * (s[:, None] if axis == 0 else s[None, :])
        init.CopyFrom(numpy_helper.from_array(w_new.astype(w.dtype), init.name))
        inv_name = f"{name}{SMOOTH_SUFFIX}"
        graph.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), inv_name))
        scaled = f"{name}_smoothed_input"
        mul = onnx.helper.make_node("Mul", [node.input[0], inv_name], [scaled], name=f"{name}_smooth")
        index = list(graph.node).index(node)
        graph.node.insert(index, mul)
        node.input[0] = scaled
        done += 1
    onnx.save(model, str(target))
    return done


def batched_weight_products(graph: Any) -> list[str]:
    """MatMul / Gemm nodes whose weight is not one constant matrix (a computed tensor, or a stacked
    ``(M, in, out)`` weight such as the members' poolers and classifiers): ONNX Runtime's per-channel
    int8 product takes one scale per column of a 2-D weight only."""

    inits = {i.name: i for i in graph.initializer}
    out = []
    for node in graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            init = inits.get(node.input[1])
            if init is None or len(init.dims) != 2:
                out.append(node.name)
    return out


def _session(model_path: str | os.PathLike) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])


def _member_logits(session: Any, feeds: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
    """The graph's last output (the members' logits) over ``feeds``, concatenated on the batch axis."""
    name = session.get_outputs()[-1].name
    return np.concatenate([session.run([name], dict(feed))[0] for feed in feeds])


def quantize_dynamic_per_channel(source: str | os.PathLike, target: str | os.PathLike) -> dict[str, Any]:
    """ONNX Runtime dynamic quantisation of every product with a constant 2-D weight: int8 weights with
    one symmetric scale per output channel, uint8 activations with one range per batch at run time.
    Products with a batched ``(M, in, out)`` weight (the members' poolers and classifiers) stay fp32."""
    import onnx  # the onnx extra: pip install hydra-hf[onnx]
    from onnxruntime.quantization import QuantType, quantize_dynamic  # the onnx extra: pip install hydra-hf[onnx]

    excluded = batched_weight_products(onnx.load(str(source), load_external_data=False).graph)
    with quiet_exporter():
        quantize_dynamic(
            str(source),
            str(target),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm"],
            per_channel=True,
            nodes_to_exclude=excluded + [f"{n}_MatMul" for n in excluded],
        )
    ops = [node.op_type for node in onnx.load(str(target), load_external_data=False).graph.node]
    return {"MatMulInteger": ops.count("MatMulInteger") + ops.count("DynamicQuantizeMatMul"),
            "DynamicQuantizeLinear": ops.count("DynamicQuantizeLinear"),
            "MatMul (float, left)": ops.count("MatMul"), "Gemm (float, left)": ops.count("Gemm"),
            "kept_fp32": sorted(excluded)}


def smoothquant_int8(
    source: str | os.PathLike,
    target: str | os.PathLike,
    calibration: Sequence[Mapping[str, np.ndarray]],
    alphas: Sequence[float] = ALPHAS,
) -> dict[str, Any]:
    """The ``smoothquant`` recipe: fold constants, smooth the products fed by an activation (fc2) with
    the per-channel ``amax`` of their inputs on ``calibration``, quantise every 2-D product dynamically
    with per-channel int8 weights, and keep the ``alpha`` of ``alphas`` whose graph's member logits on
    ``calibration`` are closest (mean squared difference) to the fp32 graph's.

    Args:
        calibration: batches of graph inputs (numpy), labelled in-distribution data only.
    """
    import onnx  # the onnx extra: pip install hydra-hf[onnx]

    if not calibration:
        raise ValueError("the smoothquant int8 recipe needs calibration batches (in-distribution data); got none")
    target = Path(target)
    work = [target.with_name(f"{target.stem}.{tag}.onnx") for tag in ("folded", "smoothed", "trial")]
    folded, smoothed, trial = work
    try:
        folding = fold_constants(source, folded)
        products = activation_fed_products(onnx.load(str(folded), load_external_data=False).graph)
        nodes = {n.name: n for n in onnx.load(str(folded), load_external_data=False).graph.node}
        inputs = sorted({nodes[p].input[0] for p in products})
        amax = activation_amax(folded, inputs, calibration)
        reference = _member_logits(_session(folded), calibration)  # (N, M, C)
        errors: dict[float, dict[str, float]] = {}
        best, counts, smoothed_count = None, None, 0
        for alpha in alphas:
            n = smooth_products(folded, smoothed, products, amax, float(alpha))
            c = quantize_dynamic_per_channel(smoothed, trial)
            got = _member_logits(_session(trial), calibration)
            errors[float(alpha)] = {
                "member_logit_mse": float(((got - reference) ** 2).mean()),
                "label_agreement": float((got.mean(1).argmax(-1) == reference.mean(1).argmax(-1)).mean()),
            }
            if best is None or errors[float(alpha)]["member_logit_mse"] < errors[best]["member_logit_mse"]:
                best, counts, smoothed_count = float(alpha), c, n
                os.replace(trial, target)
        counts.update(recipe="smoothquant", alpha=best, alphas_tried=errors, smoothed_products=smoothed_count,
                      products_with_constant_weight=folding, calibration_examples=int(reference.shape[0]))
        return counts
    finally:
        for file in work:
            file.unlink(missing_ok=True)


class Int8Recipe:
    """An int8 recipe registered by name: ``run(source, target, calibration)`` writes the int8 graph and
    returns what it did (operator counts, the products kept fp32, calibrated settings)."""

    def __init__(
        self, name: str, run: Callable[..., dict[str, Any]], help: str, method: str, activations: str
    ) -> None:
        self.name, self.run, self.help, self.method, self.activations = name, run, help, method, activations


INT8_RECIPES: dict[str, Int8Recipe] = {}
DEFAULT_RECIPE = "smoothquant"


def register_recipe(recipe: Int8Recipe) -> Int8Recipe:
    INT8_RECIPES[recipe.name] = recipe
    return recipe


register_recipe(
    Int8Recipe(
        "smoothquant",
        smoothquant_int8,
        "default: constants folded (every member's projections quantisable), fc2's "
        "activation outliers migrated into its "
        "weights (SmoothQuant, alpha calibrated on --calibration-data), per-channel int8 weights on every product",
        method="fold constants + SmoothQuant (fc2) + onnxruntime.quantization.quantize_dynamic(per_channel=True)",
        activations="uint8, one range per tensor per batch at run time; fc2's input divided "
        "per channel by the SmoothQuant scales",
    )
)
def _per_tensor(keep_mlp_output_fp32: bool) -> Callable[..., dict[str, Any]]:
    """The earlier recipes: :func:`hydra_hf.onnx.graph.quantize_int8` (no folding, per-tensor weights)."""
    def run(source: str | os.PathLike, target: str | os.PathLike, calibration: Any = None) -> dict[str, Any]:
        return {
            **quantize_int8(source, target, keep_mlp_output_fp32),
            "recipe": "keep-fc2" if keep_mlp_output_fp32 else "all",
        }

    return run


register_recipe(Int8Recipe(
    "keep-fc2", _per_tensor(True),
    "the earlier default: per-tensor int8 weights, the MLP output projections kept fp32, the members' stacked "
    "projections left fp32 (not constants in the graph); slower",
    method="onnxruntime.quantization.quantize_dynamic", activations="uint8, quantised per batch at run time",
))
register_recipe(
    Int8Recipe(
        "all",
        _per_tensor(False),
        "every constant weight per-tensor int8, fc2 included, no smoothing (changed "
        "5.5 percent of the demo model's labels)",
        method="onnxruntime.quantization.quantize_dynamic",
        activations="uint8, quantised per batch at run time",
    )
)


def resolve_recipe(name: str | None = None, keep_mlp_output_fp32: bool | None = None) -> Int8Recipe:
    """The registered recipe ``name`` (default :data:`DEFAULT_RECIPE`); the older flag
    ``keep_mlp_output_fp32`` names ``keep-fc2`` (True) or ``all`` (False) when no name is given.

    Raises:
        HydraInputError: an unknown name, or a name and the flag that contradict each other.
    """
    legacy = None if keep_mlp_output_fp32 is None else ("keep-fc2" if keep_mlp_output_fp32 else "all")
    if name is not None and legacy is not None and name != legacy:
        raise HydraInputError(
            f"--int8-recipe {name!r} and --quantize-all ask for different int8 graphs; pass only one"
        )
    name = name or legacy or DEFAULT_RECIPE
    if name not in INT8_RECIPES:
        raise HydraInputError(f"--int8-recipe {name!r} is unknown; use one of {sorted(INT8_RECIPES)}")
    return INT8_RECIPES[name]


def calibration_feeds(
    batches: Iterable[Mapping[str, Any]],
    input_names: Sequence[str],
    *,
    extra: Mapping[str, np.ndarray] | None = None,
    max_examples: int = 512,
) -> list[dict[str, np.ndarray]]:
    """The graph inputs of the first ``max_examples`` examples of ``batches`` (torch tensors or numpy) as
    numpy arrays, each batch completed with ``extra`` (a two-tower graph's class prompts, tokenized)."""
    feeds, seen = [], 0
    for batch in batches:
        feed = {name: np.asarray(batch[name].numpy() if hasattr(batch[name], "numpy") else batch[name])
                for name in input_names if name in batch}
        feed.update({name: np.asarray(value) for name, value in (extra or {}).items() if name in input_names})
        missing = [name for name in input_names if name not in feed]
        if missing:
            raise ValueError(f"calibration batches lack the graph inputs {missing}; they have {sorted(batch)}")
        feeds.append(feed)
        seen += len(batch.get("labels", next(iter(feed.values()))))
        if seen >= max_examples:
            break
    return feeds
