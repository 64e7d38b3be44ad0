"""Exporting a Hydra folder to ONNX: one graph that runs every member and returns the ensemble's and
the members' logits, with dynamic batch (and sequence) axes; optionally its int8 graph
(:func:`write_export` writes both, checked, with the folder's config and metadata; ``hydra-hf export``,
with the int8 graph's quality report, is :mod:`hydra_hf.workflows.export`).

The graph is made by ``torch.onnx.export(dynamo=True)`` (``torch.export`` + onnxscript): the fused
forward pass has no data-dependent Python branch, so one traced graph serves every batch size,
sequence length and padding pattern. The TorchScript exporter (``dynamo=False``) cannot export it:
the per-member LayerNorm's normalised shape is read from a tensor's size, which it refuses to make
dynamic (docs/deploy.md). Every export is checked: ONNX Runtime's outputs on two input sizes (one
padded) are compared with PyTorch's before the folder is written.
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import json
import logging
import math
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from ..convert.io import checkpoint_dir, from_pretrained, read_config
from ..errors import HydraInputError
from ..families import family_of_config
from ..saving import copy_preprocessor
from ..version import __version__
from .graph import quiet_exporter
from .int8 import Int8Recipe, calibration_feeds
from .runtime import EXPORT_FORMAT, EXPORT_METADATA, INSTALL_HINT, OnnxHydraModel, load_preprocessor, require_onnx

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 18  # the dynamo exporter's first supported opset; onnxruntime >= 1.14 runs it
FP32_FILE = "model.onnx"
INT8_FILE = "model_int8.onnx"
QUANTIZATIONS = ("int8",)
DEFAULT_TEMPLATES = ("a photo of a {}.",)  # two-tower models: the report's zero-shot prompt
# ONNX Runtime's outputs must equal PyTorch's within this, or the export is a bug (fp32)
VERIFY_ATOL = 1e-4
COMMAND = "export"


# ------------------------------------------------------------------------------ the graph
class OnnxGraph(nn.Module):
    """The module that is exported: named tensor inputs in, a tuple of the chosen outputs out.

    Inputs the graph does not take are left out of the call (the model's defaults apply).
    """

    def __init__(self, model: nn.Module, output_keys: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.output_keys = tuple(output_keys)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                 "pixel_values": pixel_values}
        out = self.model(**{k: v for k, v in given.items() if v is not None}, return_dict=True)
        return tuple(out[k] for k in self.output_keys)


def output_keys_for(task: str) -> tuple[str, str]:
    """The model outputs the graph returns: the ensemble's logits and the members'."""
    if task == "zero-shot-image-classification":
        return ("logits_per_image", "member_logits_per_image")
    return ("logits", "member_logits")


def graph_inputs(model: nn.Module, modality: str, tokenizer: Any | None) -> list[str]:
    """The graph's inputs: ``pixel_values`` for images; for text ``input_ids``, ``attention_mask`` and
    ``token_type_ids`` when both the model and its tokenizer use them."""
    names = []
    if modality in ("text", "image-text"):
        names += ["input_ids", "attention_mask"]
        accepted = inspect.signature(model.forward).parameters
        made = (
            getattr(tokenizer, "model_input_names", ["token_type_ids"])
            if tokenizer is not None
            else ["token_type_ids"]
        )
        if modality == "text" and "token_type_ids" in accepted and "token_type_ids" in made:
            names.append("token_type_ids")
    if modality in ("image", "image-text"):
        names.append("pixel_values")
    return names


def _vision_size(config: Any) -> tuple[int, int]:
    base = dict(config.base_config)
    vision = base.get("vision_config") or base
    return int(vision.get("num_channels", 3)), int(vision.get("image_size", 224))


def example_inputs(
    config: Any, names: Sequence[str], batch: int, seq: int, images: int, seed: int, left_padding: bool = False
) -> dict[str, torch.Tensor]:
    """Random inputs of the graph's names; the text batch has padded rows (the masks mask something), padded
    on the right or, with ``left_padding``, on the left (a decoder's batches), with the model's pad token in
    the padded places when it has one (a decoder classifier pools the last token that is not padding).

    Shape:
        input_ids, attention_mask, token_type_ids: ``(batch, seq)``; pixel_values: ``(images, C, H, W)``.
    """
    g = torch.Generator().manual_seed(seed)
    base = dict(config.base_config)
    text = base.get("text_config") or base
    out = {}
    if "input_ids" in names:
        vocab = int(text.get("vocab_size", 100))
        ids = torch.randint(min(5, vocab - 1), vocab, (batch, seq), generator=g)
        mask = torch.ones_like(ids)
        mask[0, max(seq // 2, 1):] = 0  # a padded row
        if batch > 2:
            mask[2, max(seq - 2, 1):] = 0
        if left_padding:
            mask = mask.flip(-1)
        pad = getattr(config, "pad_token_id", None)
        if isinstance(pad, int) and 0 <= pad < vocab:
            ids = ids.masked_fill(mask == 0, pad)
        out["input_ids"], out["attention_mask"] = ids, mask
        if "token_type_ids" in names:
            out["token_type_ids"] = torch.zeros_like(ids)
    if "pixel_values" in names:
        channels, size = _vision_size(config)
        out["pixel_values"] = torch.randn(images, channels, size, size, generator=g)
    return out


def dynamic_shapes(names: Sequence[str], modality: str) -> dict[str, dict[int, Any]]:
    """Named dynamic axes: ``batch`` and ``sequence`` (text), ``batch`` (images), and for two towers
    ``texts`` / ``sequence`` / ``images``."""
    batch, seq = Dim("batch"), Dim("sequence")
    texts = Dim("texts") if modality == "image-text" else batch
    images = Dim("images") if modality == "image-text" else batch
    shapes = {}
    for name in names:
        shapes[name] = {0: images} if name == "pixel_values" else {0: texts, 1: seq}
    return shapes


def export_module(
    graph: nn.Module,
    example: dict[str, torch.Tensor],
    shapes: dict[str, dict[int, Any]],
    output_names: Sequence[str],
    path: str | os.PathLike,
    *,
    opset: int = DEFAULT_OPSET,
) -> Path:
    """``torch.onnx.export(dynamo=True)`` of ``graph`` called with ``example`` as keyword arguments.

    Used for Hydra models (:func:`export_onnx`) and, by the benchmark, for stock models.
    """
    require_onnx("onnx", "onnxscript")
    path = Path(path)
    with quiet_exporter(), torch.no_grad():
        program = torch.onnx.export(
            graph.eval(), (), str(path), kwargs=dict(example), dynamo=True, dynamic_shapes=dict(shapes),
            input_names=list(example), output_names=list(output_names), opset_version=int(opset),
            external_data=False, verbose=False,
        )
    if program is None or not path.is_file():
        raise RuntimeError(f"torch.onnx.export wrote no graph to {str(path)!r}")
    return path


def count_weights(path: str | os.PathLike) -> int:
    """Elements of a graph's initializers (its weights, float or int8)."""
    (onnx,) = require_onnx("onnx")
    total = 0
    for init in onnx.load(str(path), load_external_data=False).graph.initializer:
        n = 1
        for d in init.dims:
            n *= int(d)
        total += n
    return total


# ------------------------------------------------------------------------- loading the folder
def load_hydra_folder(path: str | os.PathLike) -> tuple[nn.Module, Any, dict[str, Any]]:
    """A Hydra folder's task model, loaded with hydra_hf's own classes (the folder's shipped code is
    never run), its family and its ``config.json`` (as data).

    Raises:
        HydraInputError: the folder is missing, has no config, or is not a Hydra Ensemble.
    """
    folder = checkpoint_dir(path, what="Hydra model")
    config = read_config(folder)
    model_type = str(config.get("model_type", ""))
    if not model_type.startswith("hydra_ensemble") or not config.get("base_model_type"):
        raise HydraInputError(
            f"{str(folder)!r} is not a Hydra Ensemble folder (config.json has "
            f"model_type={config.get('model_type')!r}); "
            "export a folder written by `hydra-hf convert` or `hydra-hf finetune`"
        )
    family = family_of_config(config)
    causal = [str(a) for a in config.get("architectures") or [] if str(a).endswith("ForCausalLM")]
    if causal:
        raise HydraInputError(
            f"{str(folder)!r} is a causal LM ({causal[0]}); ONNX export covers classifiers only (no past key values): "
            "run it with PyTorch (AutoModelForCausalLM.from_pretrained(folder, "
            "trust_remote_code=True), its generate())"
        )
    model = from_pretrained(family.model_class(), folder, remedy=(
        "hydra-hf export never runs a folder's code (it loads Hydra folders with its own classes): remove those "
        "auto_map entries, or export the folder `hydra-hf convert` wrote"))
    return model.eval(), family, config


def folder_preprocessor(folder: Path, modality: str) -> Any | None:
    """The tokenizer / image processor of a Hydra folder, or None (with a warning) when it has none."""
    try:
        return load_preprocessor(folder, modality)
    except (OSError, ValueError) as exc:
        logger.warning("no %s preprocessor in %s (%s): the export folder will have none",
                       modality, folder, str(exc).splitlines()[0][:120])
        return None


# ------------------------------------------------------------------------------ verification
def compare_with_eager(model: nn.Module, onnx_model: OnnxHydraModel, inputs: dict[str, torch.Tensor],
                       output_keys: Sequence[str]) -> float:
    """Largest absolute difference between ONNX Runtime's and PyTorch's outputs on ``inputs``."""
    with torch.no_grad():
        expected = model(**inputs, return_dict=True)
    if not all(bool(torch.isfinite(expected[k]).all()) for k in output_keys):
        raise HydraInputError(
            "the model's outputs are not finite (NaN or inf) on random inputs, so no export can be checked against "
            "them; its weights are too large or broken: export a checkpoint saved before training diverged"
        )
    got = onnx_model(**inputs)
    return max(float((got[k] - expected[k]).abs().max()) for k in output_keys)


# ----------------------------------------------------------------------------- the export
def write_export(
    tmp: Path,
    model: nn.Module,
    family: Any,
    config_data: dict[str, Any],
    *,
    source: Path,
    preprocessor: Any | None,
    opset: int,
    recipe: Int8Recipe | None,
    calibration_batches: Iterable[Mapping[str, Any]] | None = None,
    prompts: dict[str, Any] | None = None,
    code_files: Mapping[str, Path] | None = None,
) -> tuple[dict[str, Any], OnnxHydraModel, OnnxHydraModel | None]:
    """Write an export folder's graphs and files into ``tmp``: ``model.onnx`` (fp32), with an int8 ``recipe``
    also ``model_int8.onnx`` (its activations calibrated on ``calibration_batches``, two towers with the class
    ``prompts``), the Hydra ``config.json`` (its ``auto_map`` names only ``AutoConfig`` when ``code_files``,
    name -> packaged file, are copied beside it), the preprocessor of ``source`` and ``hydra_onnx.json``.

    Every graph is checked: ONNX Runtime's outputs on two input sizes (one padded; a decoder's on the left)
    against PyTorch's, fp32 within :data:`VERIFY_ATOL` or a ``RuntimeError``.

    Returns:
        The metadata written (with its ``verification``), the fp32 graph and the int8 one (None without a recipe).
    """
    names = graph_inputs(model, family.modality, getattr(preprocessor, "tokenizer", preprocessor))
    output_keys = output_keys_for(family.task)
    decoder = "AutoModelForCausalLM" in family.model_class_names  # a last-token sequence classifier
    example = example_inputs(model.config, names, batch=2, seq=8, images=3, seed=0)
    # a decoder's batches are often padded on the left: the check covers both sides
    other = example_inputs(model.config, names, batch=5, seq=13, images=2, seed=1, left_padding=decoder)
    logger.info("exporting %s (%s, %d members) to ONNX opset %d", source, family.name, model.config.num_members, opset)
    export_module(OnnxGraph(model, output_keys), example, dynamic_shapes(names, family.modality), output_keys,
                  tmp / FP32_FILE, opset=opset)
    files = {FP32_FILE: {"precision": "fp32", "parameters": count_weights(tmp / FP32_FILE),
                         "size_mb": round((tmp / FP32_FILE).stat().st_size / 2**20, 3)}}
    if recipe is not None:
        # calibration: the first examples of the labelled ID data (two towers: with the class prompts)
        counts = recipe.run(tmp / FP32_FILE, tmp / INT8_FILE, calibration_feeds(calibration_batches, names,
                                                                                extra=prompts))
        files[INT8_FILE] = {"precision": "int8", "parameters": count_weights(tmp / INT8_FILE),
                            "size_mb": round((tmp / INT8_FILE).stat().st_size / 2**20, 3),
                            "quantized_operators": counts}
    config = {k: v for k, v in config_data.items() if k not in ("auto_map", "custom_pipelines")}
    if code_files:  # AutoConfig.from_pretrained(folder, trust_remote_code=True) opens it without hydra_hf
        config["auto_map"] = {"AutoConfig": family.auto_map["AutoConfig"]}
        for name, packaged in code_files.items():
            shutil.copyfile(packaged, tmp / name)
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if preprocessor is not None:
        copy_preprocessor(source, tmp)
    axes = dynamic_shapes(names, family.modality)
    metadata = {
        "format": EXPORT_FORMAT,
        "version": 1,
        "hydra_hf": __version__,
        "family": family.name,
        "modality": family.modality,
        "task": family.task,
        "num_members": int(model.config.num_members),
        "num_labels": int(getattr(model.config, "num_labels", 0) or 0)
        if family.modality != "image-text"
        else None,
        "opset": int(opset),
        "exporter": "torch.onnx.export(dynamo=True)",
        "versions": _versions(),
        "inputs": {n: _axes_doc(n, axes[n]) for n in names},
        "outputs": _outputs_doc(output_keys, family.modality, softmax=family.uncertainty_pipelines),
        "files": files,
        "default_file": INT8_FILE if recipe is not None else FP32_FILE,
        "quantization": None
        if recipe is None
        else {
            "recipe": recipe.name,
            "method": recipe.method,
            "weight_type": "QInt8",
            "op_types": ["MatMul", "Gemm"],
            "activations": recipe.activations,
            "kept_fp32": {"keep-fc2": "MLP output projections (products fed by an activation)", "all": "none"}.get(
                recipe.name, "products with a stacked (M, in, out) weight (the members' poolers and classifiers)"
            ),
            "kept_fp32_products": len(files[INT8_FILE]["quantized_operators"]["kept_fp32"]),
            **(
                {"smoothquant_alpha": files[INT8_FILE]["quantized_operators"]["alpha"]}
                if recipe.name == "smoothquant"
                else {}
            ),
        },
    }
    (tmp / EXPORT_METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
    # the export's own check: ONNX Runtime == PyTorch on the example and on other sizes (padded)
    fp32 = OnnxHydraModel.from_pretrained(tmp, file_name=FP32_FILE)
    diffs = [compare_with_eager(model, fp32, x, output_keys) for x in (example, other)]
    if not all(math.isfinite(d) and d <= VERIFY_ATOL for d in diffs):  # NaN > atol is False: test each
        raise RuntimeError(
            f"the ONNX graph differs from PyTorch by {max(diffs):.2e} (> {VERIFY_ATOL}); please report this"
        )
    metadata["verification"] = {
        "max_abs_diff_fp32": max(diffs), "atol": VERIFY_ATOL,
        "inputs": [_describe(x) for x in (example, other)],
    }
    int8 = None
    if recipe is not None:
        int8 = OnnxHydraModel.from_pretrained(tmp, file_name=INT8_FILE)
        metadata["verification"]["max_abs_diff_int8"] = max(
            compare_with_eager(model, int8, x, output_keys) for x in (example, other))
    (tmp / EXPORT_METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
    return metadata, fp32, int8


def _axes_doc(name: str, axes: dict[int, Any]) -> dict[str, Any]:
    dims = {
        "input_ids": ["{}", "sequence"],
        "attention_mask": ["{}", "sequence"],
        "token_type_ids": ["{}", "sequence"],
        "pixel_values": ["{}", "channels", "height", "width"],
    }[name]
    first = axes[0].__name__
    dtype = "float32" if name == "pixel_values" else "int64"
    return {"dtype": dtype, "shape": [d.format(first) for d in dims]}


def _outputs_doc(keys: Sequence[str], modality: str, softmax: bool = True) -> dict[str, Any]:
    if modality == "image-text":
        ensemble = ("log of the mean of the members' softmaxes over the texts" if softmax else
                    "logit of the mean of the members' sigmoids (as the PyTorch model returns it)")
        return {keys[0]: {"dtype": "float32", "shape": ["images", "texts"], "what": ensemble},
                keys[1]: {"dtype": "float32", "shape": ["images", "members", "texts"],
                          "what": "every member's scaled image-text similarities"}}
    return {keys[0]: {"dtype": "float32", "shape": ["batch", "labels"],
                      "what": "log of the mean of the members' softmaxes (the ensemble)"},
            keys[1]: {"dtype": "float32", "shape": ["batch", "members", "labels"], "what": "every member's logits"}}


def _describe(inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    out = {k: list(v.shape) for k, v in inputs.items()}
    if "attention_mask" in inputs:
        mask = inputs["attention_mask"]
        out["padded_rows"] = int((mask == 0).any(dim=1).sum())
        if out["padded_rows"]:
            out["padding_side"] = "left" if bool((mask[:, 0] == 0).any()) else "right"
    return out


def _versions() -> dict[str, str]:
    out = {"torch": torch.__version__}
    for name in ("onnx", "onnxruntime", "onnxscript", "transformers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "?"
    return out


def export_card(metadata: dict[str, Any], report_section: str | None = None) -> str:
    """The README of an export folder: what the graph holds and how to run it (and ``report_section``, the
    int8 graph's quality report in Markdown, after it)."""
    inputs = "\n".join(f"| `{n}` | {d['dtype']} | ({', '.join(d['shape'])}) |" for n, d in metadata["inputs"].items())
    outputs = "\n".join(f"| `{n}` | {d['dtype']} | ({', '.join(d['shape'])}) | {d['what']} |"
                        for n, d in metadata["outputs"].items())
    files = "\n".join(f"| `{n}` | {f['precision']} | {f['parameters'] / 1e6:.2f} M | {f['size_mb']:.1f} MB |"
                      for n, f in metadata["files"].items())
    v = metadata["verification"]
    check = f"ONNX Runtime fp32 vs PyTorch: max |diff| = {v['max_abs_diff_fp32']:.1e} on inputs {v['inputs']}"
    if "max_abs_diff_int8" in v:
        check += f"; int8 vs PyTorch: {v['max_abs_diff_int8']:.1e}"
    quant = "none (fp32)."
    if metadata["quantization"]:
        q = metadata["quantization"]
        quant = (
            f"recipe `{q.get('recipe', 'keep-fc2')}`, `{q['method']}`: {q['weight_type']} weights on "
            f"{', '.join(q['op_types'])} ({metadata['files'][INT8_FILE]['quantized_operators']['MatMulInteger']} "
            f"MatMulInteger nodes; {q.get('kept_fp32_products', 0)} products kept in fp32: "
            f"{q.get('kept_fp32', 'none')}), {q['activations']}. `{INT8_FILE}` is the folder's default graph; "
            f"`{FP32_FILE}` is kept for comparison."
        )
    lines = [
        f"# Hydra Ensemble ({metadata['family']}, {metadata['num_members']} members) — ONNX export",
        "",
        "Written by `hydra-hf export --format onnx` (docs/deploy.md). One ONNX graph runs every member in one",
        "pass and returns the ensemble's and the members' logits; uncertainty is the members' disagreement.",
        "",
        f"- opset {metadata['opset']}, exporter `{metadata['exporter']}`; versions: "
        + ", ".join(f"{k} {val}" for k, val in metadata["versions"].items()),
        f"- quantisation: {quant}",
        f"- check at export: {check}",
        "",
        "| input | dtype | shape |", "|---|---|---|", inputs, "",
        "| output | dtype | shape | what |", "|---|---|---|---|", outputs, "",
        "| file | precision | weights | size |", "|---|---|---|---|", files, "",
        "```python",
        "import hydra_hf.onnx",
        "model = hydra_hf.onnx.OnnxHydraModel.from_pretrained(\"THIS_FOLDER\")  # onnxruntime, CPUExecutionProvider",
        "pipe = hydra_hf.onnx.pipeline(\"THIS_FOLDER\")  # label, score, uncertainty, member_labels, flagged",
        "```",
        "",
        "Without hydra_hf: `onnxruntime.InferenceSession(\"model.onnx\")`, feed the tokenizer's / image processor's",
        "numpy outputs (`return_tensors=\"np\"`, int64 ids), and read the labels from `config.json`'s `id2label`",
        "(`transformers.AutoConfig.from_pretrained(\"THIS_FOLDER\", trust_remote_code=True)` reads the whole config).",
        f"`hydra-hf evaluate --model THIS_FOLDER ...` evaluates it like a PyTorch folder ({INSTALL_HINT}).",
    ]
    if report_section is not None:
        lines += ["", report_section]
    return "\n".join(lines) + "\n"
