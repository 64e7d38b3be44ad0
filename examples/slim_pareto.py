"""The Pareto of uncertainty against cost on the image testbed: a results file, a figure and the decisions.

Reads what ``examples/ceiling_image.py`` wrote (``ceiling.json`` and each recipe's ``masks.json``) and writes
one results file (``--results``, e.g. ``docs/results/slim_image.json``; ``tools/render_docs.py`` renders its
table into docs/slim.md, view ``slim-pareto``) and a figure (``--figure``): for every model, the multiply-adds per
token relative to the Single (``hydra_hf.cost``, from the masks; the baselines of ``--baselines``, Packed-Ensembles and
MC Dropout, by the FLOP counter ceiling_image.py ran on one image), the parameters, and per seed the mean over the
OOD kinds of the MSP AUROC gain over the mean Single, accuracy, ECE and NLL (mean and standard deviation over the
seeds). Each pair the docs compare is decided by a paired t-test over the seeds (the same seed's Single, masks
and members on both sides); ``decided`` means p < 0.05.

    python examples/ceiling_image.py --output outputs/ceiling_slim --seeds 0 1 2 3 4 \
        --hydra taylor slim slim_half --baselines packed mc_dropout --threads 1
    python examples/slim_pareto.py --ceiling outputs/ceiling_slim --results docs/results/slim_image.json \
        --figure docs/slim_pareto.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from hydra_hf.cost import relative_cost
from hydra_hf.masks import HeadMasks
from hydra_hf.metrics import paired_t_over_seeds
from hydra_hf.modeling.configuration_hydra_vit import HydraEnsembleViTConfig
from hydra_hf.outputs import write_text_atomic

# the pairs the docs compare: (a, b): is a's mean OOD gain different from b's, seed by seed?
PAIRS = (("slim per_member", "taylor per_member"), ("slim average", "taylor average"),
         ("slim_half per_member", "taylor per_member"), ("slim per_member", "Single"),
         ("slim per_member", "Packed-Ensembles"), ("slim average", "Packed-Ensembles"),
         ("taylor per_member", "Packed-Ensembles"), ("Packed-Ensembles", "Single"), ("MC Dropout", "Single"),
         ("taylor per_member", "Single"), ("taylor_far per_member", "taylor per_member"),
         ("taylor_sp per_member", "taylor per_member"), ("taylor_far per_member", "Single"),
         ("taylor_sp per_member", "Single"))
LABELS = {"taylor": "Hydra (Taylor)", "slim": "slim Hydra (33 % MLP)", "slim_half": "slim Hydra (50 % MLP)",
          "taylor_far": "Hydra (Taylor, members trained further apart)",
          "taylor_sp": "Hydra (Taylor, members shrunk and perturbed)"}
# ceiling_image.py --baselines: the key in ceiling.json, the row's name
BASELINES = {"packed": "Packed-Ensembles", "mc_dropout": "MC Dropout"}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _compute(ceiling: Path, recipe: str, seeds: list[str]) -> dict[str, float]:
    """Multiply-adds and parameters of a recipe's fused model relative to the Single, from its masks (seed 0's:
    every seed keeps the same numbers of heads and neurons)."""
    single = json.loads(
        (ceiling / f"single_seed{seeds[0]}" / "work" / "member_0" / "model" / "config.json").read_text()
    )
    masks = HeadMasks.load(ceiling / f"hydra_{recipe}_seed{seeds[0]}_any" / "masks.json")
    base = {k: v for k, v in single.items() if k not in ("architectures", "id2label", "label2id")}
    config = HydraEnsembleViTConfig(base_config=base, kept_heads=masks.kept_heads,
                                    kept_neurons=masks.kept_neurons() or None, num_labels=len(single["id2label"]))
    tokens = (single["image_size"] // single["patch_size"]) ** 2 + 1
    return relative_cost(config, tokens)


def pareto(ceiling: Path) -> dict[str, Any]:
    numbers = json.loads((ceiling / "ceiling.json").read_text())
    kinds, seeds = numbers["kinds"], [str(s) for s in numbers["seeds"]]
    singles = {s: numbers["single"][s] for s in seeds}
    mean_single = {k: statistics.fmean(m["ood"][k]["msp"] for m in singles.values()) for k in kinds}

    def seed_values(model: dict[str, Any]) -> dict[str, Any]:
        gains = {k: 100 * (model["ood"][k]["msp"] - mean_single[k]) for k in kinds}
        return {"gain": statistics.fmean(gains.values()), "gain_per_kind": gains, "accuracy": 100 * model["accuracy"],
                "ece": model["ece"], "nll": model["nll"]}

    models: dict[str, dict[str, Any]] = {"Single": {"compute_x": 1.0, "params_x": 1.0,
                                                    "per_seed": {s: seed_values(m) for s, m in singles.items()}}}
    models[f"Deep Ensemble ({len(seeds)})"] = {"compute_x": float(len(seeds)), "params_x": float(len(seeds)),
                                               "per_seed": {"all": seed_values(numbers["deep_ensemble"])}}
    for key, per_seed in numbers.items():
        if not key.startswith("hydra_"):
            continue
        recipe, fusion = (
            key[len("hydra_") :].rsplit("_", 1)
            if not key.endswith("per_member")
            else (key[len("hydra_") : -len("_per_member")], "per_member")
        )
        cost = _compute(ceiling, recipe, seeds)
        models[f"{recipe} {fusion}"] = {
            "label": f"{LABELS.get(recipe, recipe)}, {fusion.replace('_', '-')} MLP", "compute_x": cost["macs_ratio"],
            "params_x": cost["params_ratio"], "per_seed": {s: seed_values(m) for s, m in per_seed.items()},
            # PyTorch's FLOP counter on the fused model (the whole forward pass), where the ceiling recorded it
            "counted_x": numbers.get("compute", {}).get(key, {}).get("counted_x"),
        }
    for key, name in BASELINES.items():
        if key not in numbers:
            continue
        cost = numbers.get("compute", {}).get(key)
        if cost is None:
            raise ValueError(f"{str(ceiling / 'ceiling.json')!r} has {key} numbers but no 'compute' record of them; "
                             "re-run examples/ceiling_image.py with --baselines to count them")
        detail = (f"M = {cost['num_estimators']}, alpha {cost['alpha']}, gamma {cost['gamma']}" if key == "packed"
                  else f"T = {cost['samples']}")
        models[name] = {"label": f"{name} ({detail})", "compute_x": cost["counted_x"], "params_x": cost["params_x"],
                        "per_seed": {s: seed_values(m) for s, m in numbers[key].items()}}
    rows = []
    for name, model in models.items():
        values = list(model["per_seed"].values())
        row = {"model": name, "label": model.get("label", name), "compute_x": model["compute_x"],
               "params_x": model["params_x"], "seeds": len(values)}
        if model.get("counted_x") is not None:
            row["counted_x"] = model["counted_x"]
        for metric in ("gain", "accuracy", "ece", "nll"):
            row[metric], row[f"{metric}_std"] = _mean_std([v[metric] for v in values])
        row["gain_per_kind"] = {k: statistics.fmean(v["gain_per_kind"][k] for v in values) for k in kinds}
        rows.append(row)
    decisions = []
    for a, b in PAIRS:
        if a not in models or b not in models:
            continue
        common = [s for s in models[a]["per_seed"] if s in models[b]["per_seed"]]
        diff = [models[a]["per_seed"][s]["gain"] - models[b]["per_seed"][s]["gain"] for s in common]
        test = paired_t_over_seeds(diff)
        decisions.append({"a": a, "b": b, "seeds": len(common), "difference": statistics.fmean(diff),
                          "difference_std": _mean_std(diff)[1], "p": test["p"], "decided": test["decided"]})
    return {"command": "python examples/slim_pareto.py --ceiling " + str(ceiling), "kinds": kinds, "seeds": seeds,
            "score": "msp", "rows": rows, "decisions": decisions, "must": _must(rows)}


def _must(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's bar: a slim model at <= 1.3x compute keeps >= 75 % of Hydra (Taylor, per-member MLP)'s mean OOD
    gain, accuracy within 0.5 points of the Single, ECE no worse than the Single's."""
    by = {r["model"]: r for r in rows}
    taylor, single = by.get("taylor per_member"), by["Single"]
    lines = []
    for r in rows:
        if not r["model"].startswith("slim") or taylor is None:
            continue
        checks = {
            "compute <= 1.3x": r["compute_x"] <= 1.3,
            ">= 75 % of Hydra (Taylor)'s gain": r["gain"] >= 0.75 * taylor["gain"],
            "accuracy within 0.5 points": r["accuracy"] >= single["accuracy"] - 0.5,
            "ECE <= the Single's": r["ece"] <= single["ece"],
        }
        verdict = (
            "met" if all(checks.values()) else "not met (" + ", ".join(k for k, ok in checks.items() if not ok) + ")"
        )
        lines.append(f"{r['label']}: {verdict}")
    return lines


