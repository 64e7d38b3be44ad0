"""Markdown tables and report files in the layout of the Hydra Ensembles paper.

Rows are plain dicts of numbers, so any evaluation code can fill them::

    row = {"method": "Hydra (M=4)", **metrics.calibration_report(probs, labels),
           "svhn": metrics.ood_report(msp_id, msp_svhn), "latency_ms": 3.1, "params_m": 86.6}

OOD numbers live under ``"<set>/<metric>"`` keys (``"svhn/auroc"``) or, as above, in a nested
dict ``{set: {metric: value}}`` that is flattened to those keys. Missing, ``None`` and NaN values
render as "–".
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import HydraInputError, HydraTypeError
from ..metrics.chance import chance_levels, near_chance
from ..outputs import write_text_atomic
from ..reproducibility import describe_machine
from . import plots
from .run import EvaluationResult

logger = logging.getLogger(__name__)

__all__ = [
    "MISSING",
    "BASE_COLUMNS",
    "OOD_COLUMNS",
    "TAIL_COLUMNS",
    "default_columns",
    "render_markdown_table",
    "write_report",
]

Column = tuple[str, str, str]
"""``(key, header, format_spec)``; the format spec is applied to numbers (``""`` = ``str``)."""

MISSING = "–"
"""What a missing / None / NaN value renders as (an en dash)."""

BASE_COLUMNS: tuple[Column, ...] = (
    ("method", "Method", ""),
    ("accuracy", "Acc ↑", ".4f"),
    ("brier", "Brier ↓", ".4f"),
    ("nll", "NLL ↓", ".4f"),
    ("ece", "ECE ↓", ".4f"),
    ("aece", "aECE ↓", ".4f"),
)
OOD_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("auroc", "AUROC ↑", ".4f"),
    ("fpr95", "FPR95 ↓", ".4f"),
    ("aupr_in", "AUPR-In ↑", ".4f"),
    ("aupr_out", "AUPR-Out ↑", ".4f"),
)
"""Per OOD set ``s``: columns ``"s/auroc"`` … with headers ``"s AUROC ↑"`` …"""
TAIL_COLUMNS: tuple[Column, ...] = (
    ("compute_x", "compute (x Single)", ".2f"),  # multiply-adds per token, from the masks (hydra_hf.cost)
    ("latency_ms", "latency (ms)", ".2f"),
    ("params_m", "params (M)", ".3g"),  # 3 significant digits: a tiny model is not 0.0
)


def _flatten_row(row: Any, index: int) -> dict[str, Any]:
    """Flatten one level of nesting: ``{"svhn": {"auroc": x}}`` -> ``{"svhn/auroc": x}``."""
    if not isinstance(row, Mapping):
        raise TypeError(f"rows[{index}] must be a dict of column values, got {type(row).__name__}")
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, Mapping):
            for sub_key, sub_value in value.items():
                flat[f"{key}/{sub_key}"] = sub_value
        else:
            flat[str(key)] = value
    return flat


def _flatten_rows(rows: Any) -> list[dict[str, Any]]:
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
        raise TypeError(f"rows must be a list of dicts, got {type(rows).__name__}")
    if not rows:
        raise ValueError("rows is empty; pass at least one row (one dict per method)")
    return [_flatten_row(row, i) for i, row in enumerate(rows)]


def default_columns(rows: Sequence[Mapping[str, Any]], ood_sets: Sequence[str] | None = None) -> list[Column]:
    """The paper's column layout for ``rows``.

    Method | Acc | Brier | NLL | ECE | aECE | per OOD set: AUROC / FPR95 / AUPR-In / AUPR-Out |
    latency (ms) | params (M). OOD sets are ``ood_sets`` in that order, or else every ``"<set>/"``
    prefix of a known OOD metric found in the rows, in order of first appearance.
    """
    flat = _flatten_rows(rows)
    if ood_sets is None:
        known = {key for key, _, _ in OOD_COLUMNS}
        found: list[str] = []
        for row in flat:
            for key in row:
                prefix, _, metric = key.rpartition("/")
                if prefix and metric in known and prefix not in found:
                    found.append(prefix)
        ood_sets = found
    columns = list(BASE_COLUMNS)
    for set_name in ood_sets:
        columns.extend((f"{set_name}/{key}", f"{set_name} {header}", spec) for key, header, spec in OOD_COLUMNS)
    columns.extend(TAIL_COLUMNS)
    return columns


def _as_number(value: Any) -> float | int | None:
    """Python number for numeric values (numpy / 0-d torch included), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic) and np.issubdtype(value.dtype, np.number):
        return value.item()
    if isinstance(value, np.ndarray) and value.size == 1 and np.issubdtype(value.dtype, np.number):
        return value.item()
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype == torch.bool:
        return value.item()
    return None


