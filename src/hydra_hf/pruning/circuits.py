"""Strategy 2 — circuit search: greedy head ablation driven by an ID and an OOD validation set.

Paper D.1.2, Algorithm 1. Start with every head on. At each step, temporarily ablate every remaining
head, one at a time, evaluate a score ``S`` of the ablated model, and permanently ablate the head
whose removal gives the *highest* ``S``; repeat until ``B`` heads are removed. Scores:

- ``"acc"`` (CircAcc): accuracy on the labelled ID set;
- ``"ood"`` (CircOOD): AUROC of the maximum softmax probability (MSP), ID = positive, OOD = negative;
- ``"avg"`` (CircAvg): the mean of the two.

Ties are broken by the lower ``(layer, head)`` (or at random with ``random_ties``). The result holds
the gates, the full removal ranking and the score after every step.

Two towers (CLIP, ``tower="joint"``): the candidates of a step are the remaining heads of *both*
towers; each evaluation sets the gates of both towers and scores the zero-shot logits. The search
runs on the stacked gate matrix of :class:`~hydra_hf.pruning.layout.HeadLayout` (the layers of the
towers stacked into rows, padding cells never candidates), so it is the same loop as for one tower;
ties are broken by the lower stacked ``(row, head)`` (vision before text), and the result names heads
``(tower, layer, head)``.

Speed (the search costs O(heads x budget) evaluations of the model):

- evaluation runs in ``torch.inference_mode``;
- :class:`~hydra_hf.pruning.cached_bert.CachedBertEvaluator` (BERT-like sequence classifiers) runs
  the encoder layer by layer from cached states: once per step it runs the model with the permanent ablations, caching
  the hidden states entering each layer and each head's context; ablating head ``h`` of layer ``l`` then only
  subtracts that head's cached contribution from layer ``l``'s attention output and re-runs the rest
  of layer ``l`` and the layers above it; all candidate heads of a layer are evaluated in one batched
  forward pass (the candidates are stacked along the batch dimension); in the last layer only the
  [CLS] row, which the classifier reads, is computed;
- text batches are re-bucketed by length, so little padding is computed;
- screening (opt-in, ``precision="screened"``; pays off only where bf16 matrix products are fast —
  AVX512-BF16/AMX CPUs, GPUs — *and* few candidates are near-tied): every candidate is scored in
  bf16 first, and every candidate whose bf16 score is within a margin of the best float32-confirmed
  score is re-scored in float32, so the head removed at each step is chosen on float32 scores. It
  equals the float32 greedy unless a bf16 score is off by more than the margin, which adapts to
  twice the largest bf16 error seen so far. Measured on MiniLM with a trained head
  (``bench/bench_circuits.py``): identical ranking, but 59 % of the candidates were near-tied and
  re-scored, so it was no faster than float32 there; hence float32 is the default.

Other architectures use :class:`GatedEvaluator`, which re-runs the full model per candidate through
:class:`~hydra_hf.pruning.gates.HeadGates` (the plain Algorithm 1). Both evaluators compute the same
numbers up to float rounding; a test checks that they give the same ranking.

Approximation (documented, opt-in): ``heads_per_step=k > 1`` removes the ``k`` best candidates of a
step at once (k times fewer steps; candidates are still scored one at a time against the current
model, so interactions between heads removed in the same step are ignored).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from ..families import get_adapter
from ..families.adapters import ModelAdapter
from ..metrics import ood_auroc
from .budget import Budget
from .cached_bert import PRECISIONS, CachedBertEvaluator, supports_cached_bert
from .gates import HeadGates
from .layout import HeadLayout
from .lm import LMGatedEvaluator
from .scoring import CIRCUIT_SCORES, Batch, batch_labels, circuit_score
from .taylor import PruneResult

logger = logging.getLogger(__name__)

# CIRCUIT_SCORES, Batch and circuit_score live in .scoring (shared with .cached_bert); re-exported here.
__all__ = [
    "CIRCUIT_SCORES",
    "Batch",
    "Evaluator",
    "GatedEvaluator",
    "as_metadata",
    "circuit_prune",
    "circuit_prune_criteria",
    "circuit_score",
    "make_evaluator",
    "reference_circuit_ranking",
]


# -------------------------------------------------------------------------------------- evaluators
class Evaluator(Protocol):
    """What the greedy search needs from an evaluator (plain, cached, ...)."""

    def evaluate(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], score: str, *, top: int = 1
    ) -> torch.Tensor:
        """Score ``S`` of the model with ``gates`` and, in turn, each candidate ``(row, head)`` also off. ``(C,)``.

        ``gates`` is the search's gate matrix: ``(L, H)`` for one tower, the stacked ``(R, H_max)`` of
        a :class:`~hydra_hf.pruning.layout.HeadLayout` for several. ``top``: the caller will take the
        ``top`` best candidates (an evaluator that approximates some scores must get those exact).
        """
        ...

    def score_of(self, gates: torch.Tensor, score: str) -> float:
        """Score ``S`` of the model with ``gates`` (no extra ablation)."""
        ...


class GatedEvaluator:
    """Scores candidate ablations by re-running the full model with :class:`HeadGates` (plain path).

    Works for every architecture the adapters support, on one tower (``tower`` a name, or ``None``
    for the only one) or on both towers of a CLIP model (``tower="joint"``: gates and candidates are
    rows of the stacked :class:`~hydra_hf.pruning.layout.HeadLayout`).
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        id_batches: Sequence[Batch],
        ood_batches: Sequence[Batch] | None,
        *,
        tower: str | None = None,
    ) -> None:
        self.adapter = adapter
        self.layout = HeadLayout.of(adapter, tower)
        self.id_batches = list(id_batches)
        self.ood_batches = list(ood_batches) if ood_batches is not None else None
        self.id_labels = batch_labels(self.id_batches)

    @torch.inference_mode()
    def _logits(self, hg: HeadGates, gates: torch.Tensor, batches: Sequence[Batch]) -> torch.Tensor:
        hg.set(self.layout.split(gates))  # every tower of the layout
        return torch.cat([self.adapter.logits(b).float().cpu() for b in batches])

    def evaluate(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], score: str, *, top: int = 1
    ) -> torch.Tensor:
        """Score of the model with ``gates`` and, in turn, each candidate head also off. Shape ``(C,)``."""
        return self.evaluate_many(gates, candidates, (score,), top=top)[score]

    def evaluate_many(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], scores: Sequence[str], *, top: int = 1
    ) -> dict[str, torch.Tensor]:
        """:meth:`evaluate` for several scores: each candidate's forward passes serve them all. ``{score: (C,)}``."""
        model = self.adapter.model
        was_training = model.training
        model.eval()
        out = {score: torch.empty(len(candidates), dtype=torch.float64) for score in scores}
        needs_ood = any(score != "acc" for score in scores)
        try:
            with HeadGates(model, adapter=self.adapter) as hg:
                for i, (layer, head) in enumerate(candidates):
                    g = gates.clone()
                    g[layer, head] = 0.0
                    id_logits = self._logits(hg, g, self.id_batches)
                    ood_logits = self._logits(hg, g, self.ood_batches) if needs_ood else None
                    for score in scores:
                        out[score][i] = circuit_score(id_logits, self.id_labels, ood_logits, score)
        finally:
            model.train(was_training)
        return out

    def score_of(self, gates: torch.Tensor, score: str) -> float:
        """Score of the model with ``gates`` (no extra ablation)."""
        model = self.adapter.model
        was_training = model.training
        model.eval()
        try:
            with HeadGates(model, adapter=self.adapter) as hg:
                id_logits = self._logits(hg, gates, self.id_batches)
                ood_logits = self._logits(hg, gates, self.ood_batches) if score != "acc" else None
        finally:
            model.train(was_training)
        return circuit_score(id_logits, self.id_labels, ood_logits, score)


