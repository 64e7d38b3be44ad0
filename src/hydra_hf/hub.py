"""Publishing Hydra Ensembles to the Hugging Face Hub: model cards, staging, validation and push.

The product is a Hub repository that people use with ``trust_remote_code=True`` without installing
hydra_hf. :func:`push` builds that repository in a fresh staging folder, checks it as such a user
would (a new interpreter where ``import hydra_hf`` fails), and uploads it in one commit::

    model folder (convert / save_hydra_model) ─┐
    report.json + PNGs (evaluation, optional) ─┼─> stage_repository ─> validate_staged ─> upload_folder
    model_cards/<kind>.md (Jinja)            ──┘     (fresh folder)     (fresh process)     (one commit)

The local model folder is only read. Errors meant for the user are :class:`HubError` (a
``ValueError``) with a one-line message. :func:`fit_uncertainty_threshold` chooses the threshold
the shipped uncertainty pipelines use to flag inputs.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .export import MODELING_DIR, PIPELINE_FILE, custom_pipelines_for

logger = logging.getLogger(__name__)

__all__ = [
    "HubError",
    "PushResult",
    "StagedRepository",
    "build_model_card",
    "card_template_path",
    "fit_uncertainty_threshold",
    "push",
    "push_model",
    "hydra_push_to_hub",
    "install_push_to_hub",
    "stage_repository",
    "validate_staged",
]

PAPER_URL = "https://arxiv.org/abs/2510.18358"
PAPER_TITLE = "Ensembling Pruned Attention Heads for Uncertainty-Aware Efficient Transformers"
CITATION = """@misc{hydra_ensembles_2025,
  title         = {Ensembling Pruned Attention Heads for Uncertainty-Aware Efficient Transformers},
  year          = {2025},
  eprint        = {2510.18358},
  archivePrefix = {arXiv},
  primaryClass  = {cs.LG},
  url           = {https://arxiv.org/abs/2510.18358}
}"""

# Which template / pipeline tag / auto class a folder gets, from the task heads its auto_map ships.
KINDS: dict[str, dict[str, str]] = {
    "text": {
        "template": "hydra_text_classification.md",
        "pipeline_tag": "text-classification",
        "auto_class": "AutoModelForSequenceClassification",
    },
    "image": {
        "template": "hydra_image_classification.md",
        "pipeline_tag": "image-classification",
        "auto_class": "AutoModelForImageClassification",
    },
    "zero-shot": {
        "template": "hydra_zero_shot_image_classification.md",
        "pipeline_tag": "zero-shot-image-classification",
        "auto_class": "AutoModelForZeroShotImageClassification",
    },
}

# Files of a model folder that belong in the repository (besides *.safetensors and shipped *.py).
PREPROCESSOR_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
    "special_tokens_map.json", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model", "preprocessor_config.json", "processor_config.json", "image_processor_config.json",
    "chat_template.jinja",
)
WEIGHT_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".h5", ".msgpack", ".npz")
# Modules the shipped code must never import: network access, processes, unsafe deserialisation.
FORBIDDEN_IMPORTS = frozenset({
    "socket", "ssl", "urllib", "http", "ftplib", "smtplib", "telnetlib", "xmlrpc", "requests", "httpx",
    "subprocess", "pickle", "marshal", "shelve", "ctypes", "huggingface_hub",
})
UNCERTAINTY_METRICS = ("predictive_entropy", "expected_entropy", "mutual_information")

# report row key -> (model-index metric type, display name)
_ID_METRICS = {
    "accuracy": ("accuracy", "Accuracy"),
    "brier": ("brier_score", "Brier score"),
    "nll": ("nll", "NLL"),
    "ece": ("ece", "ECE"),
    "aece": ("adaptive_ece", "Adaptive ECE"),
    "aurc": ("aurc", "AURC"),
}
_OOD_METRICS = {
    "auroc": ("auroc", "OOD AUROC"),
    "fpr95": ("fpr95", "OOD FPR@95TPR"),
    "aupr_in": ("aupr_in", "OOD AUPR-In"),
    "aupr_out": ("aupr_out", "OOD AUPR-Out"),
}


class HubError(ValueError):
    """A push, staging or validation failure to show the user as one line (the CLI exits 2)."""


# ------------------------------------------------------------------------------------ templates
def card_template_path(kind: str) -> Path:
    """The Jinja model-card template for ``kind`` (``"text"``, ``"image"`` or ``"zero-shot"``).

    Installed wheels carry the templates as ``hydra_hf/model_cards/``; an editable install reads
    them from the repository's ``model_cards/``.
    """
    if kind not in KINDS:
        raise ValueError(f"no model card template for kind {kind!r}; known: {sorted(KINDS)}")
    name = KINDS[kind]["template"]
    here = Path(__file__).resolve().parent
    for folder in (here / "model_cards", here.parents[1] / "model_cards"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"model card template {name} not found next to hydra_hf or in the repository's model_cards/")


def model_kind(config: Mapping[str, Any]) -> str:
    """``"text"``, ``"image"`` or ``"zero-shot"``, from the task heads in the config's ``auto_map``."""
    auto_map = config.get("auto_map") or {}
    for kind, spec in KINDS.items():
        if spec["auto_class"] in auto_map:
            return kind
    raise HubError(
        f"config.json's auto_map {sorted(auto_map)} names no classification head "
        f"({', '.join(spec['auto_class'] for spec in KINDS.values())}); write the folder with hydra-hf convert"
    )


# --------------------------------------------------------------------------------------- report
def load_report(report: str | os.PathLike | Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, Path | None]:
    """``(report dict, folder holding it)`` from a report dict, a ``report.json`` or its folder."""
    if report is None:
        return None, None
    if isinstance(report, Mapping):
        return dict(report), None
    path = Path(report)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"evaluation report {str(path)!r} does not exist; pass report.json or its folder")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise HubError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); rewrite it with write_report") from exc
    if not isinstance(data, dict):
        raise HubError(f"{path} holds a {type(data).__name__}, expected a report dict with 'rows'")
    return data, path.parent


