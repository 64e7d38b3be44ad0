"""The cached, batched circuit evaluator for BERT sequence classifiers (the fast path of Algorithm 1).

:func:`hydra_hf.pruning.circuits.make_evaluator` picks :class:`CachedBertEvaluator` for
``BertForSequenceClassification`` models; every other architecture uses the plain
:class:`~hydra_hf.pruning.circuits.GatedEvaluator`. See :mod:`hydra_hf.pruning.circuits` for how
the search uses an evaluator and the module docstring there for the speed techniques.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertForSequenceClassification

from ..families.adapters import ModelAdapter
from .scoring import Batch, batch_labels, circuit_score


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


def supports_cached_bert(model: nn.Module) -> bool:
    """True for BERT sequence classifiers the cached evaluator can run (post-LN encoder, CLS pooler)."""
    return (
        isinstance(model, BertForSequenceClassification)
        and model.bert.pooler is not None
        and not model.config.is_decoder
        and getattr(model.config, "position_embedding_type", "absolute") == "absolute"
    )


PRECISIONS = ("fp32", "bf16", "screened")


@dataclass
class _Bucket:
    hidden: torch.Tensor  # (B, T, d) embeddings, fp32
    mask: torch.Tensor  # (B, 1, 1, T) additive attention mask, fp32
    labels: torch.Tensor | None  # (B,)
    low: tuple[torch.Tensor, torch.Tensor] | None = None  # hidden and mask in the screening dtype


@dataclass
class _LayerWeights:
    """One BERT layer's weights as plain tensors (Q, K and V fused into one projection)."""

    qkv_w: torch.Tensor  # (3 * H * dk, d)
    qkv_b: torch.Tensor  # (3 * H * dk,)
    o_w: torch.Tensor  # (d, H * dk)
    o_b: torch.Tensor  # (d,)
    ln1: tuple[torch.Tensor, torch.Tensor, float]  # weight, bias, eps
    i_w: torch.Tensor  # (d_ff, d)
    i_b: torch.Tensor  # (d_ff,)
    out_w: torch.Tensor  # (d, d_ff)
    out_b: torch.Tensor  # (d,)
    ln2: tuple[torch.Tensor, torch.Tensor, float]
    act: Callable[[torch.Tensor], torch.Tensor]

    @classmethod
    def of(cls, layer: nn.Module) -> _LayerWeights:
        att, out = layer.attention.self, layer.attention.output
        return cls(
            qkv_w=torch.cat([att.query.weight, att.key.weight, att.value.weight]).detach(),
            qkv_b=torch.cat([att.query.bias, att.key.bias, att.value.bias]).detach(),
            o_w=out.dense.weight.detach(),
            o_b=out.dense.bias.detach(),
            ln1=(out.LayerNorm.weight.detach(), out.LayerNorm.bias.detach(), out.LayerNorm.eps),
            i_w=layer.intermediate.dense.weight.detach(),
            i_b=layer.intermediate.dense.bias.detach(),
            out_w=layer.output.dense.weight.detach(),
            out_b=layer.output.dense.bias.detach(),
            ln2=(
                layer.output.LayerNorm.weight.detach(),
                layer.output.LayerNorm.bias.detach(),
                layer.output.LayerNorm.eps,
            ),
            act=layer.intermediate.intermediate_act_fn,
        )

    def to(self, dtype: torch.dtype) -> _LayerWeights:
        cast = {k: v.to(dtype) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return _LayerWeights(
            **cast,
            ln1=(self.ln1[0].to(dtype), self.ln1[1].to(dtype), self.ln1[2]),
            ln2=(self.ln2[0].to(dtype), self.ln2[1].to(dtype), self.ln2[2]),
            act=self.act,
        )


class CachedBertEvaluator:
    """Fast, batched candidate scoring for ``BertForSequenceClassification`` (see the module docstring).

    Args:
        adapter: adapter of a model for which :func:`supports_cached_bert` is true.
        id_batches / ood_batches: tokenized batches (re-bucketed by length here).
        bucket_size: examples per length bucket (smaller: less padding, more, smaller GEMMs).
        max_rows: about this many (candidate x example x token) rows per forward chunk (CPU GEMMs run
            fastest around a few thousand rows; also caps memory).
        precision: how candidates are scored (:data:`PRECISIONS`):

            - ``"fp32"`` (default): every candidate in float32 — the exact greedy;
            - ``"bf16"``: every candidate in bfloat16 (several times faster GEMMs on CPUs with
              AMX/AVX512-BF16 and on GPUs). An approximation: scores carry bf16 rounding, so
              near-tied candidates may be ordered differently than in fp32;
            - ``"screened"``: every candidate is first scored in bf16; then every candidate whose bf16
              score is within ``margin`` of the best float32-confirmed score is re-scored in float32,
              until no unconfirmed candidate is left within ``margin`` of the best confirmed one (with
              ``evaluate(..., top=k)``: of the k-th best). The best candidate (the k best) is therefore
              chosen on float32 scores, and equals the ``"fp32"`` choice whenever no bf16 score is off
              by more than ``margin``. ``margin`` adapts: it is at least
              ``safety`` times the largest bf16 error seen so far on confirmed candidates. Scores of
              unconfirmed candidates stay bf16 (all more than ``margin`` below the best). It saves
              time only when few candidates are near-tied: on MiniLM with a trained head (the
              circuit benchmark) 59 % were re-scored and the search took as long as ``"fp32"``.
        margin: smallest screening margin in units of ``S`` (``"screened"`` only).
        safety: the margin is at least ``safety`` x the largest observed bf16 error.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        id_batches: Sequence[Batch],
        ood_batches: Sequence[Batch] | None,
        *,
        bucket_size: int = 16,
        max_rows: int = 4096,
        precision: str = "fp32",
        margin: float = 0.01,
        safety: float = 2.0,
    ) -> None:
        model = adapter.model
        if not supports_cached_bert(model):
            raise TypeError(f"CachedBertEvaluator needs a BertForSequenceClassification, got {type(model).__name__}")
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {list(PRECISIONS)}")
        if margin < 0 or safety < 1:
            raise ValueError(f"screening needs margin >= 0 and safety >= 1, got margin={margin}, safety={safety}")
        self.adapter = adapter
        self.model = model
        self.bert = model.bert
        layers = list(model.bert.encoder.layer)
        att = layers[0].attention.self
        self.H, self.dk = att.num_attention_heads, att.attention_head_size
        self.scaling = self.dk**-0.5
        self.max_rows = max_rows
        self.precision = precision
        self.margin, self.safety = margin, safety
        self.max_error = 0.0  # largest |S_bf16 - S_fp32| seen on confirmed candidates
        self.stats = {"screened": 0, "confirmed": 0}
        self.low_dtype = torch.bfloat16
        self.weights = {torch.float32: [_LayerWeights.of(layer) for layer in layers]}
        if precision != "fp32":
            self.weights[self.low_dtype] = [w.to(self.low_dtype) for w in self.weights[torch.float32]]
        self.id_buckets = self._prepare(rebucket_text_batches(list(id_batches), bucket_size))
        self.ood_buckets = (
            self._prepare(rebucket_text_batches(list(ood_batches), bucket_size)) if ood_batches is not None else None
        )
        # the buckets reorder examples: keep the labels in bucket order
        batch_labels(id_batches)  # clear error when labels are missing
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
            bucket = _Bucket(emb, mask, b["labels"].to(device) if "labels" in b else None)
            if self.precision != "fp32":
                low_mask = torch.zeros(am.shape, dtype=self.low_dtype, device=device)
                low_mask = low_mask.masked_fill(am == 0, torch.finfo(self.low_dtype).min)[:, None, None, :]
                bucket.low = (emb.to(self.low_dtype), low_mask)
            out.append(bucket)
        self.model.train(was_training)
        return out

    # -------------------------------------------------------------------- functional BERT layer
    def _attention_context(
        self, w: _LayerWeights, x: torch.Tensor, mask: torch.Tensor, cls_only: bool
    ) -> torch.Tensor:
        """Per-head attention context before W_O. Shape: ``(B, Tq, H, dk)``."""
        B, T, _ = x.shape
        hd = self.H * self.dk
        if cls_only:  # the classifier reads [CLS] only: one query row, keys and values of every token
            # x[:, 0] (2-D, strided rows) keeps this one GEMM; a strided 3-D x[:, :1] would make F.linear
            # broadcast the weight into a (B, d, d) batched product
            q = F.linear(x[:, 0], w.qkv_w[:hd], w.qkv_b[:hd]).view(B, 1, self.H, self.dk)  # (B, 1, H, dk)
            kv = F.linear(x, w.qkv_w[hd:], w.qkv_b[hd:]).view(B, T, 2, self.H, self.dk)  # (B, T, 2, H, dk)
            k, v = kv.unbind(2)  # (B, T, H, dk)
        else:
            qkv = F.linear(x, w.qkv_w, w.qkv_b).view(B, T, 3, self.H, self.dk)  # (B, T, 3, H, dk)
            q, k, v = qkv.unbind(2)  # (B, T, H, dk)
        ctx = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=self.scaling
        )  # (B, H, Tq, dk)
        return ctx.transpose(1, 2)  # (B, Tq, H, dk)

    @staticmethod
    def _finish_layer(w: _LayerWeights, pre: torch.Tensor) -> torch.Tensor:
        """``pre`` = attention output + residual; LayerNorm, then the feed-forward block. Shape: like ``pre``."""
        d = pre.shape[-1]
        y = F.layer_norm(pre, (d,), *w.ln1)
        h = w.act(F.linear(y, w.i_w, w.i_b))  # (..., d_ff)
        return F.layer_norm(F.linear(h, w.out_w, w.out_b) + y, (d,), *w.ln2)

    def _project(self, w: _LayerWeights, ctx: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """W_O applied to the gated per-head context. ``ctx (B, T, H, dk)`` -> ``(B, T, d)``."""
        if not bool((gate == 1).all()):
            ctx = ctx * gate.view(1, 1, self.H, 1).to(ctx.dtype)
        return F.linear(ctx.reshape(*ctx.shape[:2], self.H * self.dk), w.o_w, w.o_b)

    def _run_layer(
        self, w: _LayerWeights, x: torch.Tensor, mask: torch.Tensor, gate: torch.Tensor, cls_only: bool
    ) -> torch.Tensor:
        ctx = self._attention_context(w, x, mask, cls_only)
        residual = x[:, :1] if cls_only else x
        return self._finish_layer(w, self._project(w, ctx, gate) + residual)

    def _logits_from_last(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        """``cls_hidden (N, 1, d)`` -> logits ``(N, C)`` (pooler and classifier in float32)."""
        pooled = self.bert.pooler(cls_hidden.float())
        return self.model.classifier(self.model.dropout(pooled))

    def _run_from(
        self, weights: list[_LayerWeights], start: int, x: torch.Tensor, mask: torch.Tensor, gates: torch.Tensor
    ) -> torch.Tensor:
        """Run layers ``start..L-1`` (the last one on the [CLS] row only) and the head. -> ``(N, C)``."""
        L = len(weights)
        if start == L:
            return self._logits_from_last(x[:, :1])
        for index in range(start, L):
            x = self._run_layer(weights[index], x, mask, gates[index], cls_only=index == L - 1)
        return self._logits_from_last(x)

    # ------------------------------------------------------------------------------- scoring
    @torch.inference_mode()
    def _candidate_logits(
        self, buckets: list[_Bucket], gates: torch.Tensor, candidates: Sequence[tuple[int, int]], low: bool
    ) -> torch.Tensor:
        """Logits of every candidate ablation. Shape: ``(C, N, classes)`` (N in bucket order), float32."""
        weights = self.weights[self.low_dtype if low else torch.float32]
        L = len(weights)
        device = buckets[0].hidden.device
        gates = gates.to(device)
        by_layer: dict[int, list[int]] = {}
        for i, (layer, _) in enumerate(candidates):
            by_layer.setdefault(layer, []).append(i)
        per_bucket: list[torch.Tensor] = []
        for bucket in buckets:
            hidden, bucket_mask = bucket.low if low else (bucket.hidden, bucket.mask)  # type: ignore[misc]
            B, T, d = hidden.shape
            result: torch.Tensor | None = None
            # one pass with the permanent ablations, caching each layer's input and per-head context
            x = hidden
            inputs, contexts, attn_outs = [], [], []
            for index in range(L):
                ctx = self._attention_context(weights[index], x, bucket_mask, cls_only=False)  # (B, T, H, dk)
                attn = self._project(weights[index], ctx, gates[index])  # (B, T, d)
                inputs.append(x)
                contexts.append(ctx)
                attn_outs.append(attn)
                if index < L - 1:
                    x = self._finish_layer(weights[index], attn + x)
            for index, cand_ids in by_layer.items():
                w = weights[index]
                heads = torch.tensor([candidates[i][1] for i in cand_ids], device=device)
                w_o = w.o_w.view(d, self.H, self.dk)  # (d, H, dk)
                cls_only = index == L - 1
                ctx = contexts[index][:, :1] if cls_only else contexts[index]  # (B, Tq, H, dk)
                Tq = ctx.shape[1]
                base = (attn_outs[index][:, :Tq] + inputs[index][:, :Tq]).unsqueeze(0)  # (1, B, Tq, d)
                # contribution of each candidate head: ctx_h @ W_O[:, h]^T, scaled by its current gate
                head_out = torch.einsum("bthk,dhk->hbtd", ctx[:, :, heads], w_o[:, heads])  # (C_l, B, Tq, d)
                head_out = head_out * gates[index, heads].view(-1, 1, 1, 1).to(head_out.dtype)
                chunk = max(1, self.max_rows // max(1, B * Tq))
                for start in range(0, len(cand_ids), chunk):
                    contrib = head_out[start : start + chunk]  # (C, B, Tq, d)
                    C = contrib.shape[0]
                    # attention output + residual without the head, then LayerNorm and the feed-forward block
                    y = self._finish_layer(w, (base - contrib).reshape(C * B, Tq, d))  # (C*B, Tq, d)
                    mask = bucket_mask.repeat(C, 1, 1, 1)  # (C*B, 1, 1, T)
                    logits = self._run_from(weights, index + 1, y, mask, gates)  # (C*B, classes)
                    logits = logits.view(C, B, -1).float()
                    if result is None:
                        result = torch.empty(len(candidates), B, logits.shape[-1], device=device)
                    result[torch.tensor(cand_ids[start : start + chunk], device=device)] = logits
            per_bucket.append(result if result is not None else torch.empty(0, B, 0, device=device))
        return torch.cat(per_bucket, dim=1).cpu()

    def _scores(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], score: str, low: bool
    ) -> torch.Tensor:
        return self._scores_many(gates, candidates, (score,), low)[score]

    def _scores_many(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], scores: Sequence[str], low: bool
    ) -> dict[str, torch.Tensor]:
        """``{score: (C,)}`` from one pass of candidate logits (the OOD pass only if a score needs it)."""
        id_logits = self._candidate_logits(self.id_buckets, gates, candidates, low)  # (C, N_id, classes)
        needs_ood = any(score != "acc" for score in scores)
        ood_logits = self._candidate_logits(self.ood_buckets, gates, candidates, low) if needs_ood else None  # type: ignore[arg-type]
        return {
            score: torch.tensor(
                [
                    circuit_score(
                        id_logits[i], self.id_labels, ood_logits[i] if ood_logits is not None else None, score
                    )
                    for i in range(len(candidates))
                ],
                dtype=torch.float64,
            )
            for score in scores
        }

    def evaluate_many(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], scores: Sequence[str], *, top: int = 1
    ) -> dict[str, torch.Tensor]:
        """:meth:`evaluate` for several scores at once: one pass of candidate logits serves them all
        (``"screened"`` precision scores each in turn, since its float32 confirmations depend on the score)."""
        if self.precision == "screened" or not candidates:
            return {score: self.evaluate(gates, candidates, score, top=top) for score in scores}
        if any(score != "acc" for score in scores) and not self.ood_buckets:
            raise ValueError("the circuit scores 'ood' and 'avg' need OOD data (--ood-data)")
        was_training = self.model.training
        self.model.eval()
        try:
            return self._scores_many(gates, candidates, scores, low=self.precision == "bf16")
        finally:
            self.model.train(was_training)

    def evaluate(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], score: str, *, top: int = 1
    ) -> torch.Tensor:
        """Score of the model with ``gates`` and, in turn, each candidate head also off. Shape ``(C,)``.

        ``top`` (``"screened"``): the caller takes the ``top`` best candidates; they are confirmed in
        float32 (see the class docstring).
        """
        if score != "acc" and not self.ood_buckets:
            raise ValueError(f"the circuit score {score!r} needs OOD data (--ood-data)")
        if not candidates:
            return torch.empty(0, dtype=torch.float64)
        was_training = self.model.training
        self.model.eval()
        try:
            if self.precision != "screened":
                return self._scores(gates, candidates, score, low=self.precision == "bf16")
            return self._screened_scores(gates, candidates, score, top)
        finally:
            self.model.train(was_training)

    def _screened_scores(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], score: str, top: int
    ) -> torch.Tensor:
        """bf16 scores for all, float32 for every candidate near the ``top`` best (see the class docstring)."""
        low = self._scores(gates, candidates, score, low=True)  # (C,)
        out = low.clone()
        confirmed = torch.zeros(len(candidates), dtype=torch.bool)
        top = max(1, min(top, len(candidates)))
        # the reference: the top-th best bf16 score at first, then the top-th best confirmed float32 score
        reference = float(low.topk(top).values[-1])
        while True:
            margin = max(self.margin, self.safety * self.max_error)
            todo = [i for i in range(len(candidates)) if not confirmed[i] and float(low[i]) >= reference - margin]
            if not todo:
                break
            exact = self._scores(gates, [candidates[i] for i in todo], score, low=False)
            out[todo] = exact
            confirmed[todo] = True
            self.max_error = max(self.max_error, float((exact - low[todo]).abs().max()))
            best_confirmed = out[confirmed]
            reference = float(best_confirmed.topk(min(top, len(best_confirmed))).values[-1])
        self.stats["screened"] += len(candidates)
        self.stats["confirmed"] += int(confirmed.sum())
        return out

    @torch.inference_mode()
    def _full_logits(self, buckets: list[_Bucket], gates: torch.Tensor) -> torch.Tensor:
        weights = self.weights[torch.float32]
        return (
            torch.cat([self._run_from(weights, 0, b.hidden, b.mask, gates.to(b.hidden.device)) for b in buckets])
            .float()
            .cpu()
        )

    def score_of(self, gates: torch.Tensor, score: str) -> float:
        """Score of the model with ``gates`` (no extra ablation), in float32."""
        was_training = self.model.training
        self.model.eval()
        try:
            id_logits = self._full_logits(self.id_buckets, gates)
            ood_logits = self._full_logits(self.ood_buckets, gates) if score != "acc" and self.ood_buckets else None
        finally:
            self.model.train(was_training)
        return circuit_score(id_logits, self.id_labels, ood_logits, score)