# ---------------------------------------------------------------------------------------- search
def make_evaluator(
    adapter: ModelAdapter,
    id_batches: Sequence[Batch],
    ood_batches: Sequence[Batch] | None,
    *,
    tower: str | None = None,
    fast: bool = True,
    precision: str = "fp32",
) -> Evaluator:
    """The fastest evaluator available for the model (``fast=False``: always the plain one).

    A causal LM (``adapter.task == "causal_lm"``) always gets :class:`~hydra_hf.pruning.lm.LMGatedEvaluator`
    (next-token accuracy, sequence-level MSP AUROC).

    ``precision`` (cached evaluator only): ``"fp32"`` (every candidate in float32, the default),
    ``"screened"`` (bf16 screening, float32 decisions) or ``"bf16"`` (approximate); see
    :class:`~hydra_hf.pruning.cached_bert.CachedBertEvaluator`.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown circuit precision {precision!r}; choose one of {list(PRECISIONS)}")
    if adapter.task == "causal_lm":
        if precision != "fp32":
            logger.warning("precision=%r needs the cached BERT evaluator; scoring the causal LM in float32", precision)
        return LMGatedEvaluator(adapter, id_batches, ood_batches, tower=tower)
    if fast and adapter.kind == "hf_bert" and supports_cached_bert(adapter.model):
        return CachedBertEvaluator(adapter, id_batches, ood_batches, precision=precision)
    if precision != "fp32":
        logger.warning("precision=%r needs the cached BERT evaluator; scoring in float32", precision)
    if fast:
        logger.info(
            "no cached circuit evaluator for %s; re-running the full model per candidate", type(adapter.model).__name__
        )
    return GatedEvaluator(adapter, id_batches, ood_batches, tower=tower)


class _GreedySearch:
    """The state of one greedy search (Algorithm 1) over the stacked gate matrix of a layout: the
    loop of :func:`circuit_prune`, split into "which candidates now" and "take the best of these
    scores", so that several searches can share one evaluator (:func:`circuit_prune_criteria`)."""

    def __init__(self, layout: HeadLayout, budget: Budget, score: str, *, heads_per_step: int, seed: int | None,
                 random_ties: bool, tie_tolerance: float) -> None:
        self.layout, self.score = layout, score
        self.n_remove = layout.num_removed(budget)
        self.min_keep = budget.min_kept_per_layer()
        self.heads_per_step, self.random_ties, self.tie_tolerance = heads_per_step, random_ties, tie_tolerance
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed if seed is not None else 0)
        self.gates = layout.ones()  # (R, H_max): one tower's (L, H), or the stacked towers (padding 0)
        self.scores = torch.full(self.gates.shape, float("nan"))
        self.removal: list[tuple[int, int] | tuple[str, int, int]] = []
        self.history: list[float] = []
        self.n_evals = 0

    @property
    def done(self) -> bool:
        return len(self.removal) >= self.n_remove

    @property
    def take(self) -> int:
        """Heads this step removes."""
        return min(self.heads_per_step, self.n_remove - len(self.removal))

    def candidates(self) -> list[tuple[int, int]]:
        """The ``(row, head)`` cells that may be removed now (their row keeps more than the minimum)."""
        kept_per_layer = self.gates.sum(dim=1)
        R, H = self.gates.shape
        found = [
            (row, h)
            for row in range(R)
            if kept_per_layer[row] > self.min_keep
            for h in range(H)
            if self.gates[row, h] > 0.5
        ]
        if not found:  # cannot happen with a checked budget; guard against an endless loop
            raise RuntimeError("no candidate head left to remove")
        return found

    def step(self, candidates: Sequence[tuple[int, int]], s: torch.Tensor, evaluator: Evaluator) -> int:
        """Remove the ``take`` best of ``candidates`` given their scores ``s`` ``(C,)``; returns how many."""
        take = self.take
        self.n_evals += len(candidates)
        per_row_left = {row: int(k) for row, k in enumerate(self.gates.sum(dim=1).tolist())}
        chosen: list[int] = []
        for i in _rank_candidates(s, self.tie_tolerance, self.generator if self.random_ties else None):
            row, h = candidates[i]
            if per_row_left[row] <= self.min_keep:
                continue
            chosen.append(i)
            per_row_left[row] -= 1
            if len(chosen) == take:
                break
        for i in chosen:
            row, h = candidates[i]
            self.gates[row, h] = 0.0
            self.scores[row, h] = float(s[i])
            self.removal.append(self.layout.label(row, h))
        self.history.append(float(s[chosen[0]]) if take == 1 else evaluator.score_of(self.gates, self.score))
        return len(chosen)

    def result(self, tower: str, elapsed: float, **extra: Any) -> PruneResult:
        return PruneResult(
            gates=self.layout.unstack(self.gates),
            scores=self.layout.unstack(self.scores),
            removal_order=self.removal,
            metadata={
                "method": f"circuit-{self.score}",
                "score": self.score,
                "seed": self.seed,
                "heads_per_step": self.heads_per_step,
                "tower": tower,
                "score_history": self.history,
                "evaluations": self.n_evals,
                "seconds": round(elapsed, 3),
                **extra,
            },
        )


