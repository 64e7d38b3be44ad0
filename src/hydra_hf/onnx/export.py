"""Exporting a Hydra folder to ONNX: one graph that runs every member and returns the ensemble's and
the members' logits, with dynamic batch (and sequence) axes; optional int8 dynamic quantisation with
an accuracy report of int8 against fp32.

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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from .. import evaluation as ev
from ..convert.io import checkpoint_dir, from_pretrained, read_config
from ..data import data_spec_paths, parse_spec, resolve_dataset
from ..errors import HydraInputError
from ..evaluation import zero_shot_prompts
from ..evaluation.onnx_check import (
    OnnxZeroShotPredictor,
    quantization_report,
    report_markdown,
    write_quantization_report,
)
from ..families import family_of_config
from ..hub.audit import PACKAGED_CODE_DIR, packaged_code, sibling_imports
from ..modeling.configuration_hydra import check_calibration
from ..outputs import check_output, write_output_folder
from ..saving import copy_preprocessor
from ..version import __version__
from .graph import quiet_exporter
from .int8 import calibration_feeds, resolve_recipe
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


def _preprocessor(folder: Path, modality: str) -> Any | None:
    try:
        return load_preprocessor(folder, modality)
    except (OSError, ValueError) as exc:
        logger.warning("no %s preprocessor in %s (%s): the export folder will have none",
                       modality, folder, str(exc).splitlines()[0][:120])
        return None


def config_code_files(family: Any) -> list[str]:
    """The shipped files ``AutoConfig.from_pretrained(folder, trust_remote_code=True)`` runs for a folder of
    ``family``: the module its ``auto_map["AutoConfig"]`` names and, transitively, the sibling files that
    module imports (``configuration_hydra.py`` names ``pipeline_hydra.py``; transformers fetches every
    relative import it finds). They are copied from hydra_hf itself, never from the exported folder, so
    the shipped-code audit (:func:`hydra_hf.hub.audit.check_shipped_code`) recognises each one. Empty
    for a family whose config code hydra_hf does not ship (a family registered from outside)."""
    packaged = packaged_code()
    pending, found = [family.auto_map["AutoConfig"].rpartition(".")[0] + ".py"], []
    while pending:
        name = pending.pop()
        if name in found:
            continue
        if name not in packaged:
            return []
        found.append(name)
        pending += sorted(f"{module}.py" for module in sibling_imports(packaged[name][0], name))
    return sorted(found)


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
def export_onnx(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    opset: int = DEFAULT_OPSET,
    quantize: str | None = None,
    calibration_data: str | None = None,
    ood_data: Iterable[str] = (),
    overwrite: bool = False,
    data_options: dict[str, Any] | None = None,
    templates: Sequence[str] = DEFAULT_TEMPLATES,
    keep_mlp_output_fp32: bool | None = None,
    int8_recipe: str | None = None,
) -> Path:
    """Export the Hydra folder ``model_dir`` to an ONNX folder ``output_dir`` (written atomically).

    The folder holds ``model.onnx`` (fp32), with ``quantize="int8"`` also ``model_int8.onnx`` (the
    folder's default graph) and ``quantization_report.json`` / ``.md`` (int8 against fp32 on
    ``calibration_data``, labelled in-distribution data, and each of ``ood_data``), the Hydra
    ``config.json`` (its ``auto_map`` names only ``AutoConfig``) with the configuration code it runs
    (:func:`config_code_files`; no modeling code, no weights), the tokenizer / image processor,
    ``hydra_onnx.json`` and a README section describing the export.

    Args:
        opset: the ONNX opset (>= 18).
        data_options: for the report's data, as ``hydra-hf evaluate`` takes them: ``text_column``,
            ``label_column``, ``image_column``, ``max_samples``, ``batch_size``, ``max_length``.
        int8_recipe: int8 only: a recipe of :data:`hydra_hf.onnx.int8.INT8_RECIPES` (default
            ``"smoothquant"``: constants folded, fc2's activation outliers migrated into its weights with
            alpha calibrated on ``calibration_data``, per-channel int8 weights on every product).
        keep_mlp_output_fp32: the older switch: True is the recipe ``"keep-fc2"`` (the MLP output
            projections kept fp32, see :func:`~.graph.activation_fed_products`), False ``"all"``.
        templates: two-tower models (CLIP, SigLIP, open_clip): the prompt templates of the report's
            zero-shot classifier, each with one ``{}`` for a class name of ``calibration_data`` (an
            image folder with one sub-folder per class, or a label column of class names).

    Raises:
        HydraInputError: not a Hydra folder, onnx packages missing, a bad option or data set.
        HydraOutputError: ``output_dir`` exists (without ``overwrite``) or is not ours to replace.
    """
    require_onnx("onnx", "onnxruntime", "onnxscript")
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < DEFAULT_OPSET:
        raise HydraInputError(f"opset {opset!r} is not supported; the dynamo exporter needs opset >= {DEFAULT_OPSET}")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise HydraInputError(f"--quantize {quantize!r} is unknown; use one of {list(QUANTIZATIONS)}")

    recipe = resolve_recipe(int8_recipe, keep_mlp_output_fp32)
    ood_data = list(ood_data)
    if quantize is None and (calibration_data or ood_data):
        raise HydraInputError(
            "--calibration-data and --ood-data feed the quantisation report; pass --quantize int8 too"
        )
    if quantize is not None and not calibration_data:
        raise HydraInputError(
            "--quantize int8 needs --calibration-data (labelled in-distribution data, e.g. "
            "rotten_tomatoes:validation) to measure the int8 model against the fp32 one"
        )
    for key in ("batch_size", "max_length", "max_samples"):
        value = (data_options or {}).get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise HydraInputError(f"--{key.replace('_', '-')} {value!r}: give a positive whole number")
    # every file it reads (the folder, the report's data): the output never holds one
    inputs = [Path(model_dir), *data_spec_paths(calibration_data),
              *(p for spec in ood_data for p in data_spec_paths(_named_spec(spec)[1]))]
    check_output(output_dir, command=COMMAND, overwrite=overwrite, inputs=inputs)
    templates = list(templates)
    if not templates or not all(isinstance(t, str) and t.count("{}") == 1 for t in templates):
        raise HydraInputError(
            f"--class-template {templates!r}: every template needs exactly one {{}} for the class name"
        )
    model, family, config_data = load_hydra_folder(model_dir)
    folder = Path(model_dir)
    try:  # its pipelines apply a stored calibration: one that is not what `hydra-hf calibrate` stores fails now
        check_calibration(config_data.get("calibration"), getattr(model.config, "num_labels", None))
    except ValueError as exc:
        raise HydraInputError(f"{str(folder)!r}: {exc}") from None
    preprocessor = _preprocessor(folder, family.modality)
    # the report's data is read before the (slow) export: a bad data option fails at once
    loaders, class_names = _report_loaders(model, preprocessor, family.modality, calibration_data, ood_data,
                                           data_options or {}) if quantize else (None, None)

    names = graph_inputs(model, family.modality, getattr(preprocessor, "tokenizer", preprocessor))
    output_keys = output_keys_for(family.task)
    decoder = "AutoModelForCausalLM" in family.model_class_names  # a last-token sequence classifier
    if decoder and model.config.pad_token_id is None:
        raise HydraInputError(
            f"{str(folder)!r} is a decoder classifier without pad_token_id, so it cannot pool padded batches; set "
            "pad_token_id in its config.json (e.g. the tokenizer's eos id, as "
            "`hydra-hf finetune` does) and export again"
        )
    example = example_inputs(model.config, names, batch=2, seq=8, images=3, seed=0)
    # a decoder's batches are often padded on the left: the check covers both sides
    other = example_inputs(model.config, names, batch=5, seq=13, images=2, seed=1, left_padding=decoder)

    def write(tmp: Path) -> None:
        logger.info(
            "exporting %s (%s, %d members) to ONNX opset %d", folder, family.name, model.config.num_members, opset
        )
        export_module(OnnxGraph(model, output_keys), example, dynamic_shapes(names, family.modality), output_keys,
                      tmp / FP32_FILE, opset=opset)
        files = {FP32_FILE: {"precision": "fp32", "parameters": count_weights(tmp / FP32_FILE),
                             "size_mb": round((tmp / FP32_FILE).stat().st_size / 2**20, 3)}}
        if quantize == "int8":
            # calibration: the first examples of the labelled ID data (two towers: with the class prompts)

            prompts = None if class_names is None else dict(preprocessor.tokenizer(
                zero_shot_prompts(class_names, templates), padding=True, return_tensors="np"))
            counts = recipe.run(tmp / FP32_FILE, tmp / INT8_FILE, calibration_feeds(loaders[0], names, extra=prompts))
            files[INT8_FILE] = {"precision": "int8", "parameters": count_weights(tmp / INT8_FILE),
                                "size_mb": round((tmp / INT8_FILE).stat().st_size / 2**20, 3),
                                "quantized_operators": counts}
        config = {k: v for k, v in config_data.items() if k not in ("auto_map", "custom_pipelines")}
        code = config_code_files(family)
        if code:  # AutoConfig.from_pretrained(folder, trust_remote_code=True) opens it without hydra_hf
            config["auto_map"] = {"AutoConfig": family.auto_map["AutoConfig"]}
            for name in code:
                shutil.copyfile(PACKAGED_CODE_DIR / name, tmp / name)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if preprocessor is not None:
            copy_preprocessor(folder, tmp)
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
            "default_file": INT8_FILE if quantize == "int8" else FP32_FILE,
            "quantization": None
            if quantize is None
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
        report = None
        if quantize == "int8":
            int8 = OnnxHydraModel.from_pretrained(tmp, file_name=INT8_FILE)
            metadata["verification"]["max_abs_diff_int8"] = max(
                compare_with_eager(model, int8, x, output_keys) for x in (example, other))
            settings = {"calibration_data": calibration_data, "ood_data": list(loaders[1]), "int8_recipe": recipe.name,
                        **(data_options or {})}
            predictor = None
            if family.modality == "image-text":
                settings.update(class_names=class_names, templates=templates)

                def predictor(graph):
                    return OnnxZeroShotPredictor(graph, class_names, templates, preprocessor.tokenizer)
            report = quantization_report(fp32, int8, loaders, settings=settings, predictor=predictor)
            write_quantization_report(report, tmp)
        (tmp / EXPORT_METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
        (tmp / "README.md").write_text(export_card(metadata, report))

    runtime_log = logging.getLogger("hydra_hf.onnx.runtime")  # its "loaded TMP/model.onnx" of the checks above
    level = runtime_log.level
    runtime_log.setLevel(logging.WARNING)  # would name the temporary folder, not the output
    try:
        out = write_output_folder(output_dir, write, command=COMMAND, overwrite=overwrite, inputs=inputs)
    finally:
        runtime_log.setLevel(level)
    logger.info("wrote %s", out)
    return out


def _report_loaders(model, preprocessor, modality, calibration_data, ood_data, options):
    if preprocessor is None:
        raise HydraInputError(
            "the Hydra folder has no tokenizer / image processor, which the quantisation report needs"
        )
    zero_shot = modality == "image-text"  # images classified against class prompts
    cols = dict(text_column=options.get("text_column", "text") if modality == "text" else None,
                label_column=options.get("label_column", "label"),
                image_column=options.get("image_column") if modality != "text" else None)
    batch_size, max_length = int(options.get("batch_size", 32)), int(options.get("max_length", 128))

    def data(spec: str, labelled: bool):
        classifier = labelled and not zero_shot  # zero-shot classes come from the data itself
        return resolve_dataset(spec, **cols, require_labels=labelled, max_samples=options.get("max_samples"),
                               num_labels=model.config.num_labels if classifier else None,
                               label2id=model.config.label2id if classifier else None)

    def loader(dataset):
        if zero_shot:
            return ev.make_loader(dataset, preprocessor.image_processor, "image", batch_size=batch_size)
        return ev.make_loader(dataset, preprocessor, modality, batch_size=batch_size, max_length=max_length)

    id_data = data(calibration_data, True)
    class_names = None
    if zero_shot:
        names = getattr(id_data.features["label"], "names", None)
        if not names:
            raise HydraInputError(
                f"--calibration-data {calibration_data!r} has integer labels without class names; a zero-shot model "
                "needs them for its prompts: give an image folder with one sub-folder per class"
            )
        class_names = list(names)
    id_loader = loader(id_data)
    oods = {}
    for spec in ood_data:
        name, path = _named_spec(spec)
        if name in oods:
            raise HydraInputError(f"--ood-data name {name!r} is used twice; write NAME=SPEC to tell them apart")
        ood = data(path, False)
        oods[name] = loader(ood.remove_columns([c for c in ("label",) if c in ood.column_names]))
    return (id_loader, oods), class_names


def _named_spec(spec: str) -> tuple[str, str]:
    """``(name, data spec)`` of an ``--ood-data`` value: ``NAME=SPEC``, or ``SPEC`` named by its path."""
    if "=" in spec:
        name, _, path = spec.partition("=")
        return name.strip(), path.strip()
    return parse_spec(spec)[0], spec


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


def export_card(metadata: dict[str, Any], report: dict[str, Any] | None) -> str:
    """The README of an export folder: what the graph holds and how to run it."""
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
    if report is not None:
        lines += ["", report_markdown(report)]
    return "\n".join(lines) + "\n"
