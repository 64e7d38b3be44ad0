"""The ceiling table on the embedded text testbed (issue 23): Single (mean ± std over seeds), the real
Deep Ensemble of those Singles and, optionally, a Hydra recipe that selects without OOD data, per OOD
kind, on validation splits only. Writes OUTPUT/ceiling.md and OUTPUT/ceiling.json; cached per model,
so a re-run resumes. The Singles are the study's (same folders): run it on the study's --output to
share them.

    python examples/ceiling_text.py --output outputs/study --seeds 0 1 2
    python examples/ceiling_text.py --output outputs/study --seeds 0 1 2 --hydra taylor-k6 \
        --results docs/results/ceiling_text.json   # the file docs/study.md's ceiling table is rendered from
    python examples/ceiling_text.py --output outputs/study --seeds 0 1 2 --hydra slim-k4
    python examples/ceiling_text.py --output outputs/study --seeds 0 1 2 --hydra slim-k6-m33
    python examples/ceiling_text.py --output outputs/study --seeds 0 1 2 --hydra slim-k6-m50-ft480
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from hydra_hf.cli import run_script
from hydra_hf.outputs import write_text_atomic
from hydra_hf.recipes.ceiling import ceiling_numbers, ceiling_table, render_ceiling
from hydra_hf.recipes.study import Candidate, TextStudy
from hydra_hf.reproducibility import add_threads_argument, command_line, describe_threads, pin_threads

# Hydra recipes the ceiling can add (they select without OOD data, so every OOD kind stays unseen)
HYDRA = {
    "taylor-k6": Candidate("Taylor, keep 6 per layer, held-out n=1000, ft 120, seeds offset", method="taylor",
                           remove=None, heads_per_layer=6, samples=1000, selection="heldout", member_seed_offset=1000),
    "taylor-r36": Candidate("taylor", method="taylor"),  # the demo's recipe, as the study names it
    # slim members (an extension, docs/slim.md): the members split every layer's heads (4 of 12 each) and MLP
    # neurons (33 % each, spread): about one Single's multiply-adds; selected like taylor-k6
    "slim-k4": Candidate("slim: Taylor, keep 4 per layer, 33 % of the MLP, held-out n=1000, ft 120, seeds offset",
                         method="taylor", remove=None, heads_per_layer=4, samples=1000, selection="heldout",
                         member_seed_offset=1000, mlp_keep=0.33, mlp_spread=True),
    # larger slim budgets: today's heads (6 of 12 per member) and a third (1.17x) or half (1.50x) of every MLP
    "slim-k6-m33": Candidate("slim: Taylor, keep 6 per layer, 33 % of the MLP, held-out n=1000, ft 120, seeds offset",
                             method="taylor", remove=None, heads_per_layer=6, samples=1000, selection="heldout",
                             member_seed_offset=1000, mlp_keep=0.33, mlp_spread=True),
    "slim-k6-m50": Candidate("slim: Taylor, keep 6 per layer, 50 % of the MLP, held-out n=1000, ft 120, seeds offset",
                             method="taylor", remove=None, heads_per_layer=6, samples=1000, selection="heldout",
                             member_seed_offset=1000, mlp_keep=0.5, mlp_spread=True),
    # the same members fine-tuned 4x as long (480 steps, about 2.6 epochs of the training split): what training,
    # not inference, can restore of a pruned MLP (the selection is the same: the masks are shared)
    "slim-k4-ft480": Candidate(
        "slim: Taylor, keep 4 per layer, 33 % of the MLP, held-out n=1000, ft 480, seeds offset", method="taylor",
        remove=None, heads_per_layer=4, samples=1000, selection="heldout", member_seed_offset=1000, mlp_keep=0.33,
        mlp_spread=True, member_steps=480),
    "slim-k6-m50-ft480": Candidate(
        "slim: Taylor, keep 6 per layer, 50 % of the MLP, held-out n=1000, ft 480, seeds offset", method="taylor",
        remove=None, heads_per_layer=6, samples=1000, selection="heldout", member_seed_offset=1000, mlp_keep=0.5,
        mlp_spread=True, member_steps=480),
    # every member keeps the MLP neurons its own Taylor scores rank highest (no spread: members overlap on the
    # important neurons); the same compute as slim-k6-m33 (each member keeps a third of every MLP)
    "slim-k6-m33-top": Candidate(
        "slim: Taylor, keep 6 per layer, top 33 % of the MLP, held-out n=1000, ft 120, seeds offset",
        method="taylor", remove=None, heads_per_layer=6, samples=1000, selection="heldout", member_seed_offset=1000,
        mlp_keep=0.33, mlp_spread=False),
    "slim-k6-m33-top-ft480": Candidate(
        "slim: Taylor, keep 6 per layer, top 33 % of the MLP, held-out n=1000, ft 480, seeds offset",
        method="taylor", remove=None, heads_per_layer=6, samples=1000, selection="heldout", member_seed_offset=1000,
        mlp_keep=0.33, mlp_spread=False, member_steps=480),
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="outputs/study", help="the study folder (Singles are shared)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--hydra", choices=sorted(HYDRA), default=None, help="add a Hydra recipe's rows")
    parser.add_argument("--results", default=None,
                        help="also write the table, the command and the threads here (docs/results/ceiling_text.json)")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    threads = pin_threads(args.threads)  # first, before any torch work: the runs repeat on any machine of this kind
    print(describe_threads(threads))
    out = Path(args.output)
    numbers = ceiling_numbers(TextStudy(), out, args.seeds, hydra=HYDRA.get(args.hydra))
    table = ceiling_table(numbers)
    text = render_ceiling(table, title=f"Ceiling table: embedded text testbed, seeds {args.seeds}")
    write_text_atomic(out / "ceiling.md", text)
    write_text_atomic(out / "ceiling.json", json.dumps(table, indent=2) + "\n")
    if args.results:
        record = {"command": command_line(__file__, argv), "threads": threads, "seeds": args.seeds,
                  "hydra": args.hydra, "table": table}
        write_text_atomic(Path(args.results), json.dumps(record, indent=1, default=str) + "\n")
    print(text)
    return table


if __name__ == "__main__":
    run_script(main)
