"""Calibrated decisions on the demo's models: conformal sets and risk-controlled abstention, 3 seeds.

Reads the models ``examples/demo.py`` trained (``--demo``, default ``outputs/demo``; nothing there is
changed): Hydra (``hydra``), the Single (``single``, seed 0) and the Deep Ensemble's other members
(``deep_ensemble/member_1/model``, ``member_2/model``: the Singles of seeds 1 and 2). Their logits on the
demo's data (the Rotten Tomatoes test split, the first 400 validation reviews, the four OOD test sets of
800 texts each, and the calibration reviews; at most 48 tokens, as the demo) are cached in ``--cache``, so a
re-run only refits and a new part is the only one computed.

The sets and thresholds are fitted on the **calibration reviews**: the Rotten Tomatoes training rows after
the demo's first 6,000 (``max_train_samples``), which no model of the demo trains, selects or stops on
(4,201 reviews, drawn like the test split from the same shuffled corpus), and scored on the **whole test
split** (1,276 reviews). For every seed s of ``--seeds`` (default 0 1 2), for Hydra, the Single of seed s
(the Single trained with seed s), that Single with temperature scaling (T fitted by NLL on the validation
reviews, as the demo's "Single + TS") and the Deep Ensemble (the three Singles), the script fits

- split conformal sets at 90 % (alpha = 0.1): LAC, APS deterministic and APS randomised
  (``hydra_hf.calibration.fit_conformal``; the randomised U of an input is a hash of its probabilities and
  the seed, see docs/hub.md);
- a risk-controlled abstention on the MSP for each target of ``--risks`` (default 0.05, the issue's
  example, and 0.1, the `hydra-hf calibrate` default; the models err on about 20 % of the reviews): the
  loosest threshold whose error among answered inputs is certified at most the target with confidence
  1 - ``--delta`` (0.9) by Learn then Test;

and scores the other half: the empirical coverage and mean size of the sets, the share answered and the
error among answered inputs, the AURC (ranked by MSP), and per OOD kind the share refused and the share
given a set of more than one label. The demo trains one Hydra: its rows differ between seeds only in the
randomised APS's draws. Then the sets' coverage over ``--splits`` random re-splits of the calibration and
test reviews together into parts of the same sizes (its mean and spread: one split's coverage is a random
draw). It writes ``--results``
(docs/results/calibration.json; the tables of docs/hub.md are rendered from it by ``make docs``, view
``calibration``). Threads are pinned; the results file names the count the cached logits were computed with.

    python examples/calibration_study.py --demo outputs/demo --results docs/results/calibration.json --threads 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from hydra_hf import evaluation as ev
from hydra_hf.calibration.report import decision_metrics, fit_for_report
from hydra_hf.cli import run_script
from hydra_hf.data import resolve_dataset
from hydra_hf.errors import HydraInputError
from hydra_hf.modeling.pipeline_hydra import calibrated_decisions
from hydra_hf.outputs import write_text_atomic
from hydra_hf.recipes import TextPipeline
from hydra_hf.reproducibility import add_threads_argument, command_line, describe_threads, pin_threads

ALPHA = 0.1
METHODS = (("LAC", "lac", False), ("APS", "aps", False), ("APS randomised", "aps", True))
COVERAGE_BAND = (0.88, 0.92)  # the Must for the 90 % LAC and APS sets


def _folders(demo: Path) -> dict[str, Path]:
    folders = {"hydra": demo / "hydra", "single_0": demo / "single",
               "single_1": demo / "deep_ensemble" / "member_1" / "model",
               "single_2": demo / "deep_ensemble" / "member_2" / "model"}
    for name, folder in folders.items():
        if not (folder / "config.json").is_file():
            raise HydraInputError(f"{str(folder)!r} ({name}) is not a model folder; run `make demo` (examples/demo.py "
                                  "--output DIR) and pass --demo DIR")
    return folders


def _fingerprint(folders: dict[str, Path], pipeline: TextPipeline) -> str:
    """What every cached part depends on: every weight file's size and mtime, and the token limit."""
    digest = hashlib.sha256()
    for name, folder in sorted(folders.items()):
        for file in sorted(folder.glob("*.safetensors")):
            stat = file.stat()
            digest.update(f"{name}:{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest.update(json.dumps(pipeline.max_length).encode())
    return digest.hexdigest()


def data_parts(pipeline: TextPipeline) -> dict[str, tuple[str, bool, int, int | None]]:
    """Every part the study scores: ``(data spec, labelled, first row, row limit)``. The calibration reviews
    are the training rows after the demo's ``max_train_samples`` (the rows no model of the demo sees)."""
    start = pipeline.max_train_samples
    if start is None:
        raise HydraInputError("the demo trains on every training review (max_train_samples=None): no held-out "
                              "training rows are left to calibrate on; set TextPipeline.max_train_samples")
    return {"test": (pipeline.test_data, True, 0, pipeline.max_test_samples),
            "validation": (pipeline.validation_data, True, 0, pipeline.max_validation_samples),
            "calibration": (pipeline.train_data, True, start, None),
            **{f"ood/{kind}": (spec, False, 0, pipeline.max_ood_samples)
               for kind, spec in pipeline.ood_test_data.items()}}


def model_logits(demo: Path, cache: Path) -> dict[str, Any]:
    """Every model's member logits ``(N, M, C)`` on every part of :func:`data_parts`; a part cached for the
    same weights and the same data is reused, the others are computed (and the cache rewritten)."""
    pipeline = TextPipeline()  # the demo's data settings
    folders = _folders(demo)
    key = _fingerprint(folders, pipeline)
    parts = data_parts(pipeline)
    out: dict[str, Any] = {"key": key, "parts": {}, "part_threads": {}, "logits": {}, "labels": {}}
    if cache.is_file():
        cached = torch.load(cache, weights_only=True)
        if cached.get("key") == key:
            out = cached
            out.setdefault("parts", {})
            # a cache written before threads were kept per part: all its parts came from one call
            out.setdefault("part_threads", {part: out.get("threads") for part in out["parts"]})
    todo = {part: how for part, how in parts.items() if out["parts"].get(part) != list(how)}
    for part in set(out["parts"]) - set(parts):  # a part the study no longer scores
        del out["parts"][part]
        out["part_threads"].pop(part, None)
        out["labels"].pop(part, None)
        for logits in out["logits"].values():
            logits.pop(part, None)
    if not todo:
        print(f"logits from {cache}")
        return out
    _, tokenizer, _ = ev.load_classifier(folders["single_0"])

    def loader(spec: str, labelled: bool, first: int, limit: int | None):
        data = resolve_dataset(spec, require_labels=labelled, num_labels=2 if labelled else None,
                               label_column="label" if labelled else None)
        rows = range(first, len(data) if limit is None else min(len(data), first + limit))
        if not rows:
            raise HydraInputError(f"{spec!r} has {len(data)} rows: none left after row {first}")
        return ev.make_loader(data.select(rows), tokenizer, "text", batch_size=64, max_length=pipeline.max_length)

    loaders = {part: loader(*how) for part, how in todo.items()}
    out.setdefault("part_threads", {}).update({part: torch.get_num_threads() for part in todo})
    for name, folder in folders.items():
        predictor = ev.ModelPredictor(ev.load_classifier(folder)[0])
        out["logits"].setdefault(name, {})
        for part, part_loader in loaders.items():
            predictions = ev.predict(predictor, part_loader, desc=f"{name}: {part}")
            out["logits"][name][part] = predictions.member_logits  # (N, M, C)
            if predictions.labels is not None:
                out["labels"][part] = predictions.labels
    out["parts"].update({part: list(todo[part]) for part in todo})
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".tmp")
    torch.save(out, tmp)
    tmp.replace(cache)
    return out


