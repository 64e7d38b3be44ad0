"""Strategy 2 — circuit search: greedy head ablation driven by an ID and an OOD validation set.

Paper D.1.2, Algorithm 1. Start with every head on. At each step, temporarily ablate every remaining
head, one at a time, evaluate a score ``S`` of the ablated model, and permanently ablate the head
whose removal gives the *highest* ``S``; repeat until ``B`` heads are removed. Scores:

- ``"acc"`` (CircAcc): accuracy on the labelled ID set;
- ``"ood"`` (CircOOD): AUROC of the maximum softmax probability (MSP), ID = positive, OOD = negative;
- ``"avg"`` (CircAvg): the mean of the two.

Ties are broken by the lower ``(layer, head)`` (or at random with ``random_ties``). The result holds
the gates, the full removal ranking and the score after every step.

Speed (the search costs O(heads x budget) evaluations of the model):

- evaluation runs in ``torch.inference_mode``;
- :class:`CachedBertEvaluator` (BERT-like sequence classifiers) runs the encoder layer by layer from
  cached states: once per step it runs the model with the permanent ablations, caching the hidden
  states entering each layer and each head's context; ablating head ``h`` of layer ``l`` then only
  subtracts that head's cached contribution from layer ``l``'s attention output and re-runs the rest
  of layer ``l`` and the layers above it; all candidate heads of a layer are evaluated in one batched
  forward pass (the candidates are stacked along the batch dimension); in the last layer only the
  [CLS] row, which the classifier reads, is computed;
- text batches are re-bucketed by length, so little padding is computed.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .adapters import ModelAdapter
from .budget import Budget
from .gates import HeadGates
from .taylor import PruneResult

logger = logging.getLogger(__name__)

SCORES = ("acc", "ood", "avg")
Batch = Mapping[str, torch.Tensor]


# ------------------------------------------------------------------------------------- the scores
def auroc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Area under the ROC curve of ``pos`` (positives) against ``neg`` (negatives), ties counted 1/2.

    The Mann–Whitney statistic with average ranks, identical to ``sklearn.metrics.roc_auc_score``.

    Shape:
        pos: ``(P,)``, neg: ``(N,)``.
    """
    if pos.numel() == 0 or neg.numel() == 0:
        raise ValueError(f"AUROC needs positives and negatives, got {pos.numel()} and {neg.numel()}")
    x = torch.cat([pos.double(), neg.double()])
    sorted_x, order = torch.sort(x)
    _, inverse, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    avg_rank = ends - (counts.double() - 1) / 2  # 1-based average rank of each tie group
    ranks = torch.empty_like(x)
    ranks[order] = avg_rank[inverse]
    P, N = pos.numel(), neg.numel()
    return float((ranks[:P].sum() - P * (P + 1) / 2) / (P * N))


def circuit_score(
    id_logits: torch.Tensor, id_labels: torch.Tensor, ood_logits: torch.Tensor | None, score: str
) -> float:
    """The score ``S`` of Algorithm 1.

    Shape:
        id_logits: ``(N_id, C)``; id_labels: ``(N_id,)``; ood_logits: ``(N_ood, C)``.
    """
    if score not in SCORES:
        raise ValueError(f"unknown circuit score {score!r}; choose one of {list(SCORES)}")
    acc = float((id_logits.argmax(-1) == id_labels).double().mean()) if score in ("acc", "avg") else 0.0
    if score == "acc":
        return acc
    if ood_logits is None:
        raise ValueError(f"the circuit score {score!r} needs OOD data (--ood-data)")
    msp_id = id_logits.double().softmax(-1).amax(-1)
    msp_ood = ood_logits.double().softmax(-1).amax(-1)
    ood = auroc(msp_id, msp_ood)
    return ood if score == "ood" else (acc + ood) / 2


