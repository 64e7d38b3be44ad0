"""The selection protocol on the embedded text data (`make study`): which Hydra recipe transfers to
OOD text that nobody selected on? Validation splits only, leave-one-OOD-kind-out (see
`hydra_hf.study`). Prints the decision table and writes it to OUTPUT/decision.md (and the bars to decision.png: one row
per candidate; decision_all_rows.png: every row).

    python examples/study_text.py --output outputs/study --seeds 0 1 2 --screen   # what `make study` runs
    python examples/study_text.py --output outputs/study --seeds 0 1 2            # every candidate on every seed
    # two processes sharing the work (each takes every other cell), then the table:
    python examples/study_text.py --output outputs/study --shard 0/2 &
    python examples/study_text.py --output outputs/study --shard 1/2
    python examples/study_text.py --output outputs/study --table-only

Cells are cached: re-running resumes. A cell takes 15-40 minutes of one core at MiniLM scale (docs/study.md).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from hydra_hf.cli import run_script
from hydra_hf.study import (
    DEFAULT_CANDIDATES,
    TextStudy,
    collect,
    decide,
    plot_decision,
    render_decision_table,
    render_selection_noise,
    run_study,
    selection_noise,
    study_data,
)


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: use I/N, e.g. 0/2") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def _candidate(text: str) -> int:
    names = ", ".join(f"{i} = {c.name}" for i, c in enumerate(DEFAULT_CANDIDATES))
    try:
        index = int(text)
    except ValueError:
        index = -1
    if not 0 <= index < len(DEFAULT_CANDIDATES):
        raise argparse.ArgumentTypeError(f"{text!r} is not a candidate index; the default grid has {names}")
    return index


def _single(text: str) -> tuple[int, str]:
    seed, sep, folder = text.partition("=")
    if not sep or not seed.strip().lstrip("-").isdigit() or not folder:
        raise argparse.ArgumentTypeError(f"{text!r}: use SEED=DIR, e.g. 0=outputs/demo/single.work/member_0/model")
    return int(seed), folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="outputs/study", help="study folder (default outputs/study); re-running resumes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="pipeline seeds (default 0)")
    parser.add_argument("--single", action="append", default=[], metavar="SEED=DIR", type=_single,
                        help="reuse a fine-tuned Single checkpoint for a seed (e.g. 0=outputs/demo/single.work/member_0/model)")
    parser.add_argument("--shard", type=_shard, default=(0, 1), help="I/N: run every N-th cell starting at I (default 0/1)")
    parser.add_argument("--candidates", nargs="+", type=_candidate, default=None, metavar="INDEX",
                        help="indices into the default grid to run (default: all); the table lists what is finished")
    parser.add_argument("--screen", action="store_true",
                        help="two-stage protocol: every candidate on the first seed, then the other seeds only for the "
                             "candidates within TextStudy.replicate_margin of the best on the first seed (with --shard: "
                             "run it again once every process has finished, to replicate what the others screened)")
    parser.add_argument("--table-only", action="store_true", help="print the table of the finished cells and exit")
    parser.add_argument("--selection-noise", action="store_true",
                        help="measure instead how reproducible the circuit search's first step is on two disjoint "
                             "selection sets (the first seed's Single; writes OUTPUT/selection_noise.md)")
    parser.add_argument("--noise-sizes", type=int, nargs="+", default=[48, 96, 192], metavar="N",
                        help="selection-set sizes for --selection-noise (default 48 96 192)")
    parser.add_argument("--noise-kinds", nargs="+", default=None, metavar="KIND",
                        help="OOD kinds for --selection-noise (default: all); sizes a kind's pool cannot hold are skipped")
    parser.add_argument("--noise-repeats", type=int, default=3, metavar="R",
                        help="random pairs of disjoint selection sets per size for --selection-noise (default 3)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    study = TextStudy()
    candidates = DEFAULT_CANDIDATES if args.candidates is None else tuple(DEFAULT_CANDIDATES[i] for i in args.candidates)
    singles = dict(args.single)
    out = Path(args.output)
    if args.selection_noise:
        from hydra_hf.pruning import load_pruning_target

        seed = args.seeds[0]
        if seed not in singles:
            parser.error(f"--selection-noise needs the Single of seed {seed}: give --single {seed}=DIR")
        target = load_pruning_target(singles[seed])
        data, folder = study_data(study, target.tokenizer), out / "selection_noise"
        folder.mkdir(parents=True, exist_ok=True)
        for kind in args.noise_kinds or list(study.ood_validation):
            for n in args.noise_sizes:  # one file per (kind, n): an interrupted run resumes
                file = folder / f"seed{seed}_{kind}_n{n}.json"
                if file.exists() or 2 * n > min(len(data.id_pool), len(data.ood_pool[kind])):
                    continue
                rows = selection_noise(target, data, sizes=(n,), kind=kind, repeats=args.noise_repeats, seed=seed)
                file.write_text(json.dumps(rows, indent=2) + "\n")
        rows = [r for f in sorted(folder.glob(f"seed{seed}_*.json")) for r in json.loads(f.read_text())]
        rows.sort(key=lambda r: (list(study.ood_validation).index(r["kind"]), r["n"], r["score"] != "ood"))
        table = render_selection_noise(rows)
        (out / "selection_noise.md").write_text(table)
        print(table)
        return
    if args.table_only:
        summary = collect(out, study, DEFAULT_CANDIDATES)
    else:
        run_study(study, out, candidates=candidates, seeds=args.seeds, singles=singles, shard=args.shard,
                  screen=args.screen)
        summary = collect(out, study, DEFAULT_CANDIDATES)
    table = (render_decision_table(summary, study, best_per_candidate=True)
             + "\nEvery row (fusion x OOD score) of every candidate:\n\n"
             + render_decision_table(summary, study, preamble=False))
    (out / "decision.md").write_text(table)
    if summary["rows"]:
        plot_decision(summary, study, out / "decision.png", best_per_candidate=True)
        plot_decision(summary, study, out / "decision_all_rows.png")
    (out / "summary.json").write_text(json.dumps({"summary": summary, "choice": decide(summary, study)}, indent=2) + "\n")
    print(table)


if __name__ == "__main__":
    run_script(main)  # bad input: one line, as the hydra-hf commands give it
