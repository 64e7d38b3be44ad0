"""Slim members on the embedded text testbed: cost against uncertainty, per OOD kind, seed by seed.

The text ceiling (``examples/ceiling_text.py``: all-MiniLM-L6-v2 fine-tuned on Rotten Tomatoes, four OOD kinds
scored on validation splits) for several Hydra recipes on the same seeds' Singles: for every model the
multiply-adds per token relative to the Single (``hydra_hf.cost``, from the masks, at the testbed's length), the
MSP AUROC per OOD kind minus the mean Single's (points), accuracy and ECE, mean ± standard deviation over the
seeds. Each slim recipe is compared kind by kind with the reference Hydra (``--reference``) seed by seed (paired
t-test over the seeds; "decided" at p < 0.05), against the slim issue's bar: no OOD kind more than 1 point below
the reference. Writes a results file (``--results``; ``tools/render_docs.py`` renders it into docs/slim.md, view
``slim-text``).

    python examples/slim_text.py --output outputs/study --seeds 0 1 2 \
        --hydra taylor-k6 slim-k4 slim-k6-m33 slim-k6-m50 --reference taylor-k6 --results docs/results/slim_text.json

Every model's numbers are cached under OUTPUT/ceiling, so a re-run only adds what is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import statistics
from pathlib import Path
from typing import Any

from hydra_hf.cli import run_script
from hydra_hf.cost import relative_cost
from hydra_hf.masks import HeadMasks
from hydra_hf.metrics import paired_t_over_seeds
from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig
from hydra_hf.recipes.ceiling import ceiling_numbers
from hydra_hf.recipes.study import ANY_FOLD, Candidate, TextStudy
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads, write_results_file

_spec = importlib.util.spec_from_file_location("ceiling_text", Path(__file__).with_name("ceiling_text.py"))
ceiling_text = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ceiling_text)
HYDRA: dict[str, Candidate] = ceiling_text.HYDRA
BAR_POINTS = 1.0  # the bar: no OOD kind more than this many points below the reference Hydra


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def compute_of(out: Path, candidate: Candidate, seed: int, tokens: int) -> dict[str, float]:
    """Multiply-adds and parameters of a recipe's fused model relative to the Single, from its masks."""
    single = json.loads((out / f"single_seed{seed}" / "work" / "member_0" / "model" / "config.json").read_text())
    base = single.get("base_config", single)  # a Single is saved stock or as a one-member Hydra
    base = {k: v for k, v in base.items() if k not in ("architectures", "id2label", "label2id")}
    masks = HeadMasks.load(out / "masks" / f"seed{seed}" / f"{candidate.selection_key(ANY_FOLD)}.json")
    config = HydraEnsembleConfig(
        base_config=base, kept_heads=masks.kept_heads, kept_neurons=masks.kept_neurons() or None, num_labels=2
    )
    return relative_cost(config, tokens)


def slim_text(out: Path, seeds: list[int], recipes: list[str], reference: str) -> dict[str, Any]:
    s = TextStudy()
    per_recipe = {r: ceiling_numbers(s, out, seeds, hydra=HYDRA[r]) for r in recipes}
    first = per_recipe[recipes[0]]
    kinds, keys = first["kinds"], [str(seed) for seed in seeds]
    mean_single = {k: statistics.fmean(first["single"][seed]["ood"][k]["msp"] for seed in keys) for k in kinds}

    def values(model: dict[str, Any]) -> dict[str, Any]:
        gains = {k: 100 * (model["ood"][k]["msp"] - mean_single[k]) for k in kinds}
        return {"gain": statistics.fmean(gains.values()), "gain_per_kind": gains, "accuracy": 100 * model["accuracy"],
                "ece": model["ece"]}

    models: dict[str, dict[str, Any]] = {
        "Single": {"label": "Single", "compute_x": 1.0, "params_x": 1.0,
                   "per_seed": {seed: values(first["single"][seed]) for seed in keys}},
        "Deep Ensemble": {"label": f"Deep Ensemble ({len(keys)})", "compute_x": float(len(keys)),
                          "params_x": float(len(keys)), "per_seed": {"all": values(first["deep_ensemble"])}},
    }
    for recipe, numbers in per_recipe.items():
        cost = compute_of(out, HYDRA[recipe], seeds[0], s.max_length)
        models[recipe] = {
            "label": HYDRA[recipe].name,
            "compute_x": cost["macs_ratio"],
            "params_x": cost["params_ratio"],
            "member_steps": HYDRA[recipe].member_steps,
            "per_seed": {seed: values(numbers["hydra"][seed]) for seed in keys},
        }
    rows = []
    for name, model in models.items():
        per_seed = list(model["per_seed"].values())
        row = {"model": name, "label": model["label"], "compute_x": model["compute_x"], "params_x": model["params_x"],
               "seeds": len(per_seed)}
        if "member_steps" in model:
            row["member_steps"] = model["member_steps"]
        for metric in ("gain", "accuracy", "ece"):
            row[metric], row[f"{metric}_std"] = _mean_std([v[metric] for v in per_seed])
        row["gain_per_kind"] = {k: _mean_std([v["gain_per_kind"][k] for v in per_seed]) for k in kinds}
        rows.append(row)
    decisions = []
    for recipe in recipes:
        if recipe == reference or HYDRA[recipe].mlp_keep is None:
            continue
        for kind in kinds:
            a = [models[recipe]["per_seed"][seed]["gain_per_kind"][kind] for seed in keys]
            b = [models[reference]["per_seed"][seed]["gain_per_kind"][kind] for seed in keys]
            diff = [x - y for x, y in zip(a, b)]
            test = paired_t_over_seeds(diff)
            decisions.append({"a": recipe, "b": reference, "kind": kind, "seeds": len(keys),
                              "difference": statistics.fmean(diff), "difference_std": _mean_std(diff)[1],
                              "p": test["p"], "decided": test["decided"],
                              "within_bar": statistics.fmean(diff) >= -BAR_POINTS})
    return {"command": f"python examples/slim_text.py --output {out} --seeds {' '.join(keys)} --hydra "
                       f"{' '.join(recipes)} --reference {reference}",
            "kinds": kinds, "seeds": keys, "score": "msp", "tokens": s.max_length, "bar_points": BAR_POINTS,
            "rows": rows, "decisions": decisions}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="outputs/study", help="the study folder (Singles are shared)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--hydra", nargs="+", choices=sorted(HYDRA),
                        default=["taylor-k6", "slim-k4", "slim-k6-m33", "slim-k6-m50"])
    parser.add_argument("--reference", choices=sorted(HYDRA), default="taylor-k6",
                        help="the Hydra recipe every slim recipe is held against, kind by kind")
    parser.add_argument(
        "--results", default=None, help="write the results file here (e.g. docs/results/slim_text.json)"
    )
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    if args.reference not in args.hydra:
        parser.error(f"--reference {args.reference} must be one of the --hydra recipes {args.hydra}")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    threads = pin_threads(args.threads)  # first, before any torch work: the runs repeat on any machine of this kind
    print(describe_threads(threads))
    results = {"threads": threads, **slim_text(Path(args.output), args.seeds, args.hydra, args.reference)}
    text = write_results_file(results, args.results, __file__, argv)
    print(text)
    return 0


if __name__ == "__main__":
    run_script(main)
