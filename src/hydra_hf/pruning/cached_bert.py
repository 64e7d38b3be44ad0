"""The cached, batched circuit evaluator for BERT sequence classifiers (the fast path of Algorithm 1).

:func:`hydra_hf.pruning.circuits.make_evaluator` picks :class:`CachedBertEvaluator` for
``BertForSequenceClassification`` models; every other architecture uses the plain
:class:`~hydra_hf.pruning.circuits.GatedEvaluator`. See :mod:`hydra_hf.pruning.circuits` for how
the search uses an evaluator and the module docstring there for the speed techniques.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .adapters import ModelAdapter
from .circuits import Batch, _labels, circuit_score


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