def _check_search_arguments(score: str, ood_batches: Sequence[Batch] | None, heads_per_step: int) -> None:
    if score not in CIRCUIT_SCORES:
        raise ValueError(f"unknown circuit score {score!r}; choose one of {list(CIRCUIT_SCORES)}")
    if score != "acc" and not ood_batches:
        raise ValueError(f"circuit-{score} needs OOD validation data; give --ood-data")
    if heads_per_step < 1:
        raise ValueError(f"heads_per_step must be >= 1, got {heads_per_step}")


def circuit_prune(
    adapter: ModelAdapter,
    id_batches: Sequence[Batch],
    ood_batches: Sequence[Batch] | None,
    budget: Budget,
    *,
    score: str = "avg",
    tower: str | None = None,
    heads_per_step: int = 1,
    seed: int | None = None,
    random_ties: bool = False,
    tie_tolerance: float = 1e-12,
    fast: bool = True,
    precision: str = "fp32",
    evaluator: Evaluator | None = None,
    progress: bool = True,
) -> PruneResult:
    """Greedy circuit search (Algorithm 1) for one member.

    Args:
        adapter: the model's adapter (a classifier: logits ``(B, C)``; or a causal LM,
            ``task="causal_lm"``: scored by :class:`~hydra_hf.pruning.lm.LMGatedEvaluator`).
        id_batches: labelled ID validation batches.
        ood_batches: OOD validation batches (needed for ``score`` ``"ood"`` / ``"avg"``).
        budget: ``Budget(remove=N)`` removes ``N`` heads anywhere; ``Budget(heads_per_layer=K)``
            removes ``L*(H-K)`` heads, never taking a layer below ``K`` heads. With
            ``tower="joint"``, ``N`` counts the heads of both towers and ``K`` applies to every
            layer of each tower.
        score: ``"acc"``, ``"ood"`` or ``"avg"``.
        tower: a tower name (``None``: the only one) or ``"joint"`` (both towers of a CLIP model).
        heads_per_step: ``k`` heads removed per step (``1`` = the exact greedy; ``> 1`` is the
            documented approximation of the module docstring).
        seed / random_ties: with ``random_ties``, tied best candidates are chosen at random (seeded);
            otherwise the lowest ``(layer, head)`` wins.
        tie_tolerance: scores within this of the best count as tied.
        fast: use the cached evaluator when the architecture has one.
        precision: the cached evaluator's arithmetic (``"fp32"``, ``"screened"``, ``"bf16"``); see
            :func:`make_evaluator`.
        evaluator: a ready evaluator (overrides ``fast`` and ``precision``).

    Returns:
        :class:`PruneResult`; ``scores[l, h]`` = ``S`` right after head ``(l, h)`` was removed (NaN
        for kept heads), ``removal_order`` = the ranking (first removed = least useful),
        ``metadata["score_history"]`` = ``S`` after each step (index 0: the unpruned model). With
        ``tower="joint"``, ``gates`` and ``scores`` are ``{tower: (L_t, H_t)}`` and the ranking holds
        ``(tower, layer, head)`` triples.
    """
    (result,) = circuit_prune_criteria(
        adapter, id_batches, ood_batches, budget, scores=[score], seeds=[seed], tower=tower,
        heads_per_step=heads_per_step, random_ties=random_ties, tie_tolerance=tie_tolerance, fast=fast,
        precision=precision, evaluator=evaluator, progress=progress,
    )
    return result


