"""``hydra-hf export``: a Hydra folder as one ONNX graph (ensemble and member logits, dynamic batch and
sequence axes), optionally int8 with a report of the int8 graph against the fp32 one.

:func:`export` reads an :class:`ExportSpec`, loads the folder (:func:`hydra_hf.onnx.export.load_hydra_folder`:
hydra_hf's own classes, the folder's code never runs), reads the report's data before the (slow) export, lets
:func:`hydra_hf.onnx.export.write_export` write and check the graphs, measures int8 against fp32 with the
evaluation code (:mod:`hydra_hf.evaluation.onnx_check`) and writes the owned output folder atomically.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import evaluation as ev
from ..data import data_spec_paths, parse_spec, resolve_dataset, zero_shot_prompts
from ..errors import HydraInputError
from ..evaluation.onnx_check import (
    OnnxZeroShotPredictor,
    quantization_report,
    report_markdown,
    write_quantization_report,
)
from ..hub.audit import PACKAGED_CODE_DIR, packaged_code, sibling_imports
from ..modeling.configuration_hydra import check_calibration
from ..onnx.export import (
    COMMAND,
    DEFAULT_OPSET,
    DEFAULT_TEMPLATES,
    QUANTIZATIONS,
    export_card,
    folder_preprocessor,
    load_hydra_folder,
    write_export,
)
from ..onnx.int8 import resolve_recipe
from ..onnx.runtime import require_onnx
from ..outputs import check_output, write_output_folder

__all__ = ["FORMATS", "ExportSpec", "config_code_files", "export", "export_onnx"]

logger = logging.getLogger(__name__)

FORMATS = ("onnx",)  # a second format is its own package beside onnx/ and one branch of export()


@dataclass(frozen=True)
class ExportSpec:
    """What ``hydra-hf export`` writes; one field per option of the command.

    Attributes:
        model: the Hydra folder to export (``hydra-hf convert``'s or ``finetune``'s output).
        output: the export folder (must not exist or be empty, unless ``overwrite``).
        format: the export format, one of :data:`FORMATS`.
        opset: the ONNX opset (>= 18).
        quantize: ``"int8"``: also the int8 graph (the folder's default) and its quality report; needs
            ``calibration_data``.
        int8_recipe: a recipe of :data:`hydra_hf.onnx.int8.INT8_RECIPES` (default ``"smoothquant"``).
        keep_mlp_output_fp32: the older switch: True is the recipe ``"keep-fc2"``, False ``"all"``
            (``--quantize-all``).
        calibration_data, ood_data: labelled in-distribution data and OOD sets (``SPEC`` or ``NAME=SPEC``) of
            the int8 report, as ``hydra-hf evaluate`` takes them.
        templates: two-tower models: the prompt templates of the report's zero-shot classifier, each with one
            ``{}`` for a class name of ``calibration_data``.
        text_column, label_column, image_column, max_samples, batch_size, max_length: the report's data.
        overwrite: replace ``output`` when an earlier ``hydra-hf export`` wrote it.

    Raises:
        HydraInputError: an unknown format, quantisation, opset or recipe, report data without ``quantize`` (or
            ``quantize`` without it), a count that is not a positive whole number, a template without one ``{}``.
    """

    model: str | os.PathLike
    output: str | os.PathLike
    format: str = "onnx"
    opset: int = DEFAULT_OPSET
    quantize: str | None = None
    int8_recipe: str | None = None
    keep_mlp_output_fp32: bool | None = None
    calibration_data: str | None = None
    ood_data: Sequence[str] = field(default_factory=list)
    templates: Sequence[str] = DEFAULT_TEMPLATES
    text_column: str = "text"
    label_column: str = "label"
    image_column: str | None = None
    max_samples: int | None = None
    batch_size: int = 32
    max_length: int = 128
    overwrite: bool = False

    def __post_init__(self) -> None:
        if str(self.format).lower() not in FORMATS:
            raise HydraInputError(f"--format {self.format!r} is not supported; use one of {list(FORMATS)}")
        if self.quantize is not None and str(self.quantize).lower() not in QUANTIZATIONS:
            raise HydraInputError(f"--quantize {self.quantize!r} is unknown; use one of {list(QUANTIZATIONS)}")
        if (self.keep_mlp_output_fp32 is not None or self.int8_recipe) and self.quantize is None:
            raise HydraInputError("--quantize-all / --int8-recipe change the int8 graph; pass --quantize int8 too")
        if isinstance(self.opset, bool) or not isinstance(self.opset, int) or self.opset < DEFAULT_OPSET:
            raise HydraInputError(f"opset {self.opset!r} is not supported; the dynamo exporter needs opset >= "
                                  f"{DEFAULT_OPSET}")
        self.recipe()  # an unknown recipe, or a recipe and --quantize-all that disagree
        if self.quantize is None and (self.calibration_data or self.ood_data):
            raise HydraInputError(
                "--calibration-data and --ood-data feed the quantisation report; pass --quantize int8 too"
            )
        if self.quantize is not None and not self.calibration_data:
            raise HydraInputError(
                "--quantize int8 needs --calibration-data (labelled in-distribution data, e.g. "
                "rotten_tomatoes:validation) to measure the int8 model against the fp32 one"
            )
        for key in ("batch_size", "max_length", "max_samples"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise HydraInputError(f"--{key.replace('_', '-')} {value!r}: give a positive whole number")
        templates = list(self.templates)
        if not templates or not all(isinstance(t, str) and t.count("{}") == 1 for t in templates):
            raise HydraInputError(
                f"--class-template {templates!r}: every template needs exactly one {{}} for the class name"
            )

    def recipe(self) -> Any:
        """The int8 recipe (:class:`hydra_hf.onnx.int8.Int8Recipe`) the options name."""
        return resolve_recipe(self.int8_recipe, self.keep_mlp_output_fp32)

    def inputs(self) -> list[Path]:
        """Every file it reads (the folder, the report's data): the output never holds one."""
        return [Path(self.model), *data_spec_paths(self.calibration_data),
                *(p for spec in self.ood_data for p in data_spec_paths(_named_spec(spec)[1]))]


def export(spec: ExportSpec) -> Path:
    """Export ``spec.model`` to the ONNX folder ``spec.output`` (written atomically) and return it.

    The folder holds ``model.onnx`` (fp32), with ``quantize="int8"`` also ``model_int8.onnx`` (the folder's
    default graph) and ``quantization_report.json`` / ``.md`` (int8 against fp32 on ``calibration_data`` and
    each of ``ood_data``), the Hydra ``config.json`` (its ``auto_map`` names only ``AutoConfig``) with the
    configuration code it runs (:func:`config_code_files`; no modeling code, no weights), the tokenizer /
    image processor, ``hydra_onnx.json`` and a README describing the export.

    Raises:
        HydraInputError: not a Hydra folder, onnx packages missing, a bad data set.
        HydraOutputError: ``output`` exists (without ``overwrite``) or is not ours to replace.
    """
    require_onnx("onnx", "onnxruntime", "onnxscript")  # before any work: a missing package is one line
    quantize = None if spec.quantize is None else str(spec.quantize).lower()
    recipe = spec.recipe() if quantize else None
    inputs = spec.inputs()
    check_output(spec.output, command=COMMAND, overwrite=spec.overwrite, inputs=inputs)
    templates = list(spec.templates)
    model, family, config_data = load_hydra_folder(spec.model)
    folder = Path(spec.model)
    try:  # its pipelines apply a stored calibration: one that is not what `hydra-hf calibrate` stores fails now
        check_calibration(config_data.get("calibration"), getattr(model.config, "num_labels", None))
    except ValueError as exc:
        raise HydraInputError(f"{str(folder)!r}: {exc}") from None
    preprocessor = folder_preprocessor(folder, family.modality)
    options = {"text_column": spec.text_column, "label_column": spec.label_column, "image_column": spec.image_column,
               "max_samples": spec.max_samples, "batch_size": spec.batch_size, "max_length": spec.max_length}
    # the report's data is read before the (slow) export: a bad data option fails at once
    loaders, class_names = _report_loaders(model, preprocessor, family.modality, spec.calibration_data,
                                           list(spec.ood_data), options) if quantize else (None, None)
    decoder = "AutoModelForCausalLM" in family.model_class_names  # a last-token sequence classifier
    if decoder and model.config.pad_token_id is None:
        raise HydraInputError(
            f"{str(folder)!r} is a decoder classifier without pad_token_id, so it cannot pool padded batches; set "
            "pad_token_id in its config.json (e.g. the tokenizer's eos id, as "
            "`hydra-hf finetune` does) and export again"
        )

    def write(tmp: Path) -> None:
        prompts = None if class_names is None else dict(preprocessor.tokenizer(
            zero_shot_prompts(class_names, templates), padding=True, return_tensors="np"))
        code = {name: PACKAGED_CODE_DIR / name for name in config_code_files(family)}
        metadata, fp32, int8 = write_export(tmp, model, family, config_data, source=folder, preprocessor=preprocessor,
                                            opset=spec.opset, recipe=recipe,
                                            calibration_batches=loaders[0] if loaders else None, prompts=prompts,
                                            code_files=code)
        report = None
        if int8 is not None:
            settings = {"calibration_data": spec.calibration_data, "ood_data": list(loaders[1]),
                        "int8_recipe": recipe.name, **options}
            predictor = None
            if family.modality == "image-text":
                settings.update(class_names=class_names, templates=templates)

                def predictor(graph):
                    return OnnxZeroShotPredictor(graph, class_names, templates, preprocessor.tokenizer)
            report = quantization_report(fp32, int8, loaders, settings=settings, predictor=predictor)
            write_quantization_report(report, tmp)
        (tmp / "README.md").write_text(export_card(metadata, None if report is None else report_markdown(report)))

    runtime_log = logging.getLogger("hydra_hf.onnx.runtime")  # its "loaded TMP/model.onnx" of the checks
    level = runtime_log.level
    runtime_log.setLevel(logging.WARNING)  # would name the temporary folder, not the output
    try:
        out = write_output_folder(spec.output, write, command=COMMAND, overwrite=spec.overwrite, inputs=inputs)
    finally:
        runtime_log.setLevel(level)
    logger.info("wrote %s", out)
    return out


def export_onnx(model_dir: str | os.PathLike, output_dir: str | os.PathLike, *, ood_data: Iterable[str] = (),
                data_options: dict[str, Any] | None = None, **options: Any) -> Path:
    """:func:`export` with keyword options (``hydra_hf.export_onnx``): ``data_options`` holds the report's
    data options, the other options are :class:`ExportSpec`'s fields."""
    return export(ExportSpec(model_dir, output_dir, ood_data=list(ood_data), **(data_options or {}), **options))


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