def resplit(n_calibration: int, n_scored: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random re-split of the calibration and test reviews together (indices into their concatenation,
    calibration first): ``torch.randperm`` seeded, the first ``n_calibration`` calibrate, the rest are scored."""
    order = torch.randperm(n_calibration + n_scored, generator=torch.Generator().manual_seed(seed))
    return order[:n_calibration], order[n_calibration:]


def seed_models(cached: dict[str, Any], seed: int) -> dict[str, tuple[dict[str, torch.Tensor], float | None]]:
    """Per row of the table: its member logits on every part, and its temperature (None: its own probabilities)."""
    logits, labels = cached["logits"], cached["labels"]
    single = logits[f"single_{seed}"]
    temperature = ev.fit_temperature(ev.Predictions(single["validation"], labels["validation"]))
    ensemble = {part: torch.cat([logits[f"single_{s}"][part] for s in range(3)], dim=1) for part in single}
    return {"Hydra": (logits["hydra"], None), "Single": (single, None), "Single + TS": (single, temperature),
            "Deep Ensemble (M=3)": (ensemble, None)}


def study(cached: dict[str, Any], seeds: list[int], risks: list[float], delta: float) -> dict[str, Any]:
    """Per seed and model: the sets and abstentions fitted on the calibration reviews, scored on the test split."""
    labels, cal_labels = cached["labels"]["test"], cached["labels"]["calibration"]
    kinds = [part.split("/", 1)[1] for part in cached["logits"]["hydra"] if part.startswith("ood/")]
    sets, abstention = [], []
    for seed in seeds:
        for model, (logits, temperature) in seed_models(cached, seed).items():
            oods = {kind: logits[f"ood/{kind}"] for kind in kinds}
            for label, method, randomized in METHODS:
                settings = {"method": method, "score": "msp", "risk": risks[0], "delta": delta,
                            "randomized": randomized, "seed": seed}
                record = fit_for_report(logits["calibration"], cal_labels, ALPHA, settings, temperature=temperature)
                got = decision_metrics(record, logits["test"], labels, oods)
                sets.append(
                    {
                        "model": model,
                        "seed": seed,
                        "method": label,
                        "q_hat": record["q_hat"],
                        "n_calibration": record["n"],
                        "n_scored": int(labels.numel()),
                        "coverage": got["coverage"],
                        "set_size": got["set_size"],
                        "ood_set_gt1": {k: v["set_gt1"] for k, v in got["ood"].items()},
                    }
                )
            for risk in risks:  # the abstention does not depend on the sets: fitted once per risk
                settings = {"method": "lac", "score": "msp", "risk": risk, "delta": delta}
                record = fit_for_report(logits["calibration"], cal_labels, ALPHA, settings, temperature=temperature)
                got = decision_metrics(record, logits["test"], labels, oods)
                error = None if got["selective_accuracy"] is None else 1 - got["selective_accuracy"]
                abstention.append({"model": model, "seed": seed, "risk": risk, "temperature": temperature,
                                   "threshold": record["threshold"], "answered": got["answered"],
                                   "selective_error": error, "calibration_answered": record.get("answered_fraction"),
                                   "aurc": got["aurc"], "not_certified": record.get("selective_error"),
                                   "ood_refused": {k: v["refused"] for k, v in got["ood"].items()}})
    return {"sets": sets, "abstention": abstention, "ood_kinds": kinds, "must": must_lines(sets, abstention, risks)}


def coverage_over_splits(cached: dict[str, Any], splits: int) -> list[dict[str, Any]]:
    """The coverage of every model and method over ``splits`` random re-splits of the calibration and test
    reviews together into parts of their sizes (split seeds 0 .. splits - 1; the Single of seed 0): its mean, its
    spread and the share of splits inside the Must's band. One split's coverage varies by about
    sqrt(0.1 * 0.9 * (1 / n_calibration + 1 / n_scored)) (the calibration draw and the scored draw)."""
    both = torch.cat([cached["labels"]["calibration"], cached["labels"]["test"]])
    n_cal = cached["labels"]["calibration"].numel()
    models = seed_models(cached, 0)
    values: dict[tuple[str, str], list[float]] = {}
    for seed in range(splits):
        cal, scored = resplit(n_cal, both.numel() - n_cal, seed)
        for model, (logits, temperature) in models.items():
            pooled = torch.cat([logits["calibration"], logits["test"]])
            for label, method, randomized in METHODS:
                settings = {"method": method, "score": "msp", "risk": None, "delta": None, "randomized": randomized,
                            "seed": seed}
                record = fit_for_report(pooled[cal], both[cal], ALPHA, settings, temperature=temperature)
                sets = calibrated_decisions(pooled[scored], record)["prediction_set"]  # (n_scored, C)
                covered = sets[torch.arange(scored.numel()), both[scored]].double().mean()
                values.setdefault((model, label), []).append(float(covered))
    low, high = COVERAGE_BAND
    return [
        {
            "model": model,
            "method": label,
            "splits": splits,
            "mean": statistics.fmean(v),
            "std": statistics.stdev(v),
            "in_band": sum(low <= c <= high for c in v) / len(v),
        }
        for (model, label), v in values.items()
    ]


def must_lines(sets: list[dict[str, Any]], abstention: list[dict[str, Any]], risks: list[float]) -> list[str]:
    """The issue's Must, checked on every seed: each line says met or missed, and where."""
    low, high = COVERAGE_BAND
    lines = []
    for method in (m[0] for m in METHODS):
        rows = [r for r in sets if r["method"] == method]
        out = [f"{r['model']} seed {r['seed']}: {r['coverage']:.3f}" for r in rows if not low <= r["coverage"] <= high]
        span = f"{min(r['coverage'] for r in rows):.3f}-{max(r['coverage'] for r in rows):.3f}"
        lines.append(f"90 % {method} coverage in [{low}, {high}] on every seed and model: "
                     + ("met" if not out else f"missed on {len(out)} of {len(rows)}") + f" (range {span}"
                     + (f"; outside: {', '.join(out)})" if out else ")"))
    for risk in risks:
        rows = [r for r in abstention if r["risk"] == risk]
        over = [f"{r['model']} seed {r['seed']}: {r['selective_error']:.3f}" for r in rows
                if r["selective_error"] is not None and r["selective_error"] > risk]
        none = [f"{r['model']} seed {r['seed']}" for r in rows if r["threshold"] is None]
        worst = max((r["selective_error"] for r in rows if r["selective_error"] is not None), default=float("nan"))
        lines.append(f"error among answered inputs at or below the target {risk:g} on every seed and model: "
                     + ("met" if not over else f"missed on {len(over)} of {len(rows)}") + f" (largest {worst:.3f}"
                     + (f"; above: {', '.join(over)}" if over else "")
                     + (f"; no threshold certified, every input refused: {', '.join(none)}" if none else "") + ")")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--demo", default="outputs/demo", help="the demo's output folder (read only; default outputs/demo)"
    )
    parser.add_argument(
        "--cache",
        default="outputs/calibration_study/logits.pt",
        help="the models' logits, written once and reused (default outputs/calibration_study/logits.pt)",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2],
        help="seeds: the Single trained with it and the randomised APS's draws, each in 0, 1, 2 (default 0 1 2)"
    )
    parser.add_argument("--risks", type=float, nargs="+", default=[0.05, 0.1],
                        help="target errors among answered inputs, one abstention per target (default 0.05 0.1)")
    parser.add_argument("--splits", type=int, default=200,
                        help="also the coverage's mean over this many random re-splits (default 200; 0: none)")
    parser.add_argument("--delta", type=float, default=0.1, help="Learn then Test's 1 - confidence (default 0.1)")
    parser.add_argument("--results", default=None, help="write the results file (docs/results/calibration.json)")
    add_threads_argument(parser)
    args = parser.parse_args()
    if any(s not in (0, 1, 2) for s in args.seeds):
        raise HydraInputError(f"--seeds {args.seeds}: each seed is a Single of the demo (0, 1 or 2)")
    threads = pin_threads(args.threads)
    print(describe_threads(threads))
    cached = model_logits(Path(args.demo), Path(args.cache))
    out = study(cached, args.seeds, args.risks, args.delta)
    out["splits"] = coverage_over_splits(cached, args.splits) if args.splits > 1 else []
    for row in out["sets"]:
        print(f"seed {row['seed']} {row['model']:<20} {row['method']:<15} coverage {row['coverage']:.3f} "
              f"size {row['set_size']:.3f} q_hat {row['q_hat']:.4f}")
    for row in out["abstention"]:
        error = "–" if row["selective_error"] is None else f"{row['selective_error']:.3f}"
        print(f"seed {row['seed']} {row['model']:<20} risk {row['risk']:g} answered {row['answered'] or 0:.3f} "
              f"error {error} AURC {row['aurc']:.4f}")
    for row in out["splits"]:
        print(
            f"{row['splits']} splits {row['model']:<20} {row['method']:<15} coverage {row['mean']:.4f} ± "
            f"{row['std']:.4f}, in band {row['in_band']:.0%}"
        )
    print("\n".join(out["must"]))
    if args.results:
        labels = cached["labels"]
        results = {
            "command": command_line(__file__),
            "threads": threads,
            "logits_threads": cached["part_threads"],  # torch threads each part's logits were computed with
            "torch": torch.__version__,
            "alpha": ALPHA,
            "risks": args.risks,
            "delta": args.delta,
            "score": "msp",
            "seeds": args.seeds,
            "n_test": int(labels["test"].numel()),
            "n_validation": int(labels["validation"].numel()),
            "n_calibration": int(labels["calibration"].numel()),
            "split": f"calibration: the training reviews after the first {TextPipeline().max_train_samples} (no "
            "model of the demo sees them); scored: the whole test split",
            "resplit": "torch.randperm(n_calibration + n_test) seeded with the split seed over the calibration and "
            "test reviews together: the first n_calibration calibrate, the rest are scored",
            "randomization": "randomised APS: U per input = splitmix64 hash of the seed and its probabilities rounded "
            "to 4 decimals (hydra_hf.modeling.pipeline_hydra.conformal_noise)",
            "models": {
                "Hydra": "outputs/demo/hydra (3 Taylor members, seed 0; the same model on every seed)",
                "Single": "the Single trained with the split's seed (0: single, 1 and 2: deep_ensemble/member_s)",
                "Single + TS": "that Single, temperature fitted (NLL) on the first 400 validation reviews",
                "Deep Ensemble (M=3)": "the three Singles (seeds 0, 1, 2)",
            },
            **out,
        }
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.results, json.dumps(results, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
        print(f"results file: {args.results}  (make docs renders docs/hub.md's tables from it)")


if __name__ == "__main__":
    run_script(main)