# ------------------------------------------------------------------------------------ batch tools
def rebucket_text_batches(batches: Sequence[Batch], batch_size: int = 64) -> list[dict[str, torch.Tensor]]:
    """Regroup tokenized text batches into length-sorted buckets (little padding, same examples).

    Every key of the batches must hold one row per example; ``input_ids``-like ``(B, T)`` tensors are
    re-padded with 0 (the attention mask is 0 there, so the pad id does not matter) and cut to the
    longest example of each new bucket. Non-text batches are returned unchanged.
    """
    if not batches or "attention_mask" not in batches[0]:
        return [dict(b) for b in batches]
    rows: list[dict[str, torch.Tensor]] = []
    for batch in batches:
        lengths = batch["attention_mask"].sum(-1)
        for i in range(batch["attention_mask"].shape[0]):
            n = int(lengths[i])
            rows.append({k: (v[i, :n] if v.dim() == 2 else v[i]) for k, v in batch.items()})
    rows.sort(key=lambda r: int(r["attention_mask"].shape[0]))
    out = []
    for start in range(0, len(rows), batch_size):
        group = rows[start : start + batch_size]
        T = max(int(r["attention_mask"].shape[0]) for r in group)
        bucket = {}
        for key in group[0]:
            if group[0][key].dim() == 1 and key != "labels":
                padded = torch.zeros(len(group), T, dtype=group[0][key].dtype)
                for i, r in enumerate(group):
                    padded[i, : r[key].shape[0]] = r[key]
                bucket[key] = padded
            else:
                bucket[key] = torch.stack([r[key] for r in group])
        out.append(bucket)
    return out


def _labels(batches: Sequence[Batch]) -> torch.Tensor:
    if any("labels" not in b for b in batches):
        raise ValueError("circuit search needs labelled ID data (a 'labels' key in every batch; --label-column)")
    return torch.cat([b["labels"] for b in batches])


# -------------------------------------------------------------------------------------- evaluators
class GatedEvaluator:
    """Scores candidate ablations by re-running the full model with :class:`HeadGates` (plain path).

    Works for every architecture the adapters support.
    """

    def __init__(self, adapter: ModelAdapter, id_batches: Sequence[Batch], ood_batches: Sequence[Batch] | None, *, tower: str | None = None) -> None:
        self.adapter = adapter
        self.tower = adapter.resolve_tower(tower)
        self.id_batches = list(id_batches)
        self.ood_batches = list(ood_batches) if ood_batches is not None else None
        self.id_labels = _labels(self.id_batches)

    @torch.inference_mode()
    def _logits(self, hg: HeadGates, gates: torch.Tensor, batches: Sequence[Batch]) -> torch.Tensor:
        hg.set(gates, tower=self.tower)
        return torch.cat([self.adapter.logits(b).float().cpu() for b in batches])

    def evaluate(self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], score: str) -> torch.Tensor:
        """Score of the model with ``gates`` and, in turn, each candidate head also off. Shape ``(C,)``."""
        model = self.adapter.model
        was_training = model.training
        model.eval()
        out = torch.empty(len(candidates), dtype=torch.float64)
        try:
            with HeadGates(model, adapter=self.adapter) as hg:
                for i, (layer, head) in enumerate(candidates):
                    g = gates.clone()
                    g[layer, head] = 0.0
                    id_logits = self._logits(hg, g, self.id_batches)
                    ood_logits = self._logits(hg, g, self.ood_batches) if score != "acc" else None
                    out[i] = circuit_score(id_logits, self.id_labels, ood_logits, score)
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


def supports_cached_bert(model: nn.Module) -> bool:
    """True for BERT sequence classifiers the cached evaluator can run (post-LN encoder, CLS pooler)."""
    from transformers import BertForSequenceClassification

    return (
        isinstance(model, BertForSequenceClassification)
        and model.bert.pooler is not None
        and not model.config.is_decoder
        and getattr(model.config, "position_embedding_type", "absolute") == "absolute"
    )


@dataclass
class _Bucket:
    hidden: torch.Tensor  # (B, T, d) embeddings
    mask: torch.Tensor  # (B, 1, 1, T) additive attention mask
    labels: torch.Tensor | None  # (B,)