def _evaluate_scores(evaluator: Evaluator, gates: torch.Tensor, candidates: Sequence[tuple[int, int]],
                     scores: Sequence[str], top: int) -> dict[str, torch.Tensor]:
    """``{score: (C,)}``: one pass of the evaluator for all scores where it can (``evaluate_many``)."""
    many = getattr(evaluator, "evaluate_many", None)
    if many is not None and len(scores) > 1:
        return many(gates, candidates, scores, top=top)
    return {score: evaluator.evaluate(gates, candidates, score, top=top) for score in scores}


def circuit_prune_criteria(
    adapter: ModelAdapter,
    id_batches: Sequence[Batch],
    ood_batches: Sequence[Batch] | None,
    budget: Budget,
    *,
    scores: Sequence[str] = CIRCUIT_SCORES,
    seeds: Sequence[int | None] | None = None,
    tower: str | None = None,
    heads_per_step: int = 1,
    random_ties: bool = False,
    tie_tolerance: float = 1e-12,
    fast: bool = True,
    precision: str = "fp32",
    evaluator: Evaluator | None = None,
    progress: bool = True,
) -> list[PruneResult]:
    """Hydra (Circ): one greedy circuit search per criterion (member ``m`` maximises ``scores[m]``:
    CircAcc, CircOOD, CircAvg by default) on the same selection data, run in lockstep on one evaluator.

    Each result is exactly what :func:`circuit_prune` gives for that score (a test checks it); the
    searches share work: at every step, searches whose gates are equal (all of them at the first
    step, and for as long as their removals agree) are scored by one pass over the candidates, which
    yields the ID logits and OOD logits that every criterion is computed from
    (``evaluate_many``). ``metadata["shared_evaluations"]`` counts the candidate evaluations a
    member did not pay for itself.

    Args:
        scores: one circuit score per member (:data:`CIRCUIT_SCORES`), repeats allowed.
        seeds: tie-breaking seed per member (``random_ties``); default ``None`` for all.
        Other arguments: as :func:`circuit_prune`.

    Returns:
        One :class:`PruneResult` per entry of ``scores``.
    """
    if not scores:
        raise ValueError("give at least one circuit score")
    for score in scores:
        _check_search_arguments(score, ood_batches, heads_per_step)
    seeds = list(seeds) if seeds is not None else [None] * len(scores)
    if len(seeds) != len(scores):
        raise ValueError(f"give one seed per score: {len(scores)} scores, {len(seeds)} seeds")
    layout = HeadLayout.of(adapter, tower)
    tower = "joint" if layout.joint else layout.names[0]
    searches = [_GreedySearch(layout, budget, score, heads_per_step=heads_per_step, seed=seed, random_ties=random_ties,
                              tie_tolerance=tie_tolerance) for score, seed in zip(scores, seeds)]
    if evaluator is None:
        evaluator = make_evaluator(adapter, id_batches, ood_batches, tower=tower, fast=fast, precision=precision)
    for search in searches:
        search.history.append(evaluator.score_of(search.gates, search.score))
    shared = [0] * len(searches)
    start_time = time.perf_counter()
    desc = f"circuit-{scores[0]}" if len(scores) == 1 else f"circuits {'/'.join(scores)}"
    bar = tqdm(total=sum(s.n_remove for s in searches), desc=desc, disable=not progress)
    while not all(s.done for s in searches):
        groups: dict[bytes, list[int]] = {}  # searches at the same gates take the same candidates
        for i, search in enumerate(searches):
            if not search.done:
                groups.setdefault(search.gates.numpy().tobytes() + bytes([search.take]), []).append(i)
        for members in groups.values():
            lead = searches[members[0]]
            candidates = lead.candidates()
            wanted = list(dict.fromkeys(searches[i].score for i in members))
            values = _evaluate_scores(evaluator, lead.gates, candidates, wanted, lead.take)
            for rank, i in enumerate(members):
                bar.update(searches[i].step(candidates, values[searches[i].score], evaluator))
                if rank:
                    shared[i] += len(candidates)
                if len(searches) == 1:
                    bar.set_postfix(S=f"{searches[i].history[-1]:.4f}")
    bar.close()
    elapsed = time.perf_counter() - start_time
    paid = sum(s.n_evals for s in searches) - sum(shared)
    logger.info("%s: %d evaluations in %.1f s (%.1f / s)%s", desc, paid, elapsed, paid / max(elapsed, 1e-9),
                f"; {sum(shared)} more shared between the searches" if len(searches) > 1 else "")
    if len(searches) == 1:  # one search: circuit_prune's result, as it always was
        return [searches[0].result(tower, elapsed)]
    return [search.result(tower, elapsed, shared_evaluations=shared[i]) for i, search in enumerate(searches)]


