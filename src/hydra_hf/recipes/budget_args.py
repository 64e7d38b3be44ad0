"""The recipe scripts' budget flags: ``--heads-per-layer K`` (keep K heads in every layer, the paper's
budgets) or ``--remove N`` (N heads anywhere), one of the two, with the recipe's default."""

from __future__ import annotations

import argparse
from typing import Any


def add_budget_arguments(parser: argparse.ArgumentParser, *, heads_per_layer: int | None = None,
                         remove: int | None = None) -> None:
    """Add the two exclusive budget flags; exactly one of ``heads_per_layer`` / ``remove`` is the default."""
    if (heads_per_layer is None) == (remove is None):
        raise ValueError("give the recipe's default budget as exactly one of heads_per_layer / remove")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--heads-per-layer", type=int, default=None, metavar="K",
                       help="keep K heads in every layer of every member"
                       + (f" (default: {heads_per_layer}, the paper's budget)" if heads_per_layer is not None else ""))
    group.add_argument(
        "--remove",
        type=int,
        default=None,
        metavar="N",
        help="or: remove N heads per member, anywhere" + (f" (default: {remove})" if remove is not None else ""),
    )
    parser.set_defaults(_budget_defaults=(heads_per_layer, remove))


def budget_arguments(args: argparse.Namespace, *, smoke_heads_per_layer: int | None = None,
                     smoke_remove: int | None = None) -> dict[str, Any]:
    """``{"heads_per_layer": K, "remove": None}`` or ``{"heads_per_layer": None, "remove": N}`` from the
    parsed flags (the recipe's default when neither is given). ``smoke_*`` cap the values for the
    tiny ``--smoke`` model, so that it still prunes something and keeps something."""
    default_k, default_n = args._budget_defaults
    k, n = args.heads_per_layer, args.remove
    if k is None and n is None:
        k, n = default_k, default_n
    if n is not None:
        return {"heads_per_layer": None, "remove": min(n, smoke_remove) if smoke_remove is not None else n}
    return {
        "heads_per_layer": min(k, smoke_heads_per_layer) if smoke_heads_per_layer is not None else k,
        "remove": None,
    }
