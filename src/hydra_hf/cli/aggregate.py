"""`hydra-hf aggregate`: one report of several seeds' reports (mean ± std of every number, and each
seed's paired bootstrap intervals), as the card and the README show seed spreads."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ..errors import HydraInputError
from ..evaluation.report import aggregate_seed_reports, check_seed_report, summarize_seed_comparisons, write_report
from ..outputs import check_output, read_json, write_output_folder

logger = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "aggregate",
        help="average several seeds' evaluation reports (mean ± std)",
        description="Write one report from the reports of several pipeline seeds (the same methods in the same "
        "order): every number as mean ± standard deviation, and every seed's paired bootstrap intervals.",
    )
    p.add_argument("reports", nargs="+", metavar="REPORT",
                   help="report folders (or report.json files) of `hydra-hf evaluate` or a recipe, one per seed")
    p.add_argument("--output", required=True, help="output folder (must not exist or be empty, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --output if it holds an earlier `hydra-hf aggregate` report (never another folder)")
    p.set_defaults(func=run)


def _read(spec: str) -> dict:
    path = Path(spec)
    file = path / "report.json" if path.is_dir() else path
    if file.is_symlink() or not (file.exists() or path.is_dir()):
        raise HydraInputError(
            f"{spec!r} is not a report folder or report.json; pass what `hydra-hf evaluate --report` wrote"
        )
    data = read_json(file, what="report", fix="pass the report.json that `hydra-hf evaluate` wrote, unedited")
    return check_seed_report(data, repr(str(file)))


def run(args: argparse.Namespace) -> int:
    if len(args.reports) < 2:
        raise HydraInputError(f"aggregate needs the reports of at least 2 seeds, got {len(args.reports)}")
    check_output(args.output, command="aggregate", overwrite=args.overwrite, inputs=args.reports)
    files = [(Path(s) / "report.json" if Path(s).is_dir() else Path(s)).resolve() for s in args.reports]
    for j, file in enumerate(files):
        if file in files[:j]:
            raise HydraInputError(f"{args.reports[j]!r} names the same report as {args.reports[files.index(file)]!r}; "
                                  "pass one report per seed")
    reports = [_read(spec) for spec in args.reports]
    try:
        aggregate = aggregate_seed_reports(reports)
    except ValueError as exc:
        raise HydraInputError(str(exc)) from None
    comparisons = {}
    for spec, report in zip(args.reports, reports):
        seed = (report.get("settings") or {}).get("seed") if isinstance(report.get("settings"), dict) else None
        for name, rows in (report.get("comparisons") or {}).items():
            comparisons[f"{name} ({'seed ' + str(seed) if seed is not None else spec})"] = rows
    if comparisons:
        try:
            aggregate["comparison_summary"] = summarize_seed_comparisons(reports)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise HydraInputError(f"a report's paired comparisons are not what `hydra-hf evaluate` writes ({exc!r}); "
                                  "pass unedited report folders") from None
        aggregate["comparisons"] = comparisons
    aggregate["sources"] = [str(s) for s in args.reports]
    out = write_output_folder(args.output, lambda tmp: write_report(aggregate, tmp), command="aggregate",
                              overwrite=args.overwrite, inputs=args.reports)
    print(
        json.dumps(
            {"output": str(out), "seeds": aggregate["seeds"], "methods": [r["method"] for r in aggregate["rows"]]}
        )
    )
    return 0