class CachedBertEvaluator:
    """Fast, batched candidate scoring for ``BertForSequenceClassification`` (see the module docstring).

    Args:
        adapter: adapter of a model for which :func:`supports_cached_bert` is true.
        id_batches / ood_batches: tokenized batches (re-bucketed by length here).
        max_rows: about this many (candidate x example x token) rows per forward chunk (CPU GEMMs run
            fastest around a few thousand rows; also caps memory).
        bf16: run the candidate passes under ``torch.autocast(dtype=bfloat16)`` (several times faster
            on CPUs with AMX/AVX512-BF16 and on GPUs). An approximation: scores carry bf16 rounding, so
            near-tied candidates may be ordered differently than in fp32. Off by default.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        id_batches: Sequence[Batch],
        ood_batches: Sequence[Batch] | None,
        *,
        bucket_size: int = 32,
        max_rows: int = 4096,
        bf16: bool = False,
    ) -> None:
        model = adapter.model
        if not supports_cached_bert(model):
            raise TypeError(f"CachedBertEvaluator needs a BertForSequenceClassification, got {type(model).__name__}")
        self.adapter = adapter
        self.model = model
        self.bert = model.bert
        self.layers = list(model.bert.encoder.layer)
        att = self.layers[0].attention.self
        self.H, self.dk = att.num_attention_heads, att.attention_head_size
        self.max_rows = max_rows
        self.bf16 = bf16
        self.id_labels = _labels(id_batches)
        self.id_buckets = self._prepare(rebucket_text_batches(list(id_batches), bucket_size))
        self.ood_buckets = (
            self._prepare(rebucket_text_batches(list(ood_batches), bucket_size)) if ood_batches is not None else None
        )
        # the buckets reorder examples: keep the labels in bucket order
        self.id_labels = torch.cat([b.labels for b in self.id_buckets])  # type: ignore[misc]

    @torch.inference_mode()
    def _prepare(self, batches: list[dict[str, torch.Tensor]]) -> list[_Bucket]:
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()  # embeddings without dropout
        out = []
        for b in batches:
            ids = b["input_ids"].to(device)
            tt = b.get("token_type_ids")
            emb = self.bert.embeddings(input_ids=ids, token_type_ids=tt.to(device) if tt is not None else None)
            am = b["attention_mask"].to(device)
            mask = torch.zeros(am.shape, dtype=emb.dtype, device=device)
            mask = mask.masked_fill(am == 0, torch.finfo(emb.dtype).min)[:, None, None, :]  # (B, 1, 1, T)
            out.append(_Bucket(emb, mask, b["labels"].to(device) if "labels" in b else None))
        self.model.train(was_training)
        return out

    # -------------------------------------------------------------------- functional BERT layer
    def _attention_context(self, layer: nn.Module, x: torch.Tensor, mask: torch.Tensor, cls_only: bool) -> torch.Tensor:
        """Per-head attention context before W_O. Shape: ``(B, Tq, H, dk)``."""
        att = layer.attention.self
        B, T, _ = x.shape
        q_in = x[:, :1] if cls_only else x
        q = att.query(q_in).view(B, q_in.shape[1], self.H, self.dk).transpose(1, 2)  # (B, H, Tq, dk)
        k = att.key(x).view(B, T, self.H, self.dk).transpose(1, 2)  # (B, H, T, dk)
        v = att.value(x).view(B, T, self.H, self.dk).transpose(1, 2)  # (B, H, T, dk)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=att.scaling)  # (B, H, Tq, dk)
        return ctx.transpose(1, 2)  # (B, Tq, H, dk)

    def _finish_layer(self, layer: nn.Module, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """LayerNorm(attn_out + residual), then the feed-forward block. Shape: like ``residual``."""
        y = layer.attention.output.LayerNorm(attn_out + residual)
        return layer.output(layer.intermediate(y), y)

    def _project(self, layer: nn.Module, ctx: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """W_O applied to the gated per-head context. ``ctx (B, T, H, dk)`` -> ``(B, T, d)``."""
        if not bool((gate == 1).all()):
            ctx = ctx * gate.view(1, 1, self.H, 1).to(ctx.dtype)
        return layer.attention.output.dense(ctx.reshape(*ctx.shape[:2], self.H * self.dk))

    def _run_layer(self, index: int, x: torch.Tensor, mask: torch.Tensor, gate: torch.Tensor, cls_only: bool) -> torch.Tensor:
        layer = self.layers[index]
        ctx = self._attention_context(layer, x, mask, cls_only)
        residual = x[:, :1] if cls_only else x
        return self._finish_layer(layer, self._project(layer, ctx, gate), residual)

    def _logits_from_last(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        """``cls_hidden (N, 1, d)`` -> logits ``(N, C)``."""
        pooled = self.bert.pooler(cls_hidden)
        return self.model.classifier(self.model.dropout(pooled))

    def _run_from(self, start: int, x: torch.Tensor, mask: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """Run layers ``start..L-1`` (the last one on the [CLS] row only) and the head. -> ``(N, C)``."""
        L = len(self.layers)
        if start == L:
            return self._logits_from_last(x[:, :1])
        for index in range(start, L):
            x = self._run_layer(index, x, mask, gates[index], cls_only=index == L - 1)
        return self._logits_from_last(x)

    # ------------------------------------------------------------------------------- scoring
    @torch.inference_mode()
    def _candidate_logits(self, buckets: list[_Bucket], gates: torch.Tensor, candidates: Sequence[tuple[int, int]]) -> torch.Tensor:
        """Logits of every candidate ablation. Shape: ``(C, N, classes)`` (N in bucket order)."""
        device_type = buckets[0].hidden.device.type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.bf16):
            return self._candidate_logits_impl(buckets, gates, candidates)

    def _candidate_logits_impl(
        self, buckets: list[_Bucket], gates: torch.Tensor, candidates: Sequence[tuple[int, int]]
    ) -> torch.Tensor:
        L = len(self.layers)
        device = buckets[0].hidden.device
        gates = gates.to(device)
        by_layer: dict[int, list[int]] = {}
        for i, (layer, _) in enumerate(candidates):
            by_layer.setdefault(layer, []).append(i)
        per_bucket: list[torch.Tensor] = []
        for bucket in buckets:
            B, T, d = bucket.hidden.shape
            result: torch.Tensor | None = None
            # one pass with the permanent ablations, caching each layer's input and per-head context
            x = bucket.hidden
            inputs, contexts, attn_outs = [], [], []
            for index in range(L):
                layer = self.layers[index]
                ctx = self._attention_context(layer, x, bucket.mask, cls_only=False)  # (B, T, H, dk)
                attn = self._project(layer, ctx, gates[index])  # (B, T, d)
                inputs.append(x)
                contexts.append(ctx)
                attn_outs.append(attn)
                if index < L - 1:
                    x = self._finish_layer(layer, attn, x)
            for index, cand_ids in by_layer.items():
                layer = self.layers[index]
                heads = torch.tensor([candidates[i][1] for i in cand_ids], device=device)
                w_o = layer.attention.output.dense.weight.view(d, self.H, self.dk)  # (d, H, dk)
                cls_only = index == L - 1
                ctx = contexts[index][:, :1] if cls_only else contexts[index]  # (B, Tq, H, dk)
                chunk = max(1, self.max_rows // max(1, B * ctx.shape[1]))
                for start in range(0, len(cand_ids), chunk):
                    hs = heads[start : start + chunk]
                    C = len(hs)
                    # contribution of each candidate head: ctx_h @ W_O[:, h]^T, scaled by its current gate
                    contrib = torch.einsum("bthk,dhk->hbtd", ctx[:, :, hs], w_o[:, hs])  # (C, B, Tq, d)
                    contrib = contrib * gates[index, hs].view(C, 1, 1, 1).to(contrib.dtype)
                    Tq = ctx.shape[1]
                    # attention output + residual, then LayerNorm and the feed-forward block (as _finish_layer)
                    pre = (attn_outs[index][:, :Tq] + inputs[index][:, :Tq]).unsqueeze(0) - contrib  # (C, B, Tq, d)
                    y = layer.attention.output.LayerNorm(pre.reshape(C * B, Tq, d))
                    y = layer.output(layer.intermediate(y), y)  # (C*B, Tq, d)
                    mask = bucket.mask.repeat(C, 1, 1, 1)  # (C*B, 1, 1, T)
                    logits = self._run_from(index + 1, y, mask, gates)  # (C*B, classes)
                    logits = logits.view(C, B, -1).float()
                    if result is None:
                        result = torch.empty(len(candidates), B, logits.shape[-1], device=device)
                    result[torch.tensor(cand_ids[start : start + chunk], device=device)] = logits
            per_bucket.append(result if result is not None else torch.empty(0, B, 0, device=device))
        return torch.cat(per_bucket, dim=1).cpu()

    def evaluate(self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], score: str) -> torch.Tensor:
        """Score of the model with ``gates`` and, in turn, each candidate head also off. Shape ``(C,)``."""
        if score != "acc" and not self.ood_buckets:
            raise ValueError(f"the circuit score {score!r} needs OOD data (--ood-data)")
        was_training = self.model.training
        self.model.eval()
        try:
            id_logits = self._candidate_logits(self.id_buckets, gates, candidates)  # (C, N_id, classes)
            ood_logits = (
                self._candidate_logits(self.ood_buckets, gates, candidates) if score != "acc" else None
            )
        finally:
            self.model.train(was_training)
        return torch.tensor(
            [
                circuit_score(id_logits[i], self.id_labels, ood_logits[i] if ood_logits is not None else None, score)
                for i in range(len(candidates))
            ],
            dtype=torch.float64,
        )

    @torch.inference_mode()
    def _full_logits(self, buckets: list[_Bucket], gates: torch.Tensor) -> torch.Tensor:
        return torch.cat([self._run_from(0, b.hidden, b.mask, gates.to(b.hidden.device)) for b in buckets]).float().cpu()

    def score_of(self, gates: torch.Tensor, score: str) -> float:
        """Score of the model with ``gates`` (no extra ablation)."""
        was_training = self.model.training
        self.model.eval()
        try:
            id_logits = self._full_logits(self.id_buckets, gates)
            ood_logits = self._full_logits(self.ood_buckets, gates) if score != "acc" and self.ood_buckets else None
        finally:
            self.model.train(was_training)
        return circuit_score(id_logits, self.id_labels, ood_logits, score)


# ---------------------------------------------------------------------------------------- search
def make_evaluator(
    adapter: ModelAdapter,
    id_batches: Sequence[Batch],
    ood_batches: Sequence[Batch] | None,
    *,
    tower: str | None = None,
    fast: bool = True,
    bf16: bool = False,
) -> GatedEvaluator | CachedBertEvaluator:
    """The fastest evaluator available for the model (``fast=False``: always the plain one).

    ``bf16`` (cached evaluator only) trades exactness for speed; see :class:`CachedBertEvaluator`.
    """
    if fast and adapter.kind == "hf_bert" and supports_cached_bert(adapter.model):
        return CachedBertEvaluator(adapter, id_batches, ood_batches, bf16=bf16)
    if fast:
        logger.info("no cached circuit evaluator for %s; re-running the full model per candidate", type(adapter.model).__name__)
    return GatedEvaluator(adapter, id_batches, ood_batches, tower=tower)


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
    evaluator: GatedEvaluator | CachedBertEvaluator | None = None,
    progress: bool = True,
) -> PruneResult:
    """Greedy circuit search (Algorithm 1) for one member.

    Args:
        adapter: the model's adapter (a classifier: logits ``(B, C)``).
        id_batches: labelled ID validation batches.
        ood_batches: OOD validation batches (needed for ``score`` ``"ood"`` / ``"avg"``).
        budget: ``Budget(remove=N)`` removes ``N`` heads anywhere; ``Budget(heads_per_layer=K)``
            removes ``L*(H-K)`` heads, never taking a layer below ``K`` heads.
        score: ``"acc"``, ``"ood"`` or ``"avg"``.
        heads_per_step: ``k`` heads removed per step (``1`` = the exact greedy; ``> 1`` is the
            documented approximation of the module docstring).
        seed / random_ties: with ``random_ties``, tied best candidates are chosen at random (seeded);
            otherwise the lowest ``(layer, head)`` wins.
        tie_tolerance: scores within this of the best count as tied.
        fast: use the cached evaluator when the architecture has one.

    Returns:
        :class:`PruneResult`; ``scores[l, h]`` = ``S`` right after head ``(l, h)`` was removed (NaN
        for kept heads), ``removal_order`` = the ranking (first removed = least useful),
        ``metadata["score_history"]`` = ``S`` after each step (index 0: the unpruned model).
    """
    if score not in SCORES:
        raise ValueError(f"unknown circuit score {score!r}; choose one of {list(SCORES)}")
    if score != "acc" and not ood_batches:
        raise ValueError(f"circuit-{score} needs OOD validation data; give --ood-data")
    if heads_per_step < 1:
        raise ValueError(f"heads_per_step must be >= 1, got {heads_per_step}")
    tower = adapter.resolve_tower(tower)
    L, H = adapter.shape(tower)
    n_remove = budget.num_removed(L, H)
    min_keep = budget.min_kept_per_layer()
    if evaluator is None:
        evaluator = make_evaluator(adapter, id_batches, ood_batches, tower=tower, fast=fast)
    generator = torch.Generator().manual_seed(seed if seed is not None else 0)
    gates = torch.ones(L, H)
    scores = torch.full((L, H), float("nan"))
    removal: list[tuple[int, int]] = []
    history = [evaluator.score_of(gates, score)]
    n_evals = 0
    start_time = time.perf_counter()
    bar = tqdm(total=n_remove, desc=f"circuit-{score}", disable=not progress)
    while len(removal) < n_remove:
        kept_per_layer = gates.sum(dim=1)
        candidates = [
            (layer, h) for layer in range(L) if kept_per_layer[layer] > min_keep for h in range(H) if gates[layer, h] > 0.5
        ]
        if not candidates:  # cannot happen with a checked budget; guard against an endless loop
            raise RuntimeError("no candidate head left to remove")
        s = evaluator.evaluate(gates, candidates, score)  # (C,)
        n_evals += len(candidates)
        take = min(heads_per_step, n_remove - len(removal))
        chosen: list[int] = []
        order = _rank_candidates(s, tie_tolerance, generator if random_ties else None)
        per_layer_left = {layer: int(kept_per_layer[layer]) for layer in range(L)}
        for i in order:
            layer, h = candidates[i]
            if per_layer_left[layer] <= min_keep:
                continue
            chosen.append(i)
            per_layer_left[layer] -= 1
            if len(chosen) == take:
                break
        for i in chosen:
            layer, h = candidates[i]
            gates[layer, h] = 0.0
            scores[layer, h] = float(s[i])
            removal.append((layer, h))
        history.append(float(s[chosen[0]]) if take == 1 else evaluator.score_of(gates, score))
        bar.update(len(chosen))
        bar.set_postfix(S=f"{history[-1]:.4f}")
    bar.close()
    elapsed = time.perf_counter() - start_time
    logger.info("circuit-%s: %d evaluations in %.1f s (%.1f / s)", score, n_evals, elapsed, n_evals / max(elapsed, 1e-9))
    return PruneResult(
        gates=gates,
        scores=scores,
        removal_order=removal,
        metadata={
            "method": f"circuit-{score}",
            "score": score,
            "seed": seed,
            "heads_per_step": heads_per_step,
            "tower": tower,
            "score_history": history,
            "evaluations": n_evals,
            "seconds": round(elapsed, 3),
        },
    )


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
    """A plain, obviously-correct Algorithm 1 for tests: full model per candidate, sklearn AUROC.

    Ties: the lowest ``(layer, head)`` wins (first maximum in row-major order).
    """
    from sklearn.metrics import roc_auc_score

    from .adapters import get_adapter

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
            msp = torch.cat([id_logits.softmax(-1).amax(-1), ood_logits.softmax(-1).amax(-1)]).double().numpy()
            y = [1] * len(id_logits) + [0] * len(ood_logits)
            ood = float(roc_auc_score(y, msp))
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
    """JSON-ready member metadata: method fields, ``scores`` ``(L, H)`` and the ``ranking``."""
    scores = [[None if math.isnan(v) else round(float(v), 6) for v in row] for row in result.scores.tolist()]
    return {**result.metadata, "scores": scores, "ranking": [list(p) for p in result.removal_order]}