def _rank_candidates(s: torch.Tensor, tol: float, generator: torch.Generator | None) -> list[int]:
    """Candidate indices best first; within a tie group (within ``tol`` of its best), index order or random."""
    order = torch.sort(-s, stable=True).indices.tolist()
    if generator is None:
        # stable sort already gives index order inside exact ties; merge near-ties (float rounding)
        out: list[int] = []
        remaining = order
        while remaining:
            best = float(s[remaining[0]])
            group = sorted(i for i in remaining if float(s[i]) >= best - tol)
            out.extend(group)
            remaining = [i for i in remaining if i not in set(group)]
        return out
    out = []
    remaining = order
    while remaining:
        best = float(s[remaining[0]])
        group = [i for i in remaining if float(s[i]) >= best - tol]
        perm = torch.randperm(len(group), generator=generator).tolist()
        out.extend(group[p] for p in perm)
        remaining = [i for i in remaining if i not in set(group)]
    return out


def reference_circuit_ranking(
    model: nn.Module,
    id_batches: Sequence[Batch],
    ood_batches: Sequence[Batch] | None,
    n_remove: int,
    score: str = "avg",
) -> list[tuple[int, int]]:
    """A plain, obviously-correct Algorithm 1 for tests: full model per candidate, the MSP AUROC of
    :func:`hydra_hf.metrics.ood_auroc` (tested against scikit-learn's, ties included).

    Ties: the lowest ``(layer, head)`` wins (first maximum in row-major order).
    """

    adapter = get_adapter(model)
    L, H = adapter.shape(None)
    labels = torch.cat([b["labels"] for b in id_batches])
    model.eval()
    removed: list[tuple[int, int]] = []
    with HeadGates(model, adapter=adapter) as hg, torch.no_grad():

        def s_of(g: torch.Tensor) -> float:
            hg.set(g)
            id_logits = torch.cat([adapter.logits(b) for b in id_batches])
            acc = float((id_logits.argmax(-1) == labels).float().mean())
            if score == "acc":
                return acc
            ood_logits = torch.cat([adapter.logits(b) for b in ood_batches or []])
            ood = ood_auroc(id_logits.softmax(-1).amax(-1).double(), ood_logits.softmax(-1).amax(-1).double())
            return ood if score == "ood" else (acc + ood) / 2

        gates = torch.ones(L, H)
        for _ in range(n_remove):
            best, best_s = None, -math.inf
            for layer in range(L):
                for h in range(H):
                    if gates[layer, h] == 0:
                        continue
                    g = gates.clone()
                    g[layer, h] = 0
                    value = s_of(g)
                    if value > best_s + 1e-12:
                        best, best_s = (layer, h), value
            assert best is not None
            gates[best] = 0
            removed.append(best)
    return removed


def as_metadata(result: PruneResult) -> dict[str, Any]:
    """JSON-ready member metadata: method fields, ``scores`` and the ``ranking``.

    One tower: ``scores`` is ``(L, H)`` and the ranking ``[layer, head]`` pairs; joint (two towers):
    ``scores`` is ``{tower: (L_t, H_t)}`` and the ranking ``[tower, layer, head]`` triples.
    """

    def rows(t: torch.Tensor) -> list[list[float | None]]:
        return [[None if math.isnan(v) else round(float(v), 6) for v in row] for row in t.tolist()]

    scores: Any = (
        {t: rows(v) for t, v in result.scores.items()} if isinstance(result.scores, dict) else rows(result.scores)
    )
    return {**result.metadata, "scores": scores, "ranking": [list(p) for p in result.removal_order]}
