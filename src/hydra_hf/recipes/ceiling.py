"""The ceiling table: how much room a testbed leaves for *any* ensemble, before Hydra is judged on it.

Issue 23's first step on every testbed. For seeds ``S`` (at least 3) it trains (or reuses) the Single
of each seed -- the study's own Singles (:func:`hydra_hf.recipes.study.train_single`, the same folders) --
and scores, on the study's **validation** scoring sets (no test split), per OOD kind:

- every Single, as mean ± std over the seeds, under each of its OOD scores (MSP, entropy, energy);
- the real **Deep Ensemble** of those Singles (M = len(S) full models, different seeds), under the same
  scores and the ensemble-aware ones (mutual information), against the mean Single;
- optionally a **Hydra** recipe (a :class:`~hydra_hf.recipes.study.Candidate` that selects without OOD data,
  e.g. Taylor), built per seed from that seed's Single with its members fine-tuned with seeds offset
  from the Single's, scored the same way.

Where the Deep Ensemble does not beat the mean Single by a margin on kinds nobody selected on, no
ensemble -- Hydra included -- can show a gain there: the table says whether a testbed can settle the
question. A row ``best own score`` lets each model use its best score per kind (averaged over seeds),
so an ensemble-aware score is never compared with a handicapped Single. Numbers are cached per model
(``ceiling/*.json``), so an interrupted run resumes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..evaluation import EnsemblePredictor, ModelPredictor
from ..outputs import prepare_owned_folder, write_text_atomic
from ..pruning import load_pruning_target
from .study import SINGLE_SCORES, STUDY_SCORES, Candidate, TextStudy, model_numbers, run_cell, study_data, train_single

logger = logging.getLogger(__name__)


def _cached(path: Path, compute) -> dict[str, Any]:
    if path.is_file():
        return json.loads(path.read_text())
    numbers = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(numbers, indent=2) + "\n")
    return numbers


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def ceiling_numbers(
    s: TextStudy,
    output_dir: str | os.PathLike,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    hydra: Candidate | None = None,
) -> dict[str, Any]:
    """Train or reuse the Singles of ``seeds`` and score them, their Deep Ensemble and (optionally) the
    ``hydra`` recipe per seed; returns ``{"kinds", "seeds", "single": {seed: numbers}, "deep_ensemble":
    numbers, "hydra": {seed: numbers}}`` (numbers as :func:`hydra_hf.recipes.study.model_numbers`)."""
    if len(seeds) < 2:
        raise ValueError(f"the ceiling needs at least 2 seeds (3 or more to report a spread), got {list(seeds)}")
    if hydra is not None and hydra.uses_ood:
        raise ValueError(f"the ceiling scores every OOD kind, so its Hydra row must select without OOD data; "
                         f"{hydra.name!r} uses OOD data: compare it in the study (leave-one-kind-out) instead")
    # the study's folder
    out = prepare_owned_folder(Path(output_dir).resolve(), command="study", overwrite=False, keep=True)
    folder = out / "ceiling"
    singles = {seed: train_single(s, seed, out / f"single_seed{seed}") for seed in seeds}
    targets = {seed: load_pruning_target(path) for seed, path in singles.items()}
    data = study_data(s, targets[seeds[0]].tokenizer)
    result: dict[str, Any] = {"kinds": list(s.ood_validation), "seeds": list(seeds), "single": {}, "hydra": {}}
    for seed, target in targets.items():
        model = target.adapter.model.eval()
        result["single"][str(seed)] = _cached(
            folder / f"single_seed{seed}.json", lambda m=model: model_numbers(ModelPredictor(m), data)
        )
    models = [t.adapter.model.eval() for t in targets.values()]
    name = "deep_ensemble_seeds" + "-".join(map(str, seeds))
    result["deep_ensemble"] = _cached(folder / f"{name}.json", lambda: model_numbers(EnsemblePredictor(models), data))
    if hydra is not None:
        safe = "".join(ch if ch.isalnum() or ch in "-_=." else "_" for ch in hydra.name)
        for seed, target in targets.items():
            def cell(seed=seed, target=target) -> dict[str, Any]:
                return run_cell(
                    s, hydra, "any", seed, singles[seed], out, out / "work" / f"ceiling{os.getpid()}", data, target
                )

            numbers = _cached(folder / f"hydra_{safe}_seed{seed}.json", cell)
            result["hydra"][str(seed)] = numbers["fusions"].get("average") or next(iter(numbers["fusions"].values()))
        result["hydra_candidate"] = dataclasses.asdict(hydra)
    return result


def ceiling_table(numbers: Mapping[str, Any]) -> dict[str, Any]:
    """Rows of the ceiling table from :func:`ceiling_numbers`: per model and OOD score, the AUROC per
    kind (Singles and Hydra: mean ± std over seeds), accuracy and ECE, and the gain over the mean
    Single under MSP (``gain_msp``) and under the Single's best own score per kind (``gain_best``)."""
    kinds, seeds = numbers["kinds"], [str(s) for s in numbers["seeds"]]
    singles = [numbers["single"][s] for s in seeds]

    def per_seed_row(models: list[Mapping[str, Any]], score: str) -> dict[str, Any]:
        row: dict[str, Any] = {"auroc": {}, "auroc_std": {}}
        for k in kinds:
            row["auroc"][k], row["auroc_std"][k] = _mean_std([m["ood"][k][score] for m in models])
        row["accuracy"], row["accuracy_std"] = _mean_std([m["accuracy"] for m in models])
        row["ece"], row["ece_std"] = _mean_std([m["ece"] for m in models])
        return row

    single_msp = {k: _mean_std([m["ood"][k]["msp"] for m in singles])[0] for k in kinds}
    # each Single's best own score per kind (max over its scores), averaged over seeds
    single_best = {k: _mean_std([max(m["ood"][k][sc] for sc in SINGLE_SCORES) for m in singles])[0] for k in kinds}
    rows = []
    for score in SINGLE_SCORES:
        rows.append({"model": "Single", "score": score, "seeds": len(singles), **per_seed_row(singles, score)})
    groups = [("Deep Ensemble", [numbers["deep_ensemble"]])]
    if numbers.get("hydra"):
        groups.append(("Hydra", [numbers["hydra"][s] for s in seeds if s in numbers["hydra"]]))  # the seeds it ran on
    for model, members in groups:
        for score in STUDY_SCORES:
            if score not in members[0]["ood"][kinds[0]]:
                continue
            row = {"model": model, "score": score, "seeds": len(members), **per_seed_row(members, score)}
            row["gain_msp"] = {k: row["auroc"][k] - single_msp[k] for k in kinds}
            row["gain_best"] = {k: row["auroc"][k] - single_best[k] for k in kinds}
            row["mutual_information_id"] = _mean_std([m["mutual_information"] or 0.0 for m in members])[0]
            row["disagreement_ood"] = {k: _mean_std([m["ood"][k].get("disagreement_mean") or 0.0 for m in members])[0]
                                       for k in kinds}
            rows.append(row)
    return {
        "kinds": kinds,
        "seeds": numbers["seeds"],
        "single_msp": single_msp,
        "single_best": single_best,
        "rows": rows,
    }