def figure(results: dict[str, Any], path: Path) -> None:
    import matplotlib  # the plotting extra: imported here, only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.0, 4.2))
    markers = {"Single": "s", "Packed-Ensembles": "^", "MC Dropout": "v"}
    for row in results["rows"]:
        marker = markers.get(row["model"], "D" if row["model"].startswith("Deep") else "o")
        ax.errorbar(row["compute_x"], row["gain"], yerr=row["gain_std"], fmt=marker, capsize=3, label=row["label"])
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("log")  # 1x (Single, Packed-Ensembles) to 10x (MC Dropout)
    ax.set_xticks([1, 2, 5, 10], labels=["1", "2", "5", "10"])
    ax.set_xlabel("multiply-adds per image (x Single)")
    ax.set_ylabel("mean MSP AUROC gain over the mean Single (points)")
    ax.set_title(f"Image testbed, {len(results['seeds'])} seeds (± std over seeds)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: no point hidden
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ceiling", required=True, type=Path, help="the folder ceiling_image.py wrote")
    parser.add_argument("--results", required=True, type=Path, help="the results file to write (JSON)")
    parser.add_argument("--figure", type=Path, help="the Pareto figure (PNG)")
    args = parser.parse_args()
    results = pareto(args.ceiling)
    write_text_atomic(args.results, json.dumps(results, indent=1) + "\n")
    if args.figure:
        figure(results, args.figure)
    for line in results["must"]:
        print(line)
    for d in results["decisions"]:
        print(
            f"{d['a']} - {d['b']}: {d['difference']:+.2f} ± {d['difference_std']:.2f} points over {d['seeds']} seeds, "
            f"p = {d['p']:.3f} ({'decided' if d['decided'] else 'not decided'})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
