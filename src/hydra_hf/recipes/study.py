"""The selection protocol: which Hydra recipe transfers to OOD data nobody selected on.

A *recipe* is every choice that builds a Hydra Ensemble from a fine-tuned single model: the
pruning method, the heads removed per member, the greedy step, the size of the selection set, how
long (and from where) the members are fine-tuned, the MLP fusion and the OOD score. The protocol
compares recipes on **validation splits only**, leave-one-OOD-kind-out:

- for every OOD kind ``k`` (a *fold*), the members are selected with ``k``'s validation split as
  the OOD data (methods that use no OOD data select once for all folds);
- the ensemble is then scored on the ID validation examples the selection never saw and on the
  validation splits of every *other* OOD kind; the recipe's transfer gain on a fold is the mean,
  over those other kinds, of its OOD AUROC minus the Single model's AUROC under the same score
  (:func:`single_reference`). A candidate with ``ood_selection="pooled"`` selects on the other kinds
  pooled and is scored on the fold's kind.

MSP is the headline score (the paper's): :func:`decide` chooses among MSP rows only
(``TextStudy.headline_score``); the other scores are extra rows, so a choice is never the best of
many scores' rows.

No test split is read. :func:`decide` applies the decision rule (accuracy within
``max_accuracy_drop`` of Single, ECE no worse than Single's plus ``ece_tolerance``, run on as many
seeds as the best-replicated candidate, then the largest mean transfer gain) and
:func:`render_decision_table` prints the whole table, losers included. ``run_study(screen=True)``
runs every candidate on the first seed and replicates only those close to the best
(:func:`candidates_to_replicate`).

Results are cached per cell (``cells/seed{S}/{candidate}/{fold}.json``), so an interrupted study
resumes, and several processes can share the cells (``shard``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from scipy.stats import spearmanr
from tqdm.auto import tqdm

from .. import metrics
from ..assemble import convert_checkpoint
from ..data import make_text_loader, resolve_dataset
from ..errors import HydraInputError
from ..evaluation import ModelPredictor, make_loader, predict
from ..evaluation.plots import transfer_gains
from ..finetune import finetune_members, text_recipe
from ..finetune.baselines import all_heads_masks
from ..lazy import lazy_module
from ..masks import HeadMasks
from ..outputs import prepare_owned_folder, remove_dead_process_folders, write_text_atomic
from ..pruning import build_members, load_pruning_target
from ..pruning.budget import Budget
from ..pruning.circuits import make_evaluator
from ..pruning.diversity import parse_methods, uses_ood
from ..pruning.layout import HeadLayout
from ..pruning.neurons import check_mlp_keep
from .text import packaged_minilm

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")

logger = logging.getLogger(__name__)

# the names of the registered OOD scores (hydra_hf.metrics.OOD_SCORES), each a row of the decision table
STUDY_SCORES = metrics.OOD_SCORE_NAMES
ANY_FOLD = "any"  # the fold name of a selection that uses no OOD data


@dataclass(frozen=True)
class Candidate:
    """One way of building the members (the protocol evaluates each under every fusion and OOD score).

    ``member_steps=0`` fuses the pruned single model without fine-tuning the members (their MLPs are
    then the same, so both fusions are equal). ``start="pretrained"`` fine-tunes each pruned member
    from the pretrained encoder (a new classifier) for ``member_steps`` at the single model's
    learning rate, instead of from the fine-tuned single model.
    """

    name: str
    method: str = "circuit-avg"  # or several, comma-separated: one per member (Hydra (Circ))
    remove: int | None = 36  # heads removed anywhere; None with heads_per_layer
    heads_per_step: int = 6
    samples: int = 96
    member_steps: int = 120
    start: str = "single"
    members: int = 3
    # issue 23: the paper's budget, selection set and members
    heads_per_layer: int | None = None  # keep K heads in every layer (set remove=None)
    selection: str = "validation"  # "validation": the ID validation pool; "heldout": training rows no model trains on
    ood_selection: str = "fold"  # "fold": select on the fold's kind; "pooled": on every other kind, score the fold's
    data_fraction: float | None = None  # of the selection data per member (None: the study's prune_data_fraction)
    member_seed_offset: int = 0  # members fine-tune with seed + offset (0: member 0 replays the Single's seed)
    temperature: float | None = None  # Taylor: sampling temperature of the kept heads (None: 1.0; 0: the top K)
    # slim members (an extension, docs/slim.md): each member keeps this fraction of every layer's MLP neurons too
    mlp_keep: float | None = None
    mlp_spread: bool = False  # slim: each member prefers the neurons earlier members left

    def __post_init__(self) -> None:
        try:
            parse_methods(self.method)
            Budget.of(self)
        except ValueError as exc:
            raise ValueError(f"candidate {self.name!r}: {exc}") from None
        if self.start not in ("single", "pretrained"):
            raise ValueError(f"candidate {self.name!r}: start {self.start!r} must be 'single' or 'pretrained'")
        if self.start == "pretrained" and self.member_steps == 0:
            raise ValueError(f"candidate {self.name!r}: start='pretrained' needs member_steps > 0")
        if self.selection not in ("validation", "heldout"):
            raise ValueError(
                f"candidate {self.name!r}: selection {self.selection!r} must be 'validation' or 'heldout'"
            )
        if self.ood_selection not in ("fold", "pooled"):
            raise ValueError(
                f"candidate {self.name!r}: ood_selection {self.ood_selection!r} must be 'fold' or 'pooled'"
            )
        if self.mlp_keep is not None:
            try:
                check_mlp_keep(self.mlp_keep)
            except ValueError as exc:
                raise ValueError(f"candidate {self.name!r}: {exc}") from None
        if self.data_fraction is not None and not 0.0 < self.data_fraction <= 1.0:
            raise ValueError(f"candidate {self.name!r}: data_fraction must be in (0, 1], got {self.data_fraction}")
        for key in ("heads_per_step", "samples", "members"):
            if getattr(self, key) < 1:
                raise ValueError(f"candidate {self.name!r}: {key} must be >= 1, got {getattr(self, key)}")

    @property
    def uses_ood(self) -> bool:
        return uses_ood(self.method)

    @property
    def pooled(self) -> bool:
        """Selects on the pooled OOD kinds other than the fold's, and transfers to the fold's kind."""
        return self.uses_ood and self.ood_selection == "pooled"

    def budget(self) -> Budget:
        return Budget.of(self)

    def selection_key(self, fold: str) -> str:
        """Candidates with the same key share their masks (e.g. the same selection, fine-tuned or not).
        The keys of the candidates that predate the per-layer budget are unchanged (their cells resume)."""
        fold = fold if self.uses_ood else ANY_FOLD
        budget = f"r{self.remove}" if self.heads_per_layer is None else f"K{self.heads_per_layer}"
        extra = "".join([
            "-heldout" if self.selection == "heldout" else "",
            "-pooled" if self.pooled else "",
            f"-f{self.data_fraction:g}" if self.data_fraction is not None else "",
            f"-T{self.temperature:g}" if self.temperature is not None else "",
            f"-mlp{self.mlp_keep:g}{'s' if self.mlp_spread else ''}" if self.mlp_keep is not None else "",
        ])
        return f"{self.method}-{budget}-k{self.heads_per_step}-n{self.samples}-m{self.members}{extra}-{fold}"


# Taylor with the paper's per-layer budget on the held-out selection set (the grid's candidate 10)
_TAYLOR_PER_LAYER = Candidate("Taylor, keep 6 per layer, held-out n=1000", method="taylor", remove=None,
                              heads_per_layer=6, samples=1000, selection="heldout", member_seed_offset=1000)

# The default grid: the demo's recipe (R0) and one change at a time, plus a random-heads control.
DEFAULT_CANDIDATES: tuple[Candidate, ...] = (
    Candidate("R0 demo: circ-avg, 36 removed, k=6, n=96, ft 120"),
    Candidate("R0 without member fine-tuning", member_steps=0),
    Candidate("circ-ood", method="circuit-ood"),
    Candidate("taylor", method="taylor"),
    Candidate("random heads (control)", method="random"),
    Candidate("selection set n=384", samples=384),
    Candidate("12 removed, exact greedy, no ft", remove=12, heads_per_step=1, member_steps=0),
    Candidate("12 removed, exact greedy, ft 120", remove=12, heads_per_step=1),
    Candidate("members from pretrained, ft 180", start="pretrained", member_steps=180),
    # issue 23: the paper's recipe -- its per-layer budget (keep 6 of 12 heads in every layer), Hydra (Circ)
    # with one criterion per member on 1,000 held-out training reviews and the other OOD kinds pooled (the
    # fold's kind stays unseen), members fine-tuned with seeds offset from the Single's; and Taylor, per
    # layer with prune-recompute, on the same held-out set
    Candidate(
        "Hydra (Circ), keep 6 per layer, held-out n=1000, pooled OOD",
        method="circuit-acc,circuit-ood,circuit-avg",
        remove=None,
        heads_per_layer=6,
        samples=1000,
        selection="heldout",
        ood_selection="pooled",
        data_fraction=1.0,
        member_seed_offset=1000,
    ),
    _TAYLOR_PER_LAYER,
    # slim members (an extension, docs/slim.md): that Taylor recipe whose members also keep a share of every
    # layer's MLP neurons, spread over the members: about one Single's compute, and 1.5x
    dataclasses.replace(_TAYLOR_PER_LAYER, name="slim: Taylor, keep 4 per layer, 33 % of the MLP, held-out n=1000",
                        heads_per_layer=4, mlp_keep=0.33, mlp_spread=True),
    dataclasses.replace(_TAYLOR_PER_LAYER, name="slim: Taylor, keep 6 per layer, 50 % of the MLP, held-out n=1000",
                        mlp_keep=0.5, mlp_spread=True),
    # each member keeps its own top third of every MLP and fine-tunes 480 steps: the slim recipe that comes
    # within 1 point of the per-layer Taylor recipe on every OOD kind of the text ceiling at 1.17x (docs/slim.md)
    dataclasses.replace(_TAYLOR_PER_LAYER, name="slim: Taylor, keep 6 per layer, top 33 % of the MLP, held-out "
                        "n=1000, ft 480", mlp_keep=0.33, member_steps=480),
)


@dataclass
class TextStudy:
    """The data and training settings of the text study (defaults: the embedded demo's)."""

    base_model: str | None = None  # None: the packaged all-MiniLM-L6-v2
    labels: tuple[str, ...] = ("rotten", "fresh")
    train_data: str = "rotten_tomatoes:train"
    id_validation: str = "rotten_tomatoes:validation"
    ood_validation: dict[str, str] = field(default_factory=lambda: {
        "guardian": "guardian_headlines:ood_validation",
        "debates": "presidential_debates:ood_validation",
        "hamlet": "hamlet:ood_validation",
        "speeches": "convention_speeches:ood_validation",
    })
    # the ID validation split: [0, finetune_eval) is the fine-tuning runs' evaluation set and the
    # selection set's pool; [finetune_eval, ...) scores the recipes (never seen by a selection)
    finetune_eval: int = 400
    max_score_samples: int = 800  # per scoring set
    # the selection set of candidates with selection="heldout": this split's rows from max_train_samples on,
    # which no model of the study trains on (the paper selects on 3,000 held-out training rows)
    heldout_data: str = "rotten_tomatoes:train"
    max_length: int = 48
    batch_size: int = 32
    learning_rate: float = 1e-4
    member_learning_rate: float = 5e-5
    single_steps: int = 180
    max_train_samples: int = 6000
    prune_data_fraction: float = 0.75
    mlp_fusions: tuple[str, ...] = ("average", "per_member")
    # decision rule
    max_accuracy_drop: float = 0.015
    ece_tolerance: float = 0.005
    min_seeds: int | None = None  # seeds a row needs to be chosen (None: as many as the best-replicated row)
    # two-stage protocol: candidates within this much transfer gain of the best on the screening seed
    # are replicated on the other seeds (about the seed-to-seed std of a gain measured here, 0.009-0.012)
    replicate_margin: float = 0.01
    # the score a choice is made on: MSP, the paper's (issue 23). Other scores are extra rows, each against the
    # Single under the same score (or its best own score, for scores one model lacks); None: any row may be
    # chosen -- then the choice is the best of many rows, and must be confirmed on held-out kinds
    headline_score: str | None = "msp"

    def __post_init__(self) -> None:
        # the protocol decides on validation data only: a test split named here would leak into the choice
        for name, spec in [("id_validation", self.id_validation), *self.ood_validation.items()]:
            if _names_test_split(spec):
                raise ValueError(f"{name}={spec!r} names a test split; the selection protocol reads validation "
                                 "splits only (keep test splits for the final evaluation)")


def _names_test_split(spec: str) -> bool:
    split = spec.rsplit(":", 1)[1] if ":" in spec else Path(spec).stem
    return re.search(r"(^|[^a-z])test([^a-z]|$)", split.lower()) is not None


def _finetune_config(s: TextStudy, steps: int, learning_rate: float, seed: int):
    # max_steps bounds the run: an epoch has at least one step, so ``steps`` epochs never end it earlier (runs of
    # more steps than one pass over the training rows take further epochs, and the best epoch on validation)
    return text_recipe(
        learning_rate=learning_rate, max_steps=steps, num_epochs=max(1, steps), max_length=s.max_length,
        batch_size=s.batch_size, eval_batch_size=128, max_train_samples=s.max_train_samples,
        max_eval_samples=s.finetune_eval, seed=seed,
        log_every_steps=40,
    )


def _base_dir(s: TextStudy) -> Path:
    return Path(s.base_model) if s.base_model else packaged_minilm()


def train_single(s: TextStudy, seed: int, out: Path) -> Path:
    """The Single model of ``seed`` (all heads, the recipe's fine-tuning); returns its checkpoint."""
    ckpt = out / "work" / "member_0" / "model"
    if ckpt.exists():
        return ckpt
    base = _base_dir(s)
    finetune_members(base, all_heads_masks(base), s.train_data, s.id_validation, out / "fused",
                     _finetune_config(s, s.single_steps, s.learning_rate, seed), work_dir=out / "work",
                     overwrite=True, id2label=dict(enumerate(s.labels)))
    shutil.rmtree(out / "fused", ignore_errors=True)
    return ckpt


class _Data:
    """The study's data sets, read once: the selection pools and the scoring loaders."""

    def __init__(self, s: TextStudy, tokenizer: Any) -> None:
        self.s, self.tokenizer = s, tokenizer
        self._heldout = None  # the held-out training rows, read on first use (heldout_pool)
        id_all = resolve_dataset(s.id_validation, require_labels=True, num_labels=len(s.labels))
        if len(id_all) <= s.finetune_eval + 50:
            raise ValueError(f"{s.id_validation!r} has {len(id_all)} examples; the study needs more than "
                             f"finetune_eval + 50 = {s.finetune_eval + 50}")
        self.id_pool = id_all.select(range(s.finetune_eval))
        id_score = id_all.select(range(s.finetune_eval, min(len(id_all), s.finetune_eval + s.max_score_samples)))
        self.ood_pool, self.loaders = {}, {"id": make_loader(id_score, tokenizer, "text", 64, s.max_length)}
        for kind, spec in s.ood_validation.items():
            ds = resolve_dataset(spec, label_column=None)
            self.ood_pool[kind] = ds
            self.loaders[kind] = make_loader(ds.select(range(min(len(ds), s.max_score_samples))), tokenizer, "text",
                                             64, s.max_length)

    def heldout_pool(self):
        """Labelled ID rows no model of the study trains on: ``heldout_data`` from ``max_train_samples`` on."""
        if self._heldout is None:
            s = self.s
            if s.max_train_samples is None:
                raise ValueError(
                    "selection='heldout' needs max_train_samples: the held-out rows are the ones after it"
                )
            rows = resolve_dataset(s.heldout_data, require_labels=True, num_labels=len(s.labels))
            if len(rows) <= s.max_train_samples:
                raise ValueError(f"{s.heldout_data!r} has {len(rows)} rows, none after the first max_train_samples = "
                                 f"{s.max_train_samples} that train the models; lower max_train_samples")
            self._heldout = rows.select(range(s.max_train_samples, len(rows)))
        return self._heldout

    def selection(self, kind: str | None, samples: int, *, heldout: bool = False, pooled: bool = False):
        """``(ID, OOD)`` selection data: ``samples`` ID texts (the validation pool, or the held-out
        training rows), and ``samples`` OOD texts of ``kind`` -- or, ``pooled``, of every other kind
        (split evenly, as many as each has), so that ``kind`` stays unseen."""
        pool = self.heldout_pool() if heldout else self.id_pool
        id_data = pool.select(range(min(samples, len(pool))))
        if kind is None:
            return id_data, None
        if not pooled:
            return id_data, self.ood_pool[kind].select(range(min(samples, len(self.ood_pool[kind]))))

        others = [k for k in self.ood_pool if k != kind]
        share = -(-samples // len(others))  # ceil
        parts = [
            self.ood_pool[k].select(range(min(share, len(self.ood_pool[k])))).select_columns(["text"]) for k in others
        ]
        return id_data, datasets.concatenate_datasets(parts)


def study_data(s: TextStudy, tokenizer: Any) -> _Data:
    """The study's data sets (selection pools and scoring loaders) for ``tokenizer``."""
    return _Data(s, tokenizer)


def model_numbers(predictor: Any, data: _Data) -> dict[str, Any]:
    """ID numbers (accuracy, ECE, NLL, mean MI and disagreement) and, per OOD kind, the AUROC of every
    OOD score and the mean MI / disagreement, on the scoring sets."""
    ident = predict(predictor, data.loaders["id"], desc="score: id")
    rep = metrics.calibration_report(ident.probs, ident.labels, ident.member_probs)
    out: dict[str, Any] = {k: rep.get(k) for k in ("accuracy", "ece", "nll", "mutual_information", "disagreement")}
    out["ood"] = {}
    members = ident.member_logits.shape[1]
    for kind in data.s.ood_validation:
        ood = predict(predictor, data.loaders[kind], desc=f"score: {kind}")
        row: dict[str, Any] = {}
        for score in STUDY_SCORES:
            if score == "mutual_information" and members < 2:
                continue
            row[score] = metrics.ood_report(ident.ood_scores(score), ood.ood_scores(score))["auroc"]
        orep = metrics.calibration_report(ood.probs, torch.zeros(len(ood.probs), dtype=torch.long), ood.member_probs)
        row["mutual_information_mean"] = orep.get("mutual_information")
        row["disagreement_mean"] = orep.get("disagreement")
        out["ood"][kind] = row
    return out


def _build_masks(c: Candidate, target: Any, data: _Data, fold: str, seed: int):
    """The candidate's members for ``fold`` (:func:`hydra_hf.pruning.build_members`, as ``hydra-hf prune``)."""
    id_data, ood_data = data.selection(fold if c.uses_ood else None, c.samples, heldout=c.selection == "heldout",
                                       pooled=c.pooled)
    fraction = c.data_fraction if c.data_fraction is not None else data.s.prune_data_fraction
    return build_members(
        target,
        method=c.method,
        budget=c.budget(),
        id_data=id_data,
        ood_data=ood_data,
        members=c.members,
        seed=seed,
        heads_per_step=c.heads_per_step,
        data_fraction=fraction,
        temperature=c.temperature,
        mlp_keep=c.mlp_keep,
        mlp_spread=c.mlp_spread,
        batch_size=64,
        max_length=data.s.max_length,
        metadata={"selection": c.selection_key(fold), "seed": seed},
    )


def run_cell(s: TextStudy, c: Candidate, fold: str, seed: int, single_dir: Path, out: Path, work: Path, data: _Data,
             target: Any) -> dict[str, Any]:
    """Select, fine-tune, fuse and score one candidate on one fold; returns the cell's numbers per fusion."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    masks_file = out / "masks" / f"seed{seed}" / f"{c.selection_key(fold)}.json"
    if masks_file.exists():
        masks = HeadMasks.load(masks_file)
    else:
        masks = _build_masks(c, target, data, fold, seed)
        masks_file.parent.mkdir(parents=True, exist_ok=True)
        masks.save(masks_file)
        timings["select_s"] = time.perf_counter() - t0
    result: dict[str, Any] = {"candidate": dataclasses.asdict(c), "fold": fold, "seed": seed,
                              "selection": c.selection_key(fold), "jaccard": masks.metadata.get("pairwise_jaccard"),
                              "kept_heads": [sum(len(h) for h in m) for m in masks.kept_heads], "fusions": {}}
    t1 = time.perf_counter()
    if c.member_steps == 0:
        fused = {"average": convert_checkpoint(masks, base=single_dir)}
    else:
        start = single_dir if c.start == "single" else _base_dir(s)
        lr = s.member_learning_rate if c.start == "single" else s.learning_rate
        shutil.rmtree(work, ignore_errors=True)
        finetune_members(
            start,
            masks,
            s.train_data,
            s.id_validation,
            work / "fused",
            _finetune_config(s, c.member_steps, lr, seed + c.member_seed_offset),
            work_dir=work / "members",
            overwrite=True,
            id2label=dict(enumerate(s.labels)),
        )
        folders = [work / "members" / f"member_{m}" / "model" for m in range(masks.num_members)]
        fused = {f: convert_checkpoint(masks, members=folders, mlp_fusion=f) for f in s.mlp_fusions}
        timings["finetune_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    for fusion, model in fused.items():
        result["fusions"][fusion] = model_numbers(ModelPredictor(model.eval()), data)
    timings["score_s"] = time.perf_counter() - t2
    result["timings"] = timings
    shutil.rmtree(work, ignore_errors=True)  # member checkpoints: ~90 MB each; the numbers are kept
    return result


def folds_of(c: Candidate, s: TextStudy) -> list[str]:
    """The cells a candidate needs per seed: one per OOD kind, or one for all when it selects without OOD data."""
    return list(s.ood_validation) if c.uses_ood else [ANY_FOLD]


def _cell_file(out: Path, seed: int, c: Candidate, fold: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_=." else "_" for ch in c.name)
    return out / "cells" / f"seed{seed}" / safe / f"{fold}.json"


def run_study(
    s: TextStudy,
    output_dir: str | os.PathLike,
    *,
    candidates: Sequence[Candidate] = DEFAULT_CANDIDATES,
    seeds: Sequence[int] = (0,),
    singles: Mapping[int, str | os.PathLike] | None = None,
    shard: tuple[int, int] = (0, 1),
    screen: bool = False,
) -> dict[str, Any]:
    """Run (or resume) every cell: seeds x candidates x folds; returns :func:`collect`'s summary.

    Args:
        singles: an existing Single checkpoint per seed (else each seed's Single is trained first).
        shard: ``(i, n)``: this process runs the cells of every n-th selection, starting at the i-th
            (several processes share the folder; cells sharing masks stay in one process).
        screen: the two-stage protocol: every candidate on ``seeds[0]``, then on the other seeds only
            :func:`candidates_to_replicate` (with ``shard``, run it again once every process has
            finished screening, so that each replicates what the others screened).
    """
    if screen:
        run_study(s, output_dir, candidates=candidates, seeds=seeds[:1], singles=singles, shard=shard)
        again = candidates_to_replicate(output_dir, s, candidates, seeds)
        logger.info("screened on seed %d; replicating on seeds %s: %s", seeds[0], list(seeds[1:]),
                    ", ".join(c.name for c in again) or "nothing")
        if again:
            run_study(s, output_dir, candidates=again, seeds=seeds[1:], singles=singles, shard=shard)
        return collect(output_dir, s, candidates)

    if len(s.ood_validation) < 2:
        raise HydraInputError(
            f"ood_validation has {len(s.ood_validation)} kind(s); leave-one-kind-out needs at least 2"
        )
    for seed, folder in (singles or {}).items():  # before anything is written
        if not (Path(folder) / "config.json").is_file():
            raise HydraInputError(
                f"the Single of seed {seed}, {str(folder)!r}, is not a model folder (no config.json); "
                "give a fine-tuned checkpoint folder, or leave it out to train one"
            )
    out = Path(output_dir).resolve()
    _check_settings(out, s, candidates)
    prepare_owned_folder(out, command="study", overwrite=False, keep=True)
    remove_dead_process_folders(out / "work")  # a killed shard's scratch; live shards' are kept
    _write_json(out / "study.json", {"settings": dataclasses.asdict(s),
                                     "candidates": [dataclasses.asdict(c) for c in candidates], "seeds": list(seeds)})
    # cells that share a selection (the same masks) go to the same shard, so no selection runs twice
    groups: dict[str, int] = {}
    for c in candidates:
        for fold in folds_of(c, s):
            groups.setdefault(c.selection_key(fold), len(groups))
    for seed in seeds:
        single_dir = _single_of(s, seed, out, singles)
        target = load_pruning_target(single_dir)  # the Single and its tokenizer, as hydra-hf prune loads them
        single = target.adapter.model
        data = _Data(s, target.tokenizer)
        single_file = out / "cells" / f"seed{seed}" / "single.json"
        if not single_file.exists() and shard[0] == 0:
            single_file.parent.mkdir(parents=True, exist_ok=True)
            _write_json(single_file, {"seed": seed, "checkpoint": str(single_dir),
                                      "numbers": model_numbers(ModelPredictor(single), data)})
        for c in candidates:
            for fold in folds_of(c, s):
                if groups[c.selection_key(fold)] % shard[1] != shard[0]:
                    continue
                file = _cell_file(out, seed, c, fold)
                if file.exists():
                    continue
                logger.info("cell: seed %d, %s, fold %s", seed, c.name, fold)
                t0 = time.perf_counter()
                cell = run_cell(
                    s, c, fold, seed, single_dir, out, out / "work" / f"process{os.getpid()}", data, target
                )
                cell["timings"]["total_s"] = time.perf_counter() - t0
                file.parent.mkdir(parents=True, exist_ok=True)
                _write_json(file, cell)
                logger.info(
                    "cell done in %.0f s: seed %d, %s, fold %s", cell["timings"]["total_s"], seed, c.name, fold
                )
    return collect(out, s, candidates)


# settings that only change the decision over finished cells, not the cells
DECISION_SETTINGS = ("max_accuracy_drop", "ece_tolerance", "min_seeds", "replicate_margin", "headline_score")
SINGLE_SCORES = tuple(s.name for s in metrics.OOD_SCORES.values() if s.single_model)  # the scores one model has


def single_reference(single_ood: Mapping[str, float], score: str) -> float:
    """The Single's AUROC an ensemble row under ``score`` is compared with: the Single's AUROC under the
    same score, or -- for a score one model lacks (mutual information) -- its best own score."""
    if score in single_ood:
        return single_ood[score]
    return max(single_ood[sc] for sc in SINGLE_SCORES if sc in single_ood)


def _check_settings(out: Path, s: TextStudy, candidates: Sequence[Candidate]) -> None:
    """Refuse to add cells to a study folder whose cells were run with other settings (other data, model
    or training), or under a candidate's name with other choices: their numbers would be mixed in one
    table. The decision settings may change."""
    defaults = {f.name: f.default for f in dataclasses.fields(Candidate)}
    for c in candidates:
        now = json.loads(json.dumps(dataclasses.asdict(c)))
        for file in sorted(out.glob(f"cells/seed*/{_cell_file(out, 0, c, ANY_FOLD).parent.name}/*.json")):
            recorded = _read_json(file).get("candidate")
            # a field Candidate gained after the cell was written counts as recorded at its default
            if recorded is not None and recorded != {
                k: v for k, v in now.items() if k in recorded or v != defaults[k]
            }:
                raise HydraInputError(f"{file} was run for another candidate named {c.name!r} ({recorded}); "
                                      "give the changed candidate another name, or use another output folder")
    file = out / "study.json"
    if not file.is_file():
        return
    try:
        recorded = json.loads(file.read_text())["settings"]
    except (ValueError, KeyError, TypeError):
        raise HydraInputError(f"{file} is not a study record; use another output folder") from None
    now = json.loads(json.dumps(dataclasses.asdict(s)))
    changed = [k for k in recorded if k not in DECISION_SETTINGS and recorded[k] != now.get(k)]
    if changed:
        k = changed[0]
        raise HydraInputError(f"{out} holds cells run with {k}={recorded[k]!r}, not {now.get(k)!r}"
                              f"{f' (and {len(changed) - 1} more settings)' if len(changed) > 1 else ''}; "
                              "use another output folder for other settings")


def _single_of(s: TextStudy, seed: int, out: Path, singles: Mapping[int, str | os.PathLike] | None) -> Path:
    """The Single checkpoint of ``seed``: the one its cells were scored against (``single.json``),
    else the given one, else a newly trained one. A given checkpoint that differs from the recorded
    one is refused: the cells of one seed must share their Single."""
    single_file = out / "cells" / f"seed{seed}" / "single.json"
    recorded = Path(_read_json(single_file)["checkpoint"]) if single_file.exists() else None
    given = Path(singles[seed]) if singles and seed in singles else None
    if recorded is not None and given is not None and given.resolve() != recorded.resolve():
        raise ValueError(f"seed {seed}: the study's cells were scored against the Single {recorded}, not {given}; "
                         f"drop --single {seed}=... or use another --output")
    if recorded is not None:
        if not (recorded / "config.json").is_file():
            raise ValueError(
                f"seed {seed}: the study's cells were scored against the Single {recorded}, which is gone; "
                f"restore it or use another --output"
            )
        return recorded
    return given if given is not None else train_single(s, seed, out / f"single_seed{seed}")


def _read_json(path: Path) -> Any:
    """A record of the study folder (a cell, a Single's numbers), or one line naming it and the fix."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise HydraInputError(f"{str(path)!r} is not a readable study record (truncated or edited); delete it and run "
                              "the study again to redo that cell") from None


def _write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")  # shard processes read what another one writes


def collect(output_dir: str | os.PathLike, s: TextStudy, candidates: Sequence[Candidate],
            seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """Summarise the finished cells: one row per (candidate, fusion, OOD score), averaged over folds
    (leave-one-OOD-kind-out) and then over seeds (mean and std). ``seeds``: only these (default: all)."""
    out = Path(output_dir)
    kinds = list(s.ood_validation)
    singles = {}
    for f in sorted((out / "cells").glob("seed*/single.json")):
        d = _read_json(f)
        if seeds is None or d["seed"] in seeds:
            singles[d["seed"]] = d["numbers"]
    rows, screening = [], []  # screening: the records of the first seed, (candidate, its numbers)
    first_seed = min(singles, default=None)
    for c in candidates:
        per_seed: dict[tuple[str, str], list[dict[str, float]]] = {}
        for seed, single in singles.items():
            # a selection without OOD data is one cell, scored on every fold's kinds
            cells = {fold: _cell_file(out, seed, c, fold if c.uses_ood else ANY_FOLD) for fold in kinds}
            if not all(f.exists() for f in cells.values()):
                continue
            cells = {fold: _read_json(f) for fold, f in cells.items()}
            fusions = sorted({fu for cell in cells.values() for fu in cell["fusions"]})
            for fusion in fusions:
                for score in STUDY_SCORES:
                    gains, own, per_kind, ok = [], [], {k: [] for k in kinds}, True
                    accs, eces, mis_id, mis_ood, dis_id, dis_ood = [], [], [], [], [], []
                    for fold, cell in cells.items():
                        num = cell["fusions"].get(fusion) or cell["fusions"]["average"]
                        if score not in num["ood"][kinds[0]]:
                            ok = False
                            break
                        # a fold transfers to the kinds its selection did not see: the others, or -- for a
                        # selection on the pooled other kinds -- the fold's own kind
                        unseen = [fold] if c.pooled else [k for k in kinds if k != fold]
                        fold_gain = []
                        for k in unseen:
                            g = num["ood"][k][score] - single_reference(single["ood"][k], score)
                            fold_gain.append(g)
                            per_kind[k].append(g)
                        gains.append(sum(fold_gain) / len(fold_gain))
                        seen = [k for k in kinds if k not in unseen]  # the kind(s) it selected on
                        own.append(sum(num["ood"][k][score] - single_reference(single["ood"][k], score) for k in seen)
                                   / len(seen))
                        accs.append(num["accuracy"] - single["accuracy"])
                        eces.append(num["ece"] - single["ece"])
                        mis_id.append(num["mutual_information"] or 0.0)
                        mis_ood.append(
                            sum(num["ood"][k]["mutual_information_mean"] or 0.0 for k in kinds) / len(kinds)
                        )
                        dis_id.append(num.get("disagreement") or 0.0)
                        dis_ood.append(sum(num["ood"][k].get("disagreement_mean") or 0.0 for k in kinds) / len(kinds))
                    if not ok:
                        continue
                    record = {
                        "gain": _mean(gains),
                        "selected_kind_gain": _mean(own),
                        "worst_fold_gain": min(gains),
                        "worst_kind_gain": min(_mean(v) for v in per_kind.values() if v),
                        "accuracy_diff": _mean(accs),
                        "ece_diff": _mean(eces),
                        "mi_id": _mean(mis_id),
                        "mi_ood": _mean(mis_ood),
                        "disagreement_id": _mean(dis_id),
                        "disagreement_ood": _mean(dis_ood),
                        **{f"gain_{k}": _mean(v) for k, v in per_kind.items()},
                    }
                    per_seed.setdefault((fusion, score), []).append(record)
                    if seed == first_seed:
                        screening.append((c.name, record))
        for (fusion, score), seeds_rows in per_seed.items():
            row = {"candidate": c.name, "fusion": fusion, "score": score, "seeds": len(seeds_rows)}
            for key in seeds_rows[0]:
                vals = [r[key] for r in seeds_rows]
                row[key] = _mean(vals)
                row[key + "_std"] = _std(vals)
            rows.append(row)
    # the two-stage protocol's screen: on the first seed (paired: same Single, same texts), the candidates
    # whose best row meeting the constraints is within replicate_margin of the best such row
    eligible = [(name, r) for name, r in screening if _meets_constraints(r, s)]
    best = max((r["gain"] for _, r in eligible), default=None)
    close = sorted({name for name, r in eligible if r["gain"] >= best - s.replicate_margin}) if eligible else []
    return {"kinds": kinds, "single": {str(k): v for k, v in singles.items()}, "rows": rows,
            "screen": {"seed": first_seed, "close": close}}


def candidates_to_replicate(output_dir: str | os.PathLike, s: TextStudy, candidates: Sequence[Candidate],
                            seeds: Sequence[int]) -> list[Candidate]:
    """The second stage of the two-stage protocol (``study_text.py --screen``). Every candidate is
    first run on ``seeds[0]`` (screening); the candidates whose best eligible row on that seed is within
    ``s.replicate_margin`` of the best eligible row on that seed (a paired comparison: same Single, same
    data) are the ones that could still be chosen, and are returned if some seed of ``seeds`` lacks them.
    A candidate not finished on the screening seed is not returned (screen it first)."""
    close = set(collect(output_dir, s, candidates, seeds=seeds[:1])["screen"]["close"])
    wanted = []
    for c in candidates:
        if c.name in close and any(not collect(output_dir, s, [c], seeds=[seed])["rows"] for seed in seeds[1:]):
            wanted.append(c)
    return wanted


def _mean(v: Sequence[float]) -> float:
    return sum(v) / len(v)


def _std(v: Sequence[float]) -> float:
    if len(v) < 2:
        return 0.0
    m = _mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def _meets_constraints(r: Mapping[str, Any], s: TextStudy) -> bool:
    return r["accuracy_diff"] >= -s.max_accuracy_drop and r["ece_diff"] <= s.ece_tolerance


def seeds_to_choose(summary: Mapping[str, Any], s: TextStudy) -> int:
    """How many seeds a row needs to be chosen: ``s.min_seeds``, or (None) as many as the best-replicated row has."""
    most = max((r["seeds"] for r in summary["rows"]), default=0)
    return most if s.min_seeds is None else min(s.min_seeds, most)


def decide(summary: Mapping[str, Any], s: TextStudy) -> dict[str, Any] | None:
    """The protocol's choice: among rows under ``s.headline_score`` (MSP, the paper's; other scores are
    reported, not chosen) with accuracy within ``max_accuracy_drop`` of Single, ECE at
    most ``ece_tolerance`` above it and at least :func:`seeds_to_choose` seeds, the largest mean
    transfer gain (ties: the better worst fold). Rows run on fewer seeds are provisional: a gain on
    one seed is within the seed-to-seed spread the replicated rows show, so it cannot win until replicated."""
    need = seeds_to_choose(summary, s)
    eligible = [r for r in summary["rows"] if _meets_constraints(r, s) and r["seeds"] >= need
                and (s.headline_score is None or r["score"] == s.headline_score)]
    if not eligible:
        return None
    return max(eligible, key=lambda r: (round(r["gain"], 6), r["worst_fold_gain"]))


def _best_rows(summary: Mapping[str, Any], s: TextStudy) -> list[Mapping[str, Any]]:
    """One row per candidate, by transfer gain: the chosen row for the chosen candidate, else its largest
    gain among its rows that meet the constraints, else (none does) its largest gain."""
    choice = decide(summary, s)
    rows = sorted(summary["rows"], key=lambda r: -r["gain"])
    best: dict[str, Mapping[str, Any]] = {}
    ranked = [r for r in rows if _meets_constraints(r, s)] + [r for r in rows if not _meets_constraints(r, s)]
    for r in ([choice] if choice is not None else []) + ranked:
        best.setdefault(r["candidate"], r)
    return [r for r in rows if best[r["candidate"]] is r]


def _verdict(r: Mapping[str, Any], choice: Mapping[str, Any] | None, need: int, summary: Mapping[str, Any],
             s: TextStudy) -> str:
    """A row's mark in the table: chosen; no (constraints); yes; on fewer seeds: provisional (its candidate
    passed the first seed's screen: replicate it, it may change the choice) or screened out."""
    if r is choice:
        return "**chosen**"
    if not _meets_constraints(r, s):
        return "no"
    if r["seeds"] >= need:
        return "yes"
    return "provisional" if r["candidate"] in summary.get("screen", {}).get("close", ()) else "screened out"


def plot_decision(summary: Mapping[str, Any], s: TextStudy, path: str | os.PathLike, *,
                  best_per_candidate: bool = False) -> str:
    """``summary``'s rows (or one per candidate, as :func:`render_decision_table`) as bars of their
    transfer gain (:func:`hydra_hf.evaluation.plots.transfer_gains`)."""
    rows = [{**r, "label": f"{r['candidate']} | {r['fusion']} | {r['score']}",
             "eligible": _meets_constraints(r, s)}
            for r in (_best_rows(summary, s) if best_per_candidate else summary["rows"])]
    return transfer_gains(rows, path, kinds=summary["kinds"], title="Selection protocol: transfer to unseen OOD kinds")


def render_decision_table(summary: Mapping[str, Any], s: TextStudy, *, best_per_candidate: bool = False,
                          preamble: bool = True) -> str:
    """Markdown: every row, sorted by mean transfer gain, with the constraints' verdicts and the choice.

    ``best_per_candidate``: one row per candidate (the chosen row for the chosen candidate, else its
    largest transfer gain) - the short table for a README; losers stay in it. ``preamble``: the Single
    models' numbers and the decision rule above the table."""
    choice = decide(summary, s)
    rows = _best_rows(summary, s) if best_per_candidate else sorted(summary["rows"], key=lambda r: -r["gain"])
    kinds = summary["kinds"]
    head = ["candidate", "fusion", "OOD score", "transfer gain", "gain on selected kind", "worst fold", "worst kind",
            *[f"gain {k}" for k in kinds], "Δ acc", "Δ ECE", "MI id", "MI ood", "disagree id", "disagree ood", "seeds",
            "eligible"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def pm(r: Mapping[str, Any], key: str, spec: str = "+.4f") -> str:
        std = r.get(key + "_std", 0.0)
        return f"{r[key]:{spec}}" + (f" ± {std:.4f}" if r["seeds"] > 1 else "")

    need = seeds_to_choose(summary, s)
    for r in rows:
        mark = _verdict(r, choice, need, summary, s)
        cells = [r["candidate"], r["fusion"], r["score"], pm(r, "gain"), pm(r, "selected_kind_gain"),
                 pm(r, "worst_fold_gain"), pm(r, "worst_kind_gain"),
                 *[pm(r, f"gain_{k}") for k in kinds], pm(r, "accuracy_diff"), pm(r, "ece_diff"),
                 f"{r['mi_id']:.4f}", f"{r['mi_ood']:.4f}", f"{r.get('disagreement_id', 0.0):.3f}",
                 f"{r.get('disagreement_ood', 0.0):.3f}", str(r["seeds"]), mark]
        lines.append("| " + " | ".join(cells) + " |")
    single_lines = []
    for seed, num in summary["single"].items():
        aucs = ", ".join(f"{k} {num['ood'][k]['msp']:.4f}" for k in kinds)
        single_lines.append(
            f"- Single (seed {seed}): accuracy {num['accuracy']:.4f}, ECE {num['ece']:.4f}; MSP AUROC {aucs}"
        )
    rule = (f"Decision rule: accuracy at most {100 * s.max_accuracy_drop:.1f} points below Single, ECE at most "
            f"{s.ece_tolerance} above Single's, then the largest transfer gain (mean over folds of the mean OOD AUROC "
            "gain over Single (MSP) on the OOD kinds the fold did not select on), among rows run on at least "
            f"{need} seed{'s' if need != 1 else ''}; a row on fewer seeds is provisional if its candidate's best "
            f"eligible row on the first seed is within {s.replicate_margin} of that seed's best (replicate it), "
            "else screened out.")
    return "\n".join([*single_lines, "", rule, "", *lines] if preamble else lines) + "\n"


# ------------------------------------------------------------------------------ selection noise
def first_step_scores(target: Any, id_data: Any, ood_data: Any, max_length: int = 48) -> dict[str, torch.Tensor]:
    """Every head's score ``S`` at the circuit search's first step (the Single model with that one head
    ablated), for CircOOD (``"ood"``) and CircAvg (``"avg"``), computed by the search's own evaluator.
    Shape ``(heads,)``, in the order of the layout's ``(layer, head)`` cells."""
    gates = HeadLayout.of(target.adapter, None).ones()
    candidates = [(int(r), int(h)) for r, h in torch.nonzero(gates > 0).tolist()]
    id_b = list(make_text_loader(id_data, target.tokenizer, 64, max_length))
    ood_b = list(make_text_loader(ood_data, target.tokenizer, 64, max_length))
    ev = make_evaluator(target.adapter, id_b, ood_b)
    ood = ev.evaluate(gates, candidates, "ood")
    # CircAvg's S is the mean of accuracy and the MSP AUROC (scoring.circuit_score); "acc" needs the
    # ID logits only, so both scores cost 1.5 passes instead of 2
    return {"ood": ood, "avg": (ev.evaluate(gates, candidates, "acc") + ood) / 2}


def compare_selections(a: torch.Tensor, b: torch.Tensor, top: int) -> dict[str, float]:
    """Agreement of two selection sets' head scores (see :func:`selection_noise`)."""
    ta, tb = set(torch.argsort(-a, stable=True)[:top].tolist()), set(torch.argsort(-b, stable=True)[:top].tolist())
    return {"spearman": float(spearmanr(a.numpy(), b.numpy()).statistic),
            "top_jaccard": len(ta & tb) / len(ta | tb),
            "noise_std": float((a - b).std() / math.sqrt(2)),
            "spread_std": float(((a + b) / 2).std())}


def selection_noise(
    target: Any,
    data: _Data,
    *,
    sizes: Sequence[int] = (48, 96, 192),
    kind: str | None = None,
    repeats: int = 3,
    top: int = 6,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """How much of the circuit search's choice is sampling noise? Measured on its first step.

    For each selection-set size ``n`` and each of ``repeats`` random draws, two *disjoint* selection
    sets of ``n`` ID and ``n`` OOD texts (kind ``kind``, default the first) are drawn from the pools
    the protocol selects from; on each, every head of the Single model is scored as the greedy search
    scores it (:func:`first_step_scores`). If the search picked heads for a property of the model
    rather than of the sample, the two sets would agree. Per ``(n, score)``, mean (and std) over draws:

    - ``spearman``: rank correlation of the heads' scores between the two sets;
    - ``top_jaccard``: overlap of the ``top`` heads each set would remove first (one greedy step of
      ``heads_per_step = top``);
    - ``noise_std``: the sampling standard deviation of one head's score, ``std(S_A - S_B) / sqrt 2``;
    - ``spread_std``: the standard deviation of the scores across heads (mean of both sets): the
      signal the search ranks by (it still contains some noise).
    """
    kind = kind or next(iter(data.s.ood_validation))
    id_pool, ood_pool = data.id_pool, data.ood_pool[kind]
    rows = []
    for n in sizes:
        if 2 * n > len(id_pool) or 2 * n > len(ood_pool):
            raise ValueError(
                f"selection_noise: size {n} needs 2 x {n} texts per pool; the ID pool has {len(id_pool)}, {kind!r} "
                f"has {len(ood_pool)}"
            )
        stats: dict[str, dict[str, list[float]]] = {}
        # a pair of draws scores every head twice: minutes per pair at the demo's sizes
        for r in tqdm(range(repeats), desc=f"selection noise {kind} n={n}", unit="pair"):
            g = torch.Generator().manual_seed(seed * 100_003 + n * 101 + r)
            ids = torch.randperm(len(id_pool), generator=g)[: 2 * n].tolist()
            oods = torch.randperm(len(ood_pool), generator=g)[: 2 * n].tolist()
            a, b = (
                first_step_scores(target, id_pool.select(ids[part]), ood_pool.select(oods[part]), data.s.max_length)
                for part in (slice(0, n), slice(n, 2 * n))
            )
            for score in ("ood", "avg"):
                for key, value in compare_selections(a[score], b[score], top).items():
                    stats.setdefault(score, {}).setdefault(key, []).append(value)
        for score, st in stats.items():
            row: dict[str, Any] = {"n": n, "score": score, "kind": kind, "repeats": repeats, "top": top}
            for key, vals in st.items():
                row[key] = _mean(vals)
                row[key + "_std"] = _std(vals)
            rows.append(row)
            logger.info("selection noise %s n=%d %s: spearman %.3f, top-%d jaccard %.3f, noise %.4f, spread %.4f",
                        kind, n, score, row["spearman"], top, row["top_jaccard"], row["noise_std"], row["spread_std"])
    return rows


def render_selection_noise(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of :func:`selection_noise`'s rows."""
    lines = [
        "| OOD kind | n (ID + OOD each) | score | Spearman (set A vs B) | top-k Jaccard | "
        "noise std | spread std | spread / noise |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['n']} | Circ{'OOD' if r['score'] == 'ood' else 'Avg'} "
            f"| {r['spearman']:.3f} ± {r['spearman_std']:.3f} | {r['top_jaccard']:.3f} (k={r['top']}) "
            f"| {r['noise_std']:.4f} | {r['spread_std']:.4f} | {r['spread_std'] / max(r['noise_std'], 1e-12):.2f} |"
        )
    return "\n".join(lines) + "\n"