def render_ceiling(table: Mapping[str, Any], *, title: str = "Ceiling table") -> str:
    """The ceiling table as Markdown: AUROC per OOD kind (± std over seeds), accuracy, ECE, and the gain
    of every ensemble row over the mean Single (MSP against MSP; and against the Single's best own score)."""
    kinds = table["kinds"]
    head = "| model | score | seeds | " + " | ".join(kinds) + " | accuracy | ECE |"
    lines = [f"## {title}", "", "AUROC per OOD kind (validation splits; mean ± std over the Singles' seeds).", "",
             head, "|" + "---|" * (5 + len(kinds))]
    for r in table["rows"]:
        cells = [
            f"{r['auroc'][k]:.4f} ± {r['auroc_std'][k]:.4f}" if r["seeds"] > 1 else f"{r['auroc'][k]:.4f}"
            for k in kinds
        ]
        lines.append(f"| {r['model']} | {r['score']} | {r['seeds']} | " + " | ".join(cells)
                     + f" | {r['accuracy']:.4f} | {r['ece']:.4f} |")
    lines += [
        "",
        "Gain over the mean Single (AUROC points × 100): MSP against the Singles' MSP / "
        "against each Single's best own score per kind.",
        "",
        "| model | score | " + " | ".join(kinds) + " | mean |",
        "|" + "---|" * (3 + len(kinds)),
    ]
    for r in table["rows"]:
        if "gain_msp" not in r:
            continue
        cells = [f"{100 * r['gain_msp'][k]:+.1f} / {100 * r['gain_best'][k]:+.1f}" for k in kinds]
        mean_msp = sum(r["gain_msp"].values()) / len(kinds)
        mean_best = sum(r["gain_best"].values()) / len(kinds)
        lines.append(
            f"| {r['model']} | {r['score']} | "
            + " | ".join(cells)
            + f" | {100 * mean_msp:+.1f} / {100 * mean_best:+.1f} |"
        )
    return "\n".join(lines) + "\n"