def _format_cell(value: Any, spec: str, where: str) -> str:
    if value is None:
        return MISSING
    number = _as_number(value)
    if number is not None:
        if isinstance(number, float) and math.isnan(number):
            return MISSING
        return format(number, spec) if spec else str(number)
    if isinstance(value, str):
        return value.replace("|", "\\|").replace("\n", " ")
    raise TypeError(f"{where} is a {type(value).__name__}; table cells must be numbers, strings or None")


def _is_better(a: float, b: float, higher: bool) -> bool:
    return a > b if higher else a < b


def render_markdown_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column] | Sequence[tuple[str, str]] | None = None,
    *,
    ood_sets: Sequence[str] | None = None,
    bold_best: bool = False,
) -> str:
    """A GitHub-flavoured markdown table, one line per row.

    Args:
        rows: one dict per method (see the module docstring for keys).
        columns: ``(key, header)`` or ``(key, header, format_spec)`` tuples (numbers in a
            2-tuple column are formatted with ``".4f"``); default :func:`default_columns` (the
            paper's layout).
        ood_sets: OOD set names for the default columns (default: found in the rows).
        bold_best: bold the best value of every column whose header ends in ↑ (highest) or ↓
            (lowest) and that has at least two values; ties are all bold.

    Returns:
        The table, ending with a newline.
    """
    flat = _flatten_rows(rows)
    if columns is None:
        cols: list[Column] = default_columns(flat, ood_sets)
    else:
        cols = []
        for i, col in enumerate(columns):
            if isinstance(col, str) or not isinstance(col, Sequence) or len(col) not in (2, 3):
                raise TypeError(
                    f"columns[{i}] must be a (key, header) or (key, header, format_spec) tuple, got {col!r}"
                )
            cols.append((str(col[0]), str(col[1]), str(col[2]) if len(col) == 3 else ".4f"))
    cells = [
        [_format_cell(row.get(key), spec, f"rows[{i}][{key!r}]") for key, _, spec in cols]
        for i, row in enumerate(flat)
    ]
    if bold_best:
        for j, (key, header, _) in enumerate(cols):
            direction = header.rstrip()[-1:] if header.rstrip() else ""
            if direction not in ("↑", "↓"):
                continue
            values = [(_as_number(row.get(key)), i) for i, row in enumerate(flat)]
            values = [(v, i) for v, i in values if v is not None and not math.isnan(v)]
            if len(values) < 2:  # nothing to compare against
                continue
            best = values[0][0]
            for v, _ in values[1:]:
                if _is_better(v, best, direction == "↑"):
                    best = v
            for v, i in values:
                if v == best:
                    cells[i][j] = f"**{cells[i][j]}**"
    lines = [
        "| " + " | ".join(header for _, header, _ in cols) + " |",
        "|" + "|".join(":---" if j == 0 else "---:" for j in range(len(cols))) + "|",
    ]
    lines.extend("| " + " | ".join(row_cells) + " |" for row_cells in cells)
    return "\n".join(lines) + "\n"


