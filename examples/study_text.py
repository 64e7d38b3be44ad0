"""The selection protocol on the embedded text data (`make study`): which Hydra recipe transfers to
OOD text that nobody selected on? Validation splits only, leave-one-OOD-kind-out (see
`hydra_hf.recipes.study`). Prints the decision table and writes it to OUTPUT/decision.md (and the bars to decision.png:
one row per candidate; decision_all_rows.png: every row).

    python examples/study_text.py --output outputs/study --seeds 0 1 2 --screen   # what `make study` runs
    python examples/study_text.py --output outputs/study --seeds 0 1 2            # every candidate on every seed
    # two processes sharing the work (each takes every other cell), then the table:
    python examples/study_text.py --output outputs/study --shard 0/2 &
    python examples/study_text.py --output outputs/study --shard 1/2
    python examples/study_text.py --output outputs/study --table-only
    # another model and data (local folders or `hydra-hf` data specs; validation splits only):
    python examples/study_text.py --output runs/study-sst2 --seeds 0 1 2 --screen --base-model bert-base-uncased-dir \
        --train-data sst2_dir:train --id-validation sst2_dir:validation --labels negative positive --max-length 64 \
        --ood agnews=ag_news_dir:validation --ood trec=trec_dir:validation --ood mnli=mnli_dir:validation_matched

Cells are cached: re-running resumes. A cell takes 15-40 minutes of one core at MiniLM scale (docs/study.md).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from hydra_hf.cli import run_script
from hydra_hf.errors import HydraInputError, HydraOutputError
from hydra_hf.outputs import MARKER, is_owned
from hydra_hf.recipes.study import (
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
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads, write_results_file

logger = logging.getLogger("study_text")


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: use I/N, e.g. 0/2") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number; give e.g. 3")
    return value


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


def _ood(text: str) -> tuple[str, str]:
    kind, sep, spec = text.partition("=")
    if not sep or not kind or not spec or not all(ch.isalnum() or ch in "-_" for ch in kind):
        raise argparse.ArgumentTypeError(f"{text!r}: use KIND=DATA, e.g. agnews=ag_news_folder:validation "
                                         "(KIND: letters, digits, - and _)")
    return kind, spec


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The study's data and model (default: the embedded demo's); data specs as `hydra-hf` takes them."""
    group = parser.add_argument_group("data and model (default: the embedded demo's)")
    group.add_argument(
        "--base-model",
        default=None,
        metavar="DIR",
        help="pretrained BERT-like checkpoint folder the Singles are fine-tuned from "
        "(default: the packaged all-MiniLM-L6-v2)",
    )
    group.add_argument(
        "--train-data", default=None, metavar="DATA", help="labelled training data (default rotten_tomatoes:train)"
    )
    group.add_argument(
        "--id-validation",
        default=None,
        metavar="DATA",
        help="labelled ID validation data: the first --finetune-eval examples are the fine-tuning "
        "evaluation set and the selection pool, the rest score the recipes (default rotten_tomatoes:validation)",
    )
    group.add_argument("--ood", action="append", type=_ood, default=[], metavar="KIND=DATA",
                       help="an OOD kind's *validation* data, repeatable (default: the four embedded kinds); "
                            "keep its test split out of the study")
    group.add_argument("--labels", nargs="+", default=None, metavar="NAME", help="class names (default rotten fresh)")
    group.add_argument("--max-length", type=int, default=None, metavar="N", help="tokens per text (default 48)")
    group.add_argument("--finetune-eval", type=int, default=None, metavar="N",
                       help="ID validation examples for fine-tuning evaluation and selection (default 400)")


