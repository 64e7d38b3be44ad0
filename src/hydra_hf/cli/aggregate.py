"""`hydra-hf aggregate`: one report of several seeds' reports (mean ± std of every number, and each
seed's paired bootstrap intervals), as the card and the README show seed spreads. The options become an
:class:`~hydra_hf.workflows.aggregate.AggregateSpec` and :func:`~hydra_hf.workflows.aggregate.aggregate` does the
work."""

from __future__ import annotations

import argparse
import json

from ..workflows.aggregate import AggregateSpec, aggregate


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


def run(args: argparse.Namespace) -> int:
    out, result = aggregate(AggregateSpec(args.reports, args.output, overwrite=args.overwrite))
    print(json.dumps({"output": str(out), "seeds": result["seeds"], "methods": [r["method"] for r in result["rows"]]}))
    return 0