def _jsonable(value: Any, where: str = "report") -> Any:
    """Convert to JSON-safe python objects; NaN/inf become null (strict JSON has no NaN)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (np.generic, np.ndarray)):
        return _jsonable(value.tolist(), where)
    if isinstance(value, torch.Tensor):
        return _jsonable(value.detach().cpu().tolist(), where)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"{where} has type {type(value).__name__}, which cannot be written to report.json; "
        f"convert it to a number, string, list or dict"
    )


def _settings_paragraph(settings: Any) -> str:
    if isinstance(settings, str):
        return settings.strip()
    if isinstance(settings, Mapping):
        return "; ".join(f"**{key}**: {value}" for key, value in settings.items()) + "."
    raise TypeError(f"report['settings'] must be a str or a dict, got {type(settings).__name__}")


def _figure_links(report: Mapping[str, Any], out_dir: Path) -> list[tuple[str, str]]:
    """(caption, relative link) for listed figures that exist, then other PNGs in out_dir."""
    figures = report.get("figures") or {}
    if isinstance(figures, (str, os.PathLike)):
        figures = [figures]
    if isinstance(figures, Mapping):
        listed = [(str(caption), Path(p)) for caption, p in figures.items()]
    elif isinstance(figures, Sequence):
        listed = [(Path(p).stem.replace("_", " "), Path(p)) for p in figures]
    else:
        raise TypeError(f"report['figures'] must be a dict or list of paths, got {type(figures).__name__}")
    links: list[tuple[str, str]] = []
    seen: set[Path] = set()
    for caption, p in listed:
        full = p if p.is_absolute() else out_dir / p
        if not full.is_file():
            logger.warning("figure %s listed in the report does not exist; not linking it", full)
            continue
        full = full.resolve()
        seen.add(full)
        try:
            link = full.relative_to(out_dir.resolve()).as_posix()
        except ValueError:
            link = full.as_posix()
        links.append((caption, link))
    for png in sorted(out_dir.glob("*.png")):
        if png.resolve() not in seen:
            links.append((png.stem.replace("_", " "), png.name))
    return links


VERDICTS = ("better", "tie", "worse")
# what identifies the run behind a report: equal in every seed's report of one pipeline
_SAME_RUN_SETTINGS = ("id_data", "ood_data", "score", "base_model", "model")


def _finite_number(value: Any, where: str, fix: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            ok = math.isfinite(float(value))
        except OverflowError:  # an integer beyond float range (10**400)
            ok = False
        if not ok:
            raise HydraInputError(f"{where} is {str(value)[:20]}, not a finite number; {fix}")


def check_seed_report(data: Any, source: str) -> dict[str, Any]:
    """``data`` if it is a report as `hydra-hf evaluate` (or a recipe) writes it, the shape
    :func:`aggregate_seed_reports` reads; else one :class:`HydraInputError` / :class:`HydraTypeError`
    line naming ``source``, the bad field and the fix (pass an unedited report).

    Checked: ``rows`` a non-empty list of objects, each with a unique ``method`` name and values that are
    finite where they are numbers (one level of objects deep, what is aggregated); ``columns`` triples of strings with
    a valid format spec; ``comparisons`` metric -> {difference (finite number), verdict}; ``settings``
    an object or a string.
    """
    fix = "pass the report.json that `hydra-hf evaluate` wrote, unedited"
    if not isinstance(data, dict):
        raise HydraTypeError(f"{source} holds a JSON {type(data).__name__}, not a report object; {fix}")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise HydraInputError(f"{source} has no report rows; {fix}")
    methods = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise HydraTypeError(
                f"{source}: rows[{i}] is a {type(row).__name__}, not an object of column values; {fix}"
            )
        method = row.get("method")
        if not isinstance(method, str) or not method:
            raise HydraInputError(f"{source}: rows[{i}] has no 'method' name; {fix}")
        methods.append(method)
        for key, value in row.items():
            for sub_key, sub in (value.items() if isinstance(value, dict) else [(None, value)]):
                where = f"{source}: {method} {key}" + (f"/{sub_key}" if sub_key is not None else "")
                _finite_number(sub, where, fix)  # deeper values are not aggregated
    if len(set(methods)) != len(methods):
        raise HydraInputError(f"{source} lists a method twice ({methods}); {fix}")
    columns = data.get("columns")
    if columns is not None:
        if not isinstance(columns, list) or not all(
                isinstance(c, (list, tuple)) and len(c) == 3 and all(isinstance(x, str) for x in c) for c in columns):
            raise HydraTypeError(f"{source}: 'columns' must be a list of [key, header, format] strings; {fix}")
        for key, _, spec in columns:
            try:
                format(0.5, spec)
            except (ValueError, TypeError):
                raise HydraInputError(
                    f"{source}: column {key!r} has the format {spec!r}, which formats no number; {fix}"
                ) from None
    comparisons = data.get("comparisons")
    if comparisons is not None:
        if not isinstance(comparisons, dict) or not all(isinstance(c, dict) for c in comparisons.values()):
            raise HydraTypeError(f"{source}: 'comparisons' must map 'A − B' to per-metric intervals; {fix}")
        for name, metrics in comparisons.items():
            for metric, interval in metrics.items():
                where = f"{source}: comparison {name!r} {metric}"
                if not isinstance(interval, dict) or isinstance(interval.get("difference"), bool) or \
                        not isinstance(interval.get("difference"), (int, float)):
                    raise HydraTypeError(f"{where} has no numeric 'difference'; {fix}")
                _finite_number(interval["difference"], f"{where} difference", fix)
                if interval.get("verdict") not in (*VERDICTS, None):
                    raise HydraInputError(
                        f"{where}: verdict {interval.get('verdict')!r} is not one of {list(VERDICTS)}; {fix}"
                    )
    if not isinstance(data.get("settings") or {}, (dict, str)):
        raise HydraTypeError(f"{source}: 'settings' must be an object or a string; {fix}")
    if not isinstance(data.get("ood_sets") or [], list):
        raise HydraTypeError(f"{source}: 'ood_sets' must be a list of names; {fix}")
    return data


def _same_run(reports: Sequence[Mapping[str, Any]]) -> None:
    """Refuse reports that cannot be seeds of one pipeline: the same numbers twice (one run given twice),
    other data, or a method whose model differs in size (another model under the same name)."""
    rows = [json.dumps(r["rows"], sort_keys=True) for r in reports]
    for j in range(len(reports)):
        for i in range(j):
            if rows[i] == rows[j]:
                raise ValueError(f"reports {i + 1} and {j + 1} hold the same numbers (one run given twice?); "
                                 "pass one report per seed")
    settings = [r.get("settings") if isinstance(r.get("settings"), Mapping) else {} for r in reports]
    for key in _SAME_RUN_SETTINGS:
        values = [json.dumps(s.get(key), sort_keys=True) for s in settings]
        if all(key in s for s in settings) and len(set(values)) > 1:
            raise ValueError(f"the reports were run with different {key} ({[s[key] for s in settings]}); "
                             "aggregate the seeds of one pipeline only")
    for i, row in enumerate(reports[0]["rows"]):
        recipes = [r["rows"][i].get("recipe") for r in reports]
        if all(isinstance(v, str) for v in recipes):  # what identifies a recipe (evaluate writes it)
            if len(set(recipes)) > 1:
                raise ValueError(f"{row.get('method')!r} is {sorted(set(recipes))} across the reports: other models "
                                 "under one name; aggregate the seeds of one pipeline only")
            continue
        sizes = [r["rows"][i].get("params_m") for r in reports]  # reports without a recipe: the parameter count
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in sizes) and \
                max(sizes) - min(sizes) > 1e-6 * max(abs(v) for v in sizes):
            raise ValueError(f"{row.get('method')!r} has {sizes} M parameters across the reports: other models under "
                             "one name; aggregate the seeds of one pipeline only")


def aggregate_seed_reports(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation (over pipeline seeds) of every number of several reports.

    The reports must list the same methods in the same order (one report per seed of the same
    pipeline). Returns a report whose ``rows`` hold the means, ``rows_std`` the sample standard
    deviations (0 for one seed) and ``seeds`` the count; :func:`write_report` renders it as
    ``mean ± std`` cells.
    """
    if isinstance(reports, Mapping) or not reports:
        raise ValueError("pass a non-empty list of reports (one report.json dict per seed)")
    methods = [[row.get("method") for row in r["rows"]] for r in reports]
    if any(m != methods[0] for m in methods):
        raise ValueError(f"the reports list different methods {methods}; aggregate runs of one pipeline only")
    _same_run(reports)
    flat = [_flatten_rows(r["rows"]) for r in reports]
    means, stds = [], []
    for i, method in enumerate(methods[0]):
        keys = [k for k in flat[0][i] if all(_as_number(f[i].get(k)) is not None for f in flat)]
        mean_row: dict[str, Any] = {"method": method}
        std_row: dict[str, Any] = {"method": method}
        for key in keys:
            try:
                values = np.array([float(_as_number(f[i][key])) for f in flat])
            except OverflowError:  # an integer beyond float range
                values = np.array([math.inf])
            with np.errstate(over="ignore", invalid="ignore"):
                mean_row[key] = float(values.mean())
                std_row[key] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
            if not (math.isfinite(mean_row[key]) and math.isfinite(std_row[key])):
                raise ValueError(f"{method} {key}: the values {values.tolist()} have no finite mean and standard "
                                 "deviation (not a metric a report holds); pass unedited reports")
        means.append(_unflatten(mean_row))
        stds.append(_unflatten(std_row))
    first = reports[0]
    out = {
        key: first[key]
        for key in ("title", "ood_sets", "ood_score", "ood_scores", "settings", "columns")
        if key in first
    }
    out.update(rows=means, rows_std=stds, seeds=len(reports))
    return out