def study_from_args(args: argparse.Namespace) -> TextStudy:
    """A TextStudy with the defaults, changed where the arguments say so."""
    changes = {"base_model": args.base_model, "train_data": args.train_data, "id_validation": args.id_validation,
               "ood_validation": dict(args.ood) if args.ood else None,
               "labels": tuple(args.labels) if args.labels else None, "max_length": args.max_length,
               "finetune_eval": args.finetune_eval}
    if args.ood and len(dict(args.ood)) != len(args.ood):
        raise ValueError(f"--ood names a kind twice: {[k for k, _ in args.ood]}")
    return TextStudy(**{k: v for k, v in changes.items() if v is not None})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output", default="outputs/study", help="study folder (default outputs/study); re-running resumes"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="pipeline seeds (default 0)")
    parser.add_argument(
        "--single",
        action="append",
        default=[],
        metavar="SEED=DIR",
        type=_single,
        help="reuse a fine-tuned Single checkpoint for a seed (e.g. 0=outputs/demo/single.work/member_0/model)",
    )
    parser.add_argument(
        "--shard", type=_shard, default=(0, 1), help="I/N: run every N-th cell starting at I (default 0/1)"
    )
    parser.add_argument("--candidates", nargs="+", type=_candidate, default=None, metavar="INDEX",
                        help="indices into the default grid to run (default: all); the table lists what is finished")
    parser.add_argument(
        "--screen",
        action="store_true",
        help="two-stage protocol: every candidate on the first seed, then the other seeds only for the "
        "candidates within TextStudy.replicate_margin of the best on the first seed (with --shard: "
        "run it again once every process has finished, to replicate what the others screened)",
    )
    parser.add_argument("--table-only", action="store_true", help="print the table of the finished cells and exit")
    parser.add_argument("--selection-noise", action="store_true",
                        help="measure instead how reproducible the circuit search's first step is on two disjoint "
                             "selection sets (the first seed's Single; writes OUTPUT/selection_noise.md)")
    parser.add_argument("--noise-sizes", type=_positive, nargs="+", default=[48, 96, 192], metavar="N",
                        help="selection-set sizes for --selection-noise (default 48 96 192)")
    parser.add_argument(
        "--noise-kinds",
        nargs="+",
        default=None,
        metavar="KIND",
        help="OOD kinds for --selection-noise (default: all); sizes a kind's pool cannot hold are skipped",
    )
    parser.add_argument("--noise-repeats", type=_positive, default=3, metavar="R",
                        help="random pairs of disjoint selection sets per size for --selection-noise (default 3)")
    parser.add_argument("--results", default=None, metavar="FILE",
                        help="with --selection-noise: also write the rows, the Single and the threads to FILE, the "
                             "results file docs/study.md's selection-noise table is rendered from "
                             "(docs/results/selection_noise.json; then `make docs`)")
    add_data_arguments(parser)
    add_threads_argument(parser)
    args = parser.parse_args()
    if args.results and not args.selection_noise:
        parser.error("--results writes the --selection-noise rows: add --selection-noise, or drop --results")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    threads = pin_threads(args.threads)  # first, before any torch work: the runs repeat on any machine of this kind
    print(describe_threads(threads))
    study = study_from_args(args)
    candidates = (
        DEFAULT_CANDIDATES if args.candidates is None else tuple(DEFAULT_CANDIDATES[i] for i in args.candidates)
    )
    singles = dict(args.single)
    out = Path(args.output)
    if args.selection_noise:
        from hydra_hf.pruning import load_pruning_target

        seed = args.seeds[0]
        if seed not in singles:
            parser.error(f"--selection-noise needs the Single of seed {seed}: give --single {seed}=DIR")
        target = load_pruning_target(singles[seed])
        data, folder = study_data(study, target.tokenizer), out / "selection_noise"
        kinds = args.noise_kinds or list(study.ood_validation)
        unknown = [kind for kind in kinds if kind not in data.ood_pool]
        if unknown:
            parser.error(f"--noise-kinds {' '.join(unknown)}: not an OOD kind of the study; use some of "
                         f"{' '.join(data.ood_pool)}")
        folder.mkdir(parents=True, exist_ok=True)
        rows = []
        for kind in kinds:
            for n in args.noise_sizes:  # one file per (kind, n, repeats): an interrupted run resumes
                file = folder / f"seed{seed}_{kind}_n{n}_r{args.noise_repeats}.json"
                if 2 * n > min(len(data.id_pool), len(data.ood_pool[kind])):
                    logger.info("selection noise: size %d skipped for %s (its pools hold fewer than 2 x %d texts)",
                                n, kind, n)
                    continue
                if not file.exists():
                    found = selection_noise(target, data, sizes=(n,), kind=kind, repeats=args.noise_repeats,
                                            seed=seed)
                    file.write_text(json.dumps(found, indent=2) + "\n")
                rows += json.loads(file.read_text())
        if not rows:
            parser.error(f"--noise-sizes {' '.join(map(str, args.noise_sizes))}: no size fits the pools of "
                         f"{' '.join(kinds)} (a size n needs 2 x n ID and 2 x n OOD texts); give smaller sizes")
        rows.sort(key=lambda r: (list(study.ood_validation).index(r["kind"]), r["n"], r["score"] != "ood"))
        table = render_selection_noise(rows)
        (out / "selection_noise.md").write_text(table)
        print(table)
        if args.results:
            results = {"seed": seed, "single": str(singles[seed]), "threads": threads, "rows": rows}
            write_results_file(results, args.results, __file__)
        return
    if args.table_only:
        if not (out / "study.json").is_file():
            raise HydraInputError(f"no study in {str(out)!r} (no study.json); give the folder a study ran in, "
                                  "or drop --table-only to run one")
        if not is_owned(out, "study"):  # decision.md / summary.json below would replace the user's files
            raise HydraOutputError(
                f"{str(out)!r} holds a study.json but was not created by the study (no {MARKER} "
                "marker), so its decision.md / summary.json are not ours to replace; give the folder "
                "that study_text.py --output created"
            )
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
    (out / "summary.json").write_text(
        json.dumps({"summary": summary, "choice": decide(summary, study), "threads": threads}, indent=2) + "\n"
    )
    print(table)


if __name__ == "__main__":
    run_script(main)  # bad input: one line, as the hydra-hf commands give it
