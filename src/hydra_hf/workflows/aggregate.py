"""``hydra-hf aggregate``: one report of several seeds' reports (mean ± std of every number, and each seed's
paired bootstrap intervals), as the card and the README show seed spreads.

:func:`aggregate` reads an :class:`AggregateSpec`, reads and checks every report
(:func:`hydra_hf.evaluation.report.check_seed_report`), aggregates them
(:func:`~hydra_hf.evaluation.report.aggregate_seed_reports`) and writes the owned output folder.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HydraInputError
from ..evaluation.report import aggregate_seed_reports, check_seed_report, summarize_seed_comparisons, write_report
from ..outputs import check_output, read_json, write_output_folder

__all__ = ["AggregateSpec", "aggregate"]


@dataclass(frozen=True)
class AggregateSpec:
    """What ``hydra-hf aggregate`` reads and writes.

    Attributes:
        reports: report folders (or report.json files) of ``hydra-hf evaluate`` or a recipe, one per seed.
        output: the aggregate report folder (must not exist or be empty, unless ``overwrite``).
        overwrite: replace ``output`` when an earlier ``hydra-hf aggregate`` wrote it.

    Raises:
        HydraInputError: fewer than 2 reports.
    """

    reports: Sequence[str | os.PathLike]
    output: str | os.PathLike
    overwrite: bool = False

    def __post_init__(self) -> None:
        if len(self.reports) < 2:
            raise HydraInputError(f"aggregate needs the reports of at least 2 seeds, got {len(self.reports)}")


def aggregate(spec: AggregateSpec) -> tuple[Path, dict[str, Any]]:
    """Aggregate ``spec.reports`` into ``spec.output``; returns the folder and the aggregate written."""
    sources = [str(s) for s in spec.reports]
    check_output(spec.output, command="aggregate", overwrite=spec.overwrite, inputs=sources)
    files = [(Path(s) / "report.json" if Path(s).is_dir() else Path(s)).resolve() for s in sources]
    for j, file in enumerate(files):
        if file in files[:j]:
            raise HydraInputError(f"{sources[j]!r} names the same report as {sources[files.index(file)]!r}; "
                                  "pass one report per seed")
    reports = [_read(source) for source in sources]
    try:
        result = aggregate_seed_reports(reports)
    except ValueError as exc:
        raise HydraInputError(str(exc)) from None
    comparisons = {}
    for source, report in zip(sources, reports):
        seed = (report.get("settings") or {}).get("seed") if isinstance(report.get("settings"), dict) else None
        for name, rows in (report.get("comparisons") or {}).items():
            comparisons[f"{name} ({'seed ' + str(seed) if seed is not None else source})"] = rows
    if comparisons:
        try:
            result["comparison_summary"] = summarize_seed_comparisons(reports)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise HydraInputError(f"a report's paired comparisons are not what `hydra-hf evaluate` writes ({exc!r}); "
                                  "pass unedited report folders") from None
        result["comparisons"] = comparisons
    result["sources"] = sources
    out = write_output_folder(spec.output, lambda tmp: write_report(result, tmp), command="aggregate",
                              overwrite=spec.overwrite, inputs=sources)
    return out, result


def _read(spec: str) -> dict:
    path = Path(spec)
    file = path / "report.json" if path.is_dir() else path
    if file.is_symlink() or not (file.exists() or path.is_dir()):
        raise HydraInputError(
            f"{spec!r} is not a report folder or report.json; pass what `hydra-hf evaluate --report` wrote"
        )
    data = read_json(file, what="report", fix="pass the report.json that `hydra-hf evaluate` wrote, unedited")
    return check_seed_report(data, repr(str(file)))