def summarize_seed_comparisons(reports: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each paired comparison (``"A − B"``) over the seeds whose reports carry it: per metric, the mean
    and standard deviation of the differences and how many seeds' intervals said better / tie / worse."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    names = [
        name
        for name in (reports[0].get("comparisons") or {})
        if all(name in (r.get("comparisons") or {}) for r in reports)
    ]
    for name in names:
        for metric in reports[0]["comparisons"][name]:
            rows = [r["comparisons"][name].get(metric) for r in reports]
            if any(row is None for row in rows):
                continue
            diffs = np.array([float(row["difference"]) for row in rows])
            verdicts = [row.get("verdict") for row in rows]
            out.setdefault(name, {})[metric] = {
                "mean": float(diffs.mean()),
                "std": float(diffs.std(ddof=1)) if len(diffs) > 1 else 0.0,
                "seeds": len(rows),
                **{v: verdicts.count(v) for v in ("better", "tie", "worse")},
            }
    return out


def render_seed_comparisons(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """Markdown for :func:`summarize_seed_comparisons`."""
    parts = ["## Paired differences over seeds\n"]
    for name, rows in summary.items():
        seeds = next(iter(rows.values()), {}).get("seeds", "?")
        parts.append(f"**{name}**: mean ± std of the difference over {seeds} seeds, and how many seeds' paired "
                     "intervals said better / tie / worse\n")
        parts.append("| metric | difference | better | tie | worse |\n|:---|---:|---:|---:|---:|")
        for metric, row in rows.items():
            parts.append(
                f"| {metric} | {row['mean']:+.4f} ± {row['std']:.4f} | "
                f"{row['better']} | {row['tie']} | {row['worse']} |"
            )
        parts.append("")
    return "\n".join(parts) + "\n"


def _unflatten(row: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        prefix, sep, sub = key.rpartition("/")
        if sep:
            out.setdefault(prefix, {})[sub] = value
        else:
            out[key] = value
    return out


def mean_std_rows(
    rows: Sequence[Mapping[str, Any]], rows_std: Sequence[Mapping[str, Any]], spec: str = ".4f"
) -> list[dict]:
    """Rows whose numbers read ``mean ± std`` (strings), for the Results table of a seed aggregate."""
    out = []
    for mean, std in zip(_flatten_rows(rows), _flatten_rows(rows_std)):
        row = {}
        for key, value in mean.items():
            number, spread = _as_number(value), _as_number(std.get(key))
            row[key] = value if number is None or spread is None else f"{number:{spec}} ± {spread:{spec}}"
        out.append(_unflatten(row))
    return out


def near_chance_rows(rows: Sequence[Mapping[str, Any]], labels: Any, num_classes: int | None = None) -> dict[str, Any]:
    """The report's ``near_chance`` entry: the chance levels of the labelled ID data
    (:func:`hydra_hf.metrics.chance_levels`) and, per row whose accuracy or NLL is near them, why
    (:func:`hydra_hf.metrics.near_chance`). A comparison with such a row says nothing about the method
    compared: the report and the model card mark it instead of reading its verdicts as a win."""
    levels = chance_levels(labels, num_classes)
    near = {}
    for row in rows:
        accuracy, nll = _as_number(row.get("accuracy")), _as_number(row.get("nll"))
        reason = near_chance(levels, accuracy=accuracy, nll=nll)
        if reason:
            near[str(row.get("method"))] = reason
    return {"levels": levels, "rows": near}


def _compared(name: str) -> tuple[str, str]:
    a, _, b = name.partition(" − ")
    return a, b


def near_chance_note(name: str, near: Mapping[str, str] | None) -> str | None:
    """The line that marks the comparison ``"A − B"`` when A or B is near chance (``near``: the report's
    ``near_chance["rows"]``), else None."""
    weak = [(row, near[row]) for row in _compared(name) if near and row in near]
    if not weak:
        return None
    who = "; ".join(f"**{row}** is near chance ({reason})" for row, reason in weak)
    return (f"{who}: it learned next to nothing, so these differences are no win or loss of the method; train it "
            "until it learns (hydra-hf finetune warns when a run does not) and compare again")


def render_comparisons(comparisons: Mapping[str, Mapping[str, Mapping[str, Any]]],
                       near_chance: Mapping[str, str] | None = None) -> str:
    """Markdown for paired bootstrap differences: one table per comparison (``"A − B"``), one row per
    metric with the difference, its interval and the verdict (a tie when the interval holds 0).
    ``near_chance`` (row -> why, :func:`near_chance_rows`): a comparison with such a row is marked, and
    its verdicts read "not comparable" instead of better / worse."""
    parts = ["## Paired differences\n"]
    for name, rows in comparisons.items():
        first = next(iter(rows.values()), {})
        level = int(round(100 * float(first.get("level", 0.95))))
        parts.append(f"**{name}** (paired bootstrap, {first.get('n_boot', '?')} resamples, {level} % interval; "
                     "a difference whose interval contains 0 is a tie)\n")
        note = near_chance_note(name, near_chance)
        if note:
            parts.append(f"> {note}.\n")
        parts.append("| metric | difference | interval | verdict |\n|:---|---:|:---:|:---|")
        for metric, row in rows.items():
            verdict = row["verdict"] if not note or row["verdict"] == "tie" else \
                f"not comparable ({row['verdict']} than a model near chance)"
            parts.append(f"| {metric} | {row['difference']:+.4f} | [{row['ci_low']:+.4f}, {row['ci_high']:+.4f}] | "
                         f"{verdict} |")
        parts.append("")
    return "\n".join(parts) + "\n"


def write_report(
    report: Mapping[str, Any], out_dir: str | os.PathLike[str], *, bold_best: bool = True
) -> dict[str, str]:
    """Write ``report.json`` (all numbers) and ``report.md`` (human-readable) into ``out_dir``.

    Args:
        report: a dict with ``"rows"`` (list of row dicts, required) and optionally ``"title"``
            (str), ``"settings"`` (str or dict, rendered as a paragraph), ``"columns"`` and
            ``"ood_sets"`` (passed to :func:`render_markdown_table`), ``"figures"`` (dict caption ->
            PNG path, or list of paths; relative paths are relative to ``out_dir``) and ``"notes"``
            (str). Any other keys are kept in ``report.json``. PNGs already in ``out_dir`` are
            linked as well.
        out_dir: output folder (created if needed).
        bold_best: bold the best value of each ↑/↓ column (see :func:`render_markdown_table`).

    Returns:
        ``{"json": path, "markdown": path}``. Both files are written atomically, and nothing is
        written if the report is invalid.
    """
    if not isinstance(report, Mapping):
        raise TypeError(f"report must be a dict, got {type(report).__name__}")
    if "rows" not in report:
        raise ValueError("report has no 'rows'; pass report={'rows': [ {...one dict per method...} ], ...}")
    # build everything before touching the disk
    if report.get("rows_std"):  # a seed aggregate: mean ± std cells
        table = render_markdown_table(mean_std_rows(report["rows"], report["rows_std"]), report.get("columns"),
                                      ood_sets=report.get("ood_sets"), bold_best=False)
        table += f"\nMean ± standard deviation over {report.get('seeds', '?')} seeds.\n"
    else:
        table = render_markdown_table(
            report["rows"], report.get("columns"), ood_sets=report.get("ood_sets"), bold_best=bold_best
        )
    payload = json.dumps(_jsonable(dict(report)), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    title = str(report.get("title") or "Hydra Ensembles evaluation")
    parts = [f"# {title}\n"]
    if report.get("settings"):
        parts.append("## Settings\n\n" + _settings_paragraph(report["settings"]) + "\n")
    parts.append(
        "## Results\n\n"
        + table
        + "\n↑ higher is better, ↓ lower is better; best in bold. Brier is the multi-class sum "
        "(in [0, 2]); NLL in nats; ECE with equal-width and aECE with equal-mass bins (top label). "
        "OOD scores are \"higher = more in-distribution\"; AUROC and AUPR-In treat in-distribution as "
        "positive, AUPR-Out treats OOD as positive; FPR95 is the fraction of OOD samples accepted at "
        "95 % in-distribution recall.\n"
    )
    if report.get("ood_score"):
        per_row = report.get("ood_scores") or {}
        parts.append(
            f"OOD score of every row: `{report['ood_score']}`"
            + (" except " + ", ".join(f"**{name}**: `{value}`" for name, value in per_row.items()) if per_row else "")
            + ".\n"
        )
    if report.get("comparison_summary"):
        parts.append(render_seed_comparisons(report["comparison_summary"]))
    if report.get("comparisons"):
        chance = report.get("near_chance")
        near = chance.get("rows") if isinstance(chance, Mapping) else None
        parts.append(render_comparisons(report["comparisons"], near))
    if report.get("notes"):
        parts.append("## Notes\n\n" + str(report["notes"]).strip() + "\n")

    out = Path(out_dir)
    links = _figure_links(report, out)
    if links:
        parts.append("## Figures\n\n" + "\n\n".join(f"![{caption}]({link})" for caption, link in links) + "\n")
    markdown = "\n".join(parts)

    out.mkdir(parents=True, exist_ok=True)

    json_path, md_path = out / "report.json", out / "report.md"
    write_text_atomic(json_path, payload)
    write_text_atomic(md_path, markdown)
    logger.debug("wrote %s and %s", json_path, md_path)  # often inside a temporary folder: callers name the output
    return {"json": str(json_path), "markdown": str(md_path)}


def write_evaluation_report(
    result: EvaluationResult,
    out_dir: str | os.PathLike,
    *,
    title: str = "Hydra Ensembles evaluation",
    settings: Any = None,
    notes: str | None = None,
    extra: Mapping[str, Any] | None = None,
    comparisons: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """Write ``report.json``, ``report.md``, ``reliability.png`` and ``ood_scores.png`` into ``out_dir``.

    ``comparisons`` (``{"Hydra − Single": compare_predictions(...)}``) adds the paired bootstrap
    intervals of the differences, shown as a table with a verdict per metric.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reliability = plots.reliability_diagram(
        {name: (p.probs, p.labels) for name, p in result.id_predictions.items()}, out / "reliability.png",
        title="Reliability (in-distribution test data)",
    )
    histogram = plots.ood_histogram(
        {
            name: (result.id_predictions[name].ood_scores(result.score_of(name)),
                   {o: p.ood_scores(result.score_of(name)) for o, p in result.ood_predictions[name].items()})
            for name in result.id_predictions
        },
        out / "ood_scores.png",
        score_name=(result.score.upper() if result.score == "msp" else result.score)
        + "".join(f"; {name}: {value}" for name, value in result.scores.items()),
    )
    report = {
        "title": title,
        "rows": result.rows,
        "ood_score": result.score,
        **({"ood_scores": dict(result.scores)} if result.scores else {}),
        "ood_sets": sorted({o for preds in result.ood_predictions.values() for o in preds}),
        "figures": {
            "Reliability diagram": os.path.basename(reliability),
            "OOD score histograms": os.path.basename(histogram),
        },
    }
    if settings is not None:
        report["settings"] = settings
    if notes:
        report["notes"] = notes
    if comparisons:
        report["comparisons"] = {name: dict(value) for name, value in comparisons.items()}
    if result.latency_batch is not None:  # what a latency number means: its batch, machine and threads
        report["latency"] = {"batch": result.latency_batch, "statistic": "median ms per batch",
                             "machine": describe_machine(), "torch_threads": torch.get_num_threads()}
    labelled = next((p for p in result.id_predictions.values() if p.labels is not None), None)
    if labelled is not None:
        report["near_chance"] = near_chance_rows(result.rows, labelled.labels, labelled.probs.shape[-1])
        for name in report.get("comparisons") or {}:
            note = near_chance_note(name, report["near_chance"]["rows"])
            if note:
                logger.warning("%s: %s", name, note.replace("**", ""))
    if extra:
        report.update(extra)
    return write_report(report, out)