def _flat_row(row: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}/{sub}": v for sub, v in value.items()})
        else:
            flat[str(key)] = value
    return flat


def _finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def select_model_row(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The report row that describes *this* model (the others are baselines), flattened.

    ``report["model_row"]`` (a method name or row index) decides when present; otherwise the only
    row, or else the first row whose method names Hydra. None when no row qualifies: the card then
    shows the table but claims no metric in its metadata.
    """
    rows = (report or {}).get("rows")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, Mapping) for r in rows):
        return None
    choice = (report or {}).get("model_row")
    if isinstance(choice, int) and not isinstance(choice, bool) and 0 <= choice < len(rows):
        return _flat_row(rows[choice])
    if isinstance(choice, str):
        for row in rows:
            if str(row.get("method")) == choice:
                return _flat_row(row)
        return None
    if len(rows) == 1:
        return _flat_row(rows[0])
    for row in rows:
        if "hydra" in str(row.get("method", "")).lower():
            return _flat_row(row)
    return None


def _dataset_info(report: Mapping[str, Any]) -> dict[str, str | None]:
    dataset = report.get("dataset")
    settings = report.get("settings")
    if dataset is None and isinstance(settings, Mapping):
        dataset = settings.get("dataset")
    if isinstance(dataset, str) and dataset.strip():
        return {"name": dataset, "type": dataset, "config": None, "split": None}
    if isinstance(dataset, Mapping) and (dataset.get("name") or dataset.get("type")):
        name = str(dataset.get("name") or dataset.get("type"))
        return {"name": name, "type": str(dataset.get("type") or name),
                "config": dataset.get("config"), "split": dataset.get("split")}
    return {"name": "evaluation data (see evaluation/report.md)", "type": "custom", "config": None, "split": None}


def eval_results_from_report(report: Mapping[str, Any] | None, task_type: str) -> list[EvalResult]:
    """``model-index`` entries for the model's row of ``report``: only numbers present there."""
    row = select_model_row(report)
    if report is None or row is None:
        return []
    ds = _dataset_info(report)
    common = dict(task_type=task_type, dataset_type=ds["type"], dataset_name=ds["name"],
                  dataset_config=ds["config"], dataset_split=ds["split"])
    results = []
    for key, (metric_type, name) in _ID_METRICS.items():
        value = _finite_number(row.get(key))
        if value is not None:
            results.append(EvalResult(metric_type=metric_type, metric_name=name, metric_value=value, **common))
    for key, raw in row.items():
        ood_set, _, metric = key.rpartition("/")
        value = _finite_number(raw)
        if ood_set and metric in _OOD_METRICS and value is not None:
            metric_type, name = _OOD_METRICS[metric]
            results.append(EvalResult(metric_type=metric_type, metric_name=f"{name} ({ood_set})",
                                      metric_config=ood_set, metric_value=value, **common))
    return results


def _report_figures(report: Mapping[str, Any], report_dir: Path | None) -> list[tuple[str, Path]]:
    """(caption, PNG path) of the report's figures that exist: listed ones, then other PNGs beside it."""
    if report_dir is None:
        return []
    figures = report.get("figures") or {}
    listed: list[tuple[str, Path]] = []
    if isinstance(figures, Mapping):
        listed = [(str(caption), Path(p)) for caption, p in figures.items()]
    elif isinstance(figures, list):
        listed = [(Path(p).stem.replace("_", " "), Path(p)) for p in figures]
    found, seen = [], set()
    for caption, path in listed:
        full = path if path.is_absolute() else report_dir / path
        if full.is_file() and full.suffix.lower() == ".png" and full.name not in seen:
            found.append((caption, full))
            seen.add(full.name)
    for png in sorted(report_dir.glob("*.png")):
        if png.name not in seen:
            found.append((png.stem.replace("_", " "), png))
            seen.add(png.name)
    return found


# ------------------------------------------------------------------------------------- the card
def _towers(config: Mapping[str, Any]) -> dict[str, tuple[list[list[list[int]]], int]]:
    """``{tower: (kept_heads, heads per layer)}``: ``""`` for one-tower models (BERT, ViT), else
    ``"vision"`` / ``"text"`` (CLIP: ``<tower>_kept_heads`` with ``base_config["<tower>_config"]``)."""
    base = config.get("base_config") or {}
    towers = {}
    if config.get("kept_heads"):
        towers[""] = (config["kept_heads"], base.get("num_attention_heads"))
    for tower in ("vision", "text"):
        if config.get(f"{tower}_kept_heads"):
            towers[tower] = (config[f"{tower}_kept_heads"], (base.get(f"{tower}_config") or {}).get("num_attention_heads"))
    out = {}
    for tower, (kept, num_heads) in towers.items():
        if not num_heads:  # not recorded: the largest kept index + 1
            num_heads = 1 + max((h for member in kept for layer in member for h in layer), default=0)
        out[tower] = (kept, int(num_heads))
    return out


def _heads_table(kept_heads: list[list[list[int]]], num_heads: int) -> str:
    """Markdown: one row per member, the number of heads kept in every layer and in total."""
    num_layers = len(kept_heads[0])
    header = "| member | " + " | ".join(f"L{l}" for l in range(num_layers)) + " | total |"
    sep = "|:---|" + "---:|" * (num_layers + 1)
    rows = [
        f"| {m} | " + " | ".join(str(len(h)) for h in member) + f" | {sum(len(h) for h in member)}/{num_layers * num_heads} |"
        for m, member in enumerate(kept_heads)
    ]
    return "\n".join([header, sep, *rows])


def _members_table(metadata: list[Mapping[str, Any]]) -> str | None:
    """Markdown table of ``config.member_metadata`` (how each member was built), or None if empty."""
    keys: list[str] = []
    for entry in metadata:
        keys.extend(k for k in entry if k not in keys)
    if not keys:
        return None

    def cell(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| member | " + " | ".join(keys) + " |", "|:---|" + ":---|" * len(keys)]
    lines += [f"| {m} | " + " | ".join(cell(e.get(k, "")) for k in keys) + " |" for m, e in enumerate(metadata)]
    return "\n".join(lines)


def _is_repo_id(name: str | None) -> bool:
    from huggingface_hub.utils import validate_repo_id

    if not name or os.path.isabs(name) or name.startswith("."):
        return False
    try:
        validate_repo_id(name)
    except Exception:
        return False
    return True


def _base_license(base_model: str | None) -> str | None:
    """The license of the base model: from a local folder's README.md, else from the Hub (one
    request, 10 s timeout, skipped offline). None when it cannot be read."""
    if not base_model:
        return None
    local = Path(base_model) / "README.md"
    try:
        if local.is_file():
            return getattr(ModelCard.load(local).data, "license", None)
        from huggingface_hub import HfApi, constants

        if constants.is_offline_mode() or not _is_repo_id(base_model):
            return None
        card_data = HfApi().model_info(base_model, timeout=10).card_data
        return getattr(card_data, "license", None) if card_data is not None else None
    except Exception as exc:  # offline, no card, unreadable metadata: the card then says it is not recorded
        logger.info("could not read the license of %s: %s", base_model, exc)
        return None


def build_model_card(
    model_dir: str | os.PathLike,
    report: str | os.PathLike | Mapping[str, Any] | None = None,
    *,
    repo_id: str,
    revision: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
    training: str | None = None,
    heads_images: Mapping[str, str] | None = None,
    report_links: Mapping[str, str] | None = None,
    tags: list[str] | None = None,
) -> ModelCard:
    """The model card (``README.md``) of the Hydra folder ``model_dir``.

    Rendered with ``ModelCard.from_template`` from ``model_cards/<kind>.md``. Evaluation numbers
    come only from ``report`` (a dict, ``report.json`` or its folder): the table of all its rows,
    and in the ``model-index`` metadata the metrics of the row that describes this model (see
    :func:`select_model_row`). Without a report the card says so and claims no number.

    Args:
        model_dir: a folder written by ``convert`` / ``save_hydra_model``.
        report: the evaluation report, or None.
        repo_id: the repository the usage snippet loads.
        revision: branch, tag or commit the snippet pins (default ``"main"``).
        base_model: the base checkpoint's Hub id (``report["base_model"]`` when not given).
        license: the license id; default the base model's (read from its card), else none.
        training: how the members were fine-tuned (``report["training"]`` when not given).
        heads_images: ``{tower: relative path}`` of kept-heads heat maps in the repository (tower
            ``""`` for one-tower models, ``"vision"`` / ``"text"`` for CLIP).
        report_links: ``{"report": path, "reliability": path, "figures": {caption: path}}`` in the
            repository (set by :func:`stage_repository`).
        tags: extra Hub tags.
    """
    folder = Path(model_dir)
    config = _read_config(folder)
    kind = model_kind(config)
    report_data, _ = load_report(report)
    report_data = report_data or {}
    links = dict(report_links or {})
    base_model = base_model or report_data.get("base_model")
    if base_model is not None and not isinstance(base_model, str):
        base_model = None
    license = license or report_data.get("license") or _base_license(base_model)
    training = training or report_data.get("training")
    towers = []
    for tower, (kept, num_heads) in _towers(config).items():
        num_layers = len(kept[0])
        towers.append(dict(
            name=tower,
            title=f"{tower} tower" if tower else "",
            num_layers=num_layers,
            num_heads=num_heads,
            heads_per_member=[sum(len(h) for h in member) for member in kept],
            union_heads=sum(len(set().union(*(set(member[l]) for member in kept))) for l in range(num_layers)),
            total_heads=num_layers * num_heads,
            heads_table=_heads_table(kept, num_heads),
            heads_image=(heads_images or {}).get(tower),
        ))
    task_type = KINDS[kind]["pipeline_tag"]

    eval_results = eval_results_from_report(report_data or None, task_type)
    model_row = select_model_row(report_data or None)
    table = None
    if report_data.get("rows"):
        from .report import render_markdown_table

        try:
            table = render_markdown_table(report_data["rows"], report_data.get("columns"),
                                          ood_sets=report_data.get("ood_sets"), bold_best=True).strip()
        except (TypeError, ValueError) as exc:
            logger.warning("the report's rows cannot be rendered as a table (%s); the card shows none", exc)
    name = repo_id.rstrip("/").split("/")[-1]
    card_data = ModelCardData(
        model_name=name,
        base_model=base_model if _is_repo_id(base_model) else None,
        license=license,
        library_name="transformers",
        pipeline_tag=task_type,
        tags=["hydra-ensembles", "ensemble", "uncertainty", "head-pruning", "custom_code",
              *[t for t in (tags or []) if t not in ("hydra-ensembles", "ensemble", "uncertainty", "head-pruning", "custom_code")]],
        eval_results=eval_results or None,
    )
    threshold = config.get("uncertainty_threshold")
    labels = [str(v) for _, v in sorted((config.get("id2label") or {}).items(), key=lambda kv: int(kv[0]))]
    context = dict(
        repo_id=repo_id,
        revision=revision or "main",
        name=name,
        kind=kind,
        base_model=base_model,
        license_known=license is not None,
        num_members=len(towers[0]["heads_per_member"]),
        towers=towers,
        mlp_fusion=config.get("mlp_fusion", "average"),
        members_table=_members_table(config.get("member_metadata") or []),
        training=training,
        labels=labels,
        eval_table=table,
        report_title=report_data.get("title"),
        model_row=(model_row or {}).get("method"),
        metadata_metrics=len(eval_results),
        report_link=links.get("report"),
        reliability_image=links.get("reliability"),
        figures=links.get("figures") or {},
        threshold=threshold if isinstance(threshold, Mapping) else None,
        pipeline_task=next(iter(config.get("custom_pipelines") or custom_pipelines_for(config.get("auto_map", {}))), None),
        citation=CITATION,
        paper_url=PAPER_URL,
        paper_title=PAPER_TITLE,
    )
    return ModelCard.from_template(card_data, template_path=str(card_template_path(kind)), **context)


# -------------------------------------------------------------------------------------- staging
def _read_config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {str(folder)!r} does not exist; pass a folder written by hydra-hf convert")
    file = folder / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no config.json; pass a folder written by hydra-hf convert")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise HubError(f"{file} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not str(config.get("model_type", "")).startswith("hydra_ensemble") or not _towers(config):
        raise HubError(
            f"{file} is not a Hydra Ensemble config (model_type={config.get('model_type')!r}); "
            "convert the checkpoint first with hydra-hf convert"
        )
    if not config.get("auto_map"):
        raise HubError(f"{file} has no auto_map, so trust_remote_code cannot find the model; re-save it with hydra-hf convert")
    return config


def _shipped_modules(config: Mapping[str, Any]) -> list[str]:
    """The .py files the config's auto_map and custom_pipelines refer to."""
    refs = list((config.get("auto_map") or {}).values())
    refs += [spec.get("impl", "") for spec in (config.get("custom_pipelines") or {}).values()]
    names = []
    for ref in refs:
        ref = ref[0] if isinstance(ref, (list, tuple)) else ref
        module = str(ref).split("--")[-1].rsplit(".", 1)[0]
        if module and f"{module}.py" not in names:
            names.append(f"{module}.py")
    return names


def check_shipped_code(folder: Path) -> list[str]:
    """Raise :class:`HubError` unless every ``.py`` in ``folder`` imports only the standard library
    (minus network, process and pickle modules), torch, transformers and sibling files."""
    allowed = (set(sys.stdlib_module_names) | {"torch", "transformers", "__future__"}) - FORBIDDEN_IMPORTS
    files = sorted(p.name for p in folder.glob("*.py"))
    for name in files:
        tree = ast.parse((folder / name).read_text(encoding="utf-8"), filename=name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [(alias.name, 0) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [(node.module or "", node.level)]
            else:
                continue
            for module, level in modules:
                if level:
                    if level != 1 or f"{module}.py" not in files:
                        raise HubError(f"{name} imports '{'.' * level}{module}', which is not a file shipped beside it")
                elif module.split(".")[0] not in allowed:
                    raise HubError(
                        f"{name} imports {module}; shipped code may import only the standard library "
                        "(no network or pickle modules), torch, transformers and sibling files"
                    )
    return files


@dataclass
class StagedRepository:
    """A staged repository folder and what it holds (``files``: relative path -> bytes)."""

    folder: Path
    files: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    kind: str = ""


def stage_repository(
    model_dir: str | os.PathLike,
    staging_dir: str | os.PathLike,
    *,
    repo_id: str,
    report: str | os.PathLike | Mapping[str, Any] | None = None,
    revision: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
    training: str | None = None,
    tags: list[str] | None = None,
) -> StagedRepository:
    """Assemble the repository content of ``model_dir`` in the new or empty folder ``staging_dir``.

    Copies only what belongs in the repository: ``config.json`` (with ``custom_pipelines``),
    ``*.safetensors`` weights (never pickle files), the shipped ``.py`` files, tokenizer/processor
    files; adds ``README.md`` (the card), ``heads.png`` (kept heads) and, with a report,
    ``evaluation/`` (``report.json``, ``report.md``, PNGs). ``model_dir`` is only read.
    """
    src = Path(model_dir)
    config = _read_config(src)
    kind = model_kind(config)
    out = Path(staging_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"staging folder {str(out)!r} is not empty; the repository is staged in a fresh folder")
    out.mkdir(parents=True, exist_ok=True)
    names = {p.name for p in src.iterdir() if p.is_file()}

    weights = sorted(n for n in names if n.endswith(".safetensors"))
    if not weights:
        pickled = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
        hint = f" (found {pickled}: re-save with safe_serialization=True)" if pickled else ""
        raise HubError(f"{str(src)!r} has no .safetensors weights{hint}; only safetensors are uploaded")
    wanted = set(weights) | {n for n in (WEIGHT_INDEX, *PREPROCESSOR_FILES) if n in names}

    # config: make sure it names the uncertainty pipeline that is shipped below
    config = dict(config)
    if not config.get("custom_pipelines"):
        config["custom_pipelines"] = custom_pipelines_for(config["auto_map"])
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name in sorted(wanted):
        shutil.copyfile(src / name, out / name)
    for name in _shipped_modules(config):
        source = src / name if name in names else MODELING_DIR / name
        if not source.is_file():
            raise HubError(f"config.json refers to {name}, which is neither in {str(src)!r} nor shipped with hydra_hf")
        shutil.copyfile(source, out / name)
    # siblings the shipped files import (e.g. hydra_layers.py) come from the model folder as well
    for name in sorted(n for n in names if n.endswith(".py") and not (out / n).exists()):
        shutil.copyfile(src / name, out / name)
    if not (out / PIPELINE_FILE).exists():
        shutil.copyfile(MODELING_DIR / PIPELINE_FILE, out / PIPELINE_FILE)
    check_shipped_code(out)

    heads_images = {}
    try:
        from .plots import heads_heatmap

        for tower, (kept, num_heads) in _towers(config).items():
            name = f"heads_{tower}.png" if tower else "heads.png"
            title = f"Attention heads kept by each member{f' ({tower} tower)' if tower else ''}"
            heads_heatmap(kept, out / name, num_heads=num_heads, title=title)
            heads_images[tower] = name
    except Exception as exc:  # matplotlib missing or an odd layout: the card keeps its tables
        logger.warning("no kept-heads heat map (%s); the card shows the table only", exc)

    report_data, report_dir = load_report(report)
    links: dict[str, Any] = {}
    if report_data is not None:
        eval_dir = out / "evaluation"
        eval_dir.mkdir()
        (eval_dir / "report.json").write_text(json.dumps(report_data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        links["report"] = "evaluation/report.json"
        if report_dir is not None and (report_dir / "report.md").is_file():
            shutil.copyfile(report_dir / "report.md", eval_dir / "report.md")
            links["report"] = "evaluation/report.md"
        figures = {}
        for caption, png in _report_figures(report_data, report_dir):
            shutil.copyfile(png, eval_dir / png.name)
            figures[caption] = f"evaluation/{png.name}"
            if "reliability" not in links and re.search(r"reliab|calibrat", f"{caption} {png.name}", re.I):
                links["reliability"] = f"evaluation/{png.name}"
        links["figures"] = {c: p for c, p in figures.items() if p != links.get("reliability")}

    card = build_model_card(src, report_data, repo_id=repo_id, revision=revision, base_model=base_model,
                            license=license, training=training, heads_images=heads_images, report_links=links,
                            tags=tags)
    card.save(out / "README.md")
    files = {p.relative_to(out).as_posix(): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    skipped = sorted(n for n in (p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()) if n not in files)
    if skipped:
        logger.info("not uploaded from %s: %s", src, ", ".join(skipped))
    return StagedRepository(folder=out, files=files, skipped=skipped, kind=kind)


# ----------------------------------------------------------------------------------- validation
_VALIDATE_SCRIPT = r"""
import sys
sys.modules["hydra_hf"] = None  # a Hub user who never installed hydra_hf
import importlib.util, inspect, json, os
import torch
import transformers
from transformers import AutoConfig, pipeline

folder = sys.argv[1]
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
auto_map = config.auto_map
order = ["AutoModelForSequenceClassification", "AutoModelForImageClassification",
         "AutoModelForZeroShotImageClassification", "AutoModel"]
auto_name = next(name for name in order if name in auto_map)
model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
base = dict(config.base_config)
text_cfg = base.get("text_config") or base
vision_cfg = base.get("vision_config") or base
params = inspect.signature(model.forward).parameters
inputs = {}
if "input_ids" in params and text_cfg.get("vocab_size"):
    inputs["input_ids"] = torch.randint(0, int(text_cfg["vocab_size"]), (2, 7), generator=torch.Generator().manual_seed(0))
if "pixel_values" in params and vision_cfg.get("image_size"):
    size, channels = int(vision_cfg["image_size"]), int(vision_cfg.get("num_channels", 3))
    inputs["pixel_values"] = torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    out = model(**inputs)
members = out.get("member_logits")
if members is None:
    members = out.get("member_logits_per_image")
assert members is not None, "the model returned no member logits"
assert members.shape[0] == 2 and members.shape[1] == config.num_members, tuple(members.shape)
assert torch.isfinite(members).all(), "non-finite member logits"
summary = {"auto_class": auto_name, "module": type(model).__module__, "member_logits": list(members.shape),
           "pipeline": None}
tasks = list((getattr(config, "custom_pipelines", None) or {}))
def has(*names):
    return any(os.path.isfile(os.path.join(folder, n)) for n in names)
text_ok = has("tokenizer_config.json", "tokenizer.json")
image_ok = has("preprocessor_config.json", "processor_config.json")
needed = {"hydra-text-classification": text_ok, "hydra-image-classification": image_ok,
          "hydra-zero-shot-image-classification": text_ok and image_ok}
if len(tasks) == 1 and needed.get(tasks[0], False):
    pipe = pipeline(model=folder, trust_remote_code=True)
    summary["pipeline"] = type(pipe).__name__
    result = None
    if tasks[0] == "hydra-text-classification":
        result = pipe("hello world")
    elif tasks[0] == "hydra-image-classification":
        result = pipe(torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8))
    elif importlib.util.find_spec("PIL") is not None:  # the zero-shot pipeline opens images with PIL
        from PIL import Image
        result = pipe(Image.new("RGB", (32, 32)), candidate_labels=["a", "b"])
    if result is not None:
        assert set(result["uncertainty"]) >= {"predictive_entropy", "expected_entropy", "mutual_information"}, result
        assert len(result["member_scores"]) == config.num_members, result
        summary["pipeline_result"] = result
assert sys.modules.get("hydra_hf") is None, "hydra_hf was imported"
print(json.dumps(summary))
"""


def validate_staged(folder: str | os.PathLike, *, timeout: float = 300) -> dict[str, Any]:
    """Check a staged repository as a Hub user would see it; raise :class:`HubError` if it fails.

    Static checks: no pickle files; shipped code imports only what it may
    (:func:`check_shipped_code`); ``README.md`` parses with ``ModelCard.load`` and its
    ``model-index`` is readable. Then, in a new interpreter where ``import hydra_hf`` fails and the
    Hub is offline: the config and model load with ``trust_remote_code=True`` from the folder, a
    forward pass on a dummy input gives finite member logits, and — when the folder has the
    tokenizer / image processor it needs — the shipped uncertainty pipeline
    (``pipeline(model=folder, trust_remote_code=True)``) builds and runs on a dummy input (the
    zero-shot one only where PIL is installed, as it opens images with PIL).

    Returns:
        ``{"card": {...}, "load": {...}}`` — what was checked.
    """
    root = Path(folder)
    pickled = sorted(p.name for p in root.rglob("*") if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise HubError(f"staged folder holds pickle files {pickled}; only safetensors weights may be uploaded")
    check_shipped_code(root)
    card_summary = check_card(root / "README.md")
    with tempfile.TemporaryDirectory(prefix="hydra-validate-") as tmp:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_MODULES_CACHE": tmp,
               "TOKENIZERS_PARALLELISM": "false", "PYTHONNOUSERSITE": "1"}
        env.pop("PYTHONPATH", None)
        try:
            proc = subprocess.run([sys.executable, "-c", _VALIDATE_SCRIPT, str(root.resolve())], capture_output=True,
                                  text=True, env=env, cwd=tmp, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise HubError(f"loading the staged folder in a fresh process took over {timeout:.0f} s") from exc
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        logger.error("fresh-process validation failed:\n%s", proc.stderr[-4000:])
        raise HubError(f"the staged repository does not load with trust_remote_code=True: {lines[-1] if lines else proc.returncode}")
    return {"card": card_summary, "load": json.loads(proc.stdout.strip().splitlines()[-1])}


def check_card(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a model card with ``ModelCard.load``; its ``model-index`` must be readable."""
    try:
        card = ModelCard.load(path)
    except Exception as exc:
        raise HubError(f"the model card {path} does not parse: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    data = card.data.to_dict()
    if "model-index" in data and not card.data.eval_results:
        raise HubError(f"the model card {path} has a model-index that huggingface_hub cannot read")
    return {"metadata": sorted(data), "eval_results": len(card.data.eval_results or [])}


# ------------------------------------------------------------------------------------------ push
@dataclass
class PushResult:
    """What :func:`push` did. ``commit_url`` is None for a dry run."""

    repo_id: str
    files: dict[str, int]
    staging: Path | None
    commit_url: str | None = None
    pr_url: str | None = None
    validation: dict[str, Any] = field(default_factory=dict)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# transport errors of the HTTP clients huggingface_hub may use (httpx, its vendored httpx2, requests)
_HTTP_MODULES = ("httpx", "httpcore", "requests", "urllib3")


def _hub_error(exc: BaseException, repo_id: str, revision: str | None) -> HubError:
    """A one-line message (what failed, and what to do) for an upload error."""
    from huggingface_hub import errors

    if isinstance(exc, errors.OfflineModeIsEnabled):
        return HubError("cannot upload: HF_HUB_OFFLINE is set; unset it (or use --dry-run) to push")
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"revision {revision!r} does not exist in {repo_id}; check --revision")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError(f"repository {repo_id} does not exist or your token cannot write to it; "
                        "check --repo-id and that the token has write access to the namespace")
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        hint = {401: "the token is invalid or expired: run `hf auth login`",
                403: "the token has no write access to this repository"}.get(status, "the Hub rejected the upload")
        return HubError(f"upload to {repo_id} failed (HTTP {status}): {hint}: {_one_line(exc)}")
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)) or type(exc).__module__.startswith(_HTTP_MODULES):
        return HubError(f"cannot reach the Hugging Face Hub ({type(exc).__name__}: {_one_line(exc)}); check the network")
    return HubError(f"upload to {repo_id} failed: {type(exc).__name__}: {_one_line(exc)}")


def push(
    model_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    commit_message: str | None = None,
    commit_description: str | None = None,
    dry_run: bool = False,
    token: str | None = None,
    report: str | os.PathLike | Mapping[str, Any] | None = None,
    base_model: str | None = None,
    license: str | None = None,
    training: str | None = None,
    tags: list[str] | None = None,
    staging_dir: str | os.PathLike | None = None,
    endpoint: str | None = None,
    validate_timeout: float = 300,
) -> PushResult:
    """Stage, validate and upload the Hydra folder ``model_dir`` to ``repo_id`` in one commit.

    The repository then holds exactly the staged folder (``upload_folder`` with
    ``delete_patterns="*"``: files of earlier commits that are not staged now are removed in the same
    commit; ``.gitattributes`` is kept). The repository is created if it does not exist (not with
    ``create_pr``); ``revision`` names a branch, created from main if needed.

    Args:
        dry_run: stop after validation; nothing is sent.
        staging_dir: a new or empty folder to stage into, kept after a successful push or dry run
            (removed if the push fails); default a temporary folder, always removed.
        token: a Hub token (default: ``HF_TOKEN`` or the saved login).
        endpoint: another Hub endpoint (default ``HF_ENDPOINT`` / huggingface.co).
        report, base_model, license, training, tags: see :func:`build_model_card`.

    Raises:
        HubError: one-line message: invalid repo id, validation failure, offline mode, no token,
            unreachable Hub, missing repository, rejected upload. ``model_dir`` is never modified.
    """
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except Exception as exc:
        raise HubError(f"--repo-id {repo_id!r} is not a valid repository id ({_one_line(exc)}); use ORG/NAME") from exc
    if "/" not in repo_id:
        raise HubError(f"--repo-id {repo_id!r} has no namespace; use ORG/NAME (or USER/NAME)")
    keep = staging_dir is not None
    staging = Path(staging_dir) if keep else Path(tempfile.mkdtemp(prefix="hydra-push-"))
    # a given staging folder that is not new/empty is refused by stage_repository and never cleaned up
    ours = not staging.exists() or (staging.is_dir() and not any(staging.iterdir()))
    ok = False
    try:
        staged = stage_repository(model_dir, staging, repo_id=repo_id, report=report, revision=revision,
                                  base_model=base_model, license=license, training=training, tags=tags)
        validation = validate_staged(staging, timeout=validate_timeout)
        result = PushResult(repo_id=repo_id, files=staged.files, staging=staging if keep else None, validation=validation)
        if dry_run:
            ok = True
            return result
        commit = _upload(staging, repo_id, private=private, revision=revision, create_pr=create_pr,
                         commit_message=commit_message or f"Upload Hydra Ensemble ({staged.kind}) with hydra_hf",
                         commit_description=commit_description, token=token, endpoint=endpoint)
        result.commit_url = getattr(commit, "commit_url", None) or str(commit)
        result.pr_url = getattr(commit, "pr_url", None)
        ok = True
        return result
    finally:
        if not keep or (not ok and ours):  # a failed push leaves no half-built staging folder behind
            shutil.rmtree(staging, ignore_errors=True)


def _upload(folder: Path, repo_id: str, *, private: bool, revision: str | None, create_pr: bool,
            commit_message: str, commit_description: str | None, token: str | None, endpoint: str | None) -> Any:
    from huggingface_hub import HfApi, constants, get_token

    if constants.is_offline_mode():
        raise HubError("cannot upload: HF_HUB_OFFLINE is set; unset it (or use --dry-run) to push")
    if token is None and get_token() is None:
        raise HubError("no Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass --token")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        if not create_pr:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if revision:
                api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                                 commit_description=commit_description, revision=revision, create_pr=create_pr,
                                 delete_patterns="*")
    except HubError:
        raise
    except Exception as exc:
        raise _hub_error(exc, repo_id, revision) from exc


def push_model(
    model: Any,
    repo_id: str,
    *,
    preprocessor_from: str | os.PathLike | None = None,
    **kwargs: Any,
) -> PushResult:
    """Push an in-memory Hydra model: the same repository content as ``hydra-hf push`` on a folder.

    Saves ``model`` with :func:`hydra_hf.export.save_hydra_model` (config with ``auto_map`` and
    ``custom_pipelines``, safetensors, shipped code, the tokenizer/processor of
    ``preprocessor_from`` — by default the folder the model was loaded from, when it is one) into a
    temporary folder, then calls :func:`push` with ``kwargs``.
    """
    from .export import save_hydra_model

    if preprocessor_from is None:
        source = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        if source and Path(source).is_dir():
            preprocessor_from = source
    with tempfile.TemporaryDirectory(prefix="hydra-save-") as tmp:
        folder = Path(tmp) / "model"
        save_hydra_model(model, folder, preprocessor_from=preprocessor_from)
        return push(folder, repo_id, **kwargs)


def hydra_push_to_hub(
    self: Any,
    repo_id: str,
    *,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    tags: list[str] | None = None,
    **kwargs: Any,
) -> PushResult:
    """``model.push_to_hub(repo_id, ...)`` for Hydra models: the repository ``hydra-hf push`` makes.

    Takes transformers' ``push_to_hub`` arguments (except ``max_shard_size``) plus those of
    :func:`push_model` (``preprocessor_from``, ``report``, ``base_model``, ``license``,
    ``training``, ``dry_run``, ``staging_dir``). Returns a :class:`PushResult`.
    """
    return push_model(self, repo_id, commit_message=commit_message, commit_description=commit_description,
                      private=bool(private), token=token, revision=revision, create_pr=create_pr, tags=tags, **kwargs)


hydra_push_to_hub.__hydra_hub__ = True  # type: ignore[attr-defined]


def install_push_to_hub(cls: type) -> type:
    """Make ``cls.push_to_hub`` (and its subclasses') publish the full Hydra repository.

    Meant for hydra_hf's own, locally registered model classes (``hydra_hf/__init__.py`` calls it
    on ``HydraEnsemblePreTrainedModel``). The shipped modeling files cannot import hydra_hf, so
    classes loaded with ``trust_remote_code`` keep transformers' ``push_to_hub`` (which uploads only
    what ``save_pretrained`` writes); use ``hydra_hf.hub.push_model(model, ...)`` for those.
    """
    if not cls.__module__.startswith("hydra_hf."):
        raise TypeError(f"install_push_to_hub is for hydra_hf's own model classes, not {cls.__module__}.{cls.__name__}")
    cls.push_to_hub = hydra_push_to_hub
    return cls


def folder_digest(folder: str | os.PathLike) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` (to show it was left untouched)."""
    root = Path(folder)
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------- uncertainty threshold
def _member_probs(
    model: Any, data: Any, tokenizer: Any | None, batch_size: int
) -> torch.Tensor:
    """``(N, M, C)`` member probabilities of ``model`` on ``data``.

    ``data`` is a tensor of member probabilities ``(N, M, C)`` (used as is), a list of texts
    (tokenized with ``tokenizer``), or an iterable of batches (dicts of model inputs; ``labels``
    and ``label`` are dropped).
    """
    if isinstance(data, torch.Tensor):
        if data.dim() != 3:
            raise ValueError(f"member probabilities must have shape (N, M, C), got {tuple(data.shape)}")
        return data.double()
    if isinstance(data, (list, tuple)) and data and all(isinstance(x, str) for x in data):
        if tokenizer is None:
            from transformers import AutoTokenizer

            source = getattr(model, "name_or_path", None)
            if not source:
                raise ValueError("texts need a tokenizer: pass tokenizer=AutoTokenizer.from_pretrained(folder)")
            tokenizer = AutoTokenizer.from_pretrained(source)
        batches: Iterable[Mapping[str, Any]] = (
            tokenizer(list(data[i : i + batch_size]), padding=True, truncation=True, return_tensors="pt")
            for i in range(0, len(data), batch_size)
        )
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes, Mapping)):
        batches = data
    else:
        raise TypeError(
            f"data must be a (N, M, C) tensor of member probabilities, a list of texts or an iterable of "
            f"input batches, got {type(data).__name__}"
        )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for batch in batches:
                inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                          for k, v in dict(batch).items() if k not in ("labels", "label")}
                output = model(**inputs)
                member_logits = output.get("member_logits")
                if member_logits is None:
                    member_logits = output.get("member_logits_per_image")
                if member_logits is None:
                    raise ValueError("the model returned no member logits; pass a Hydra Ensemble model")
                out.append(torch.softmax(member_logits.double(), dim=-1).cpu())  # (B, M, C)
    finally:
        model.train(was_training)
    if not out:
        raise ValueError("data is empty; pass at least one validation input")
    return torch.cat(out)


def fit_uncertainty_threshold(
    model: Any,
    data: Any,
    *,
    metric: str = "mutual_information",
    quantile: float = 0.95,
    ood_data: Any | None = None,
    tokenizer: Any | None = None,
    batch_size: int = 32,
) -> dict[str, Any]:
    """Choose the uncertainty threshold above which the shipped pipelines flag an input, and store
    it in ``model.config.uncertainty_threshold`` (saved with the model's config).

    Rule, on in-distribution validation ``data``:
      - without ``ood_data``: the ``quantile`` of the validation uncertainties (``"higher"``
        interpolation, so at most ``1 - quantile`` of the validation inputs are flagged: with the
        default 0.95, 95 % of in-distribution inputs pass);
      - with ``ood_data`` (out-of-distribution validation inputs): the threshold maximizing
        Youden's J = (flagged fraction of OOD inputs) - (flagged fraction of ID inputs).

    Args:
        model: a Hydra Ensemble classifier (or CLIP model returning ``member_logits_per_image``).
        data, ood_data: member probabilities ``(N, M, C)``, a list of texts, or an iterable of
            input batches (see :func:`_member_probs`).
        metric: ``"mutual_information"`` (default: the members' disagreement), ``"predictive_entropy"``
            or ``"expected_entropy"``.
        quantile: in ``(0, 1]``.

    Returns:
        The stored dict: ``metric``, ``value``, ``rule`` and the numbers that justify it.
    """
    from . import metrics

    if metric not in UNCERTAINTY_METRICS:
        raise ValueError(f"metric={metric!r} is unknown; use one of {list(UNCERTAINTY_METRICS)}")
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile <= 1:
        raise ValueError(f"quantile must be a number in (0, 1], got {quantile!r}")
    measure: Callable[[torch.Tensor], torch.Tensor] = getattr(metrics, metric)
    u_id = measure(_member_probs(model, data, tokenizer, batch_size)).double()  # (N,)
    if ood_data is None:
        value = float(torch.quantile(u_id, float(quantile), interpolation="higher"))
        threshold = {"metric": metric, "value": value, "rule": "id_quantile", "quantile": float(quantile),
                     "num_samples": int(u_id.numel()), "flagged_fraction": float((u_id > value).double().mean())}
    else:
        u_ood = measure(_member_probs(model, ood_data, tokenizer, batch_size)).double()
        candidates = torch.unique(torch.cat([u_id, u_ood]))
        candidates = torch.cat([candidates, candidates.min().reshape(1) - 1])  # "flag everything" as well
        flag_id = (u_id[None, :] > candidates[:, None]).double().mean(dim=1)  # (K,)
        flag_ood = (u_ood[None, :] > candidates[:, None]).double().mean(dim=1)
        j = flag_ood - flag_id
        best = int(torch.argmax(j))
        value = float(candidates[best])
        threshold = {"metric": metric, "value": value, "rule": "youden", "youden_j": float(j[best]),
                     "num_samples": int(u_id.numel()), "num_ood_samples": int(u_ood.numel()),
                     "flagged_fraction": float(flag_id[best]), "flagged_ood_fraction": float(flag_ood[best])}
    model.config.uncertainty_threshold = threshold
    return threshold
