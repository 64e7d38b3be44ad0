# Shipped with every Hydra Ensemble model folder built on DeBERTa-v2/v3 (remote code): imports only the
# standard library, torch, transformers and sibling files.
"""Hydra Ensemble of a DeBERTa-v2 / DeBERTa-v3 encoder: M head-pruned members run as one model in one pass.

Shared embeddings (and the shared relative-position table, normalised by each member's own LayerNorm)
feed M residual streams.
Every layer is DeBERTa's post-LN layer with fused *disentangled* self-attention over all members' kept
heads, per-member LayerNorms and an MLP averaged across members (or kept per member). Every member has
its own ``ContextPooler`` and classifier; the prediction is the mean of the members' softmaxes.

Disentangled attention, per head h (dk = d // H, S = the attention span, ``R (2S, d)`` the normalised
relative-position table, ``delta(i, j)`` the bucketed relative position of token i to token j):

    score_h(i, j) = [ q_h(i).k_h(j)  +  q_h(i).pk_h(delta(i, j) + S)  +  k_h(j).pq_h(-delta(j, i) + S) ]
                    / sqrt(dk * (1 + number of position terms))
                          content->content   content->position (c2p)   position->content (p2c)

where ``pk_h`` / ``pq_h`` are head h's rows of the position key / query projections of R (their own
``pos_key_proj`` / ``pos_query_proj``, or the content ``key_proj`` / ``query_proj`` when the base has
``share_att_key=True``, as DeBERTa-v3 does). Both position terms belong to the head: a member keeping
heads {a, b} keeps exactly their rows of every projection, and a removed head contributes nothing.
"""

# Route of forward: what HydraEnsembleDebertaV2ForSequenceClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraTextForSequenceClassification.forward
#     hydra_skeletons.py: HydraTextEncoder.forward
#       hydra_skeletons.py: resolve_output_flags
#       modeling_hydra_deberta_v2.py: HydraEnsembleDebertaV2Model.encode
#         transformers: DebertaV2Embeddings.forward
#         hydra_layers.py: HydraLayerNorm.forward
#         modeling_hydra_deberta_v2.py: relative_positions
#         hydra_layers.py: LayerOutputs.__init__
#         modeling_hydra_deberta_v2.py: HydraDebertaV2Layer.forward
#           modeling_hydra_deberta_v2.py: HydraDisentangledSelfAttention.forward
#             hydra_attention.py: HydraSelfAttention.folds_members
#             hydra_attention.py: HydraSelfAttention.project
#               hydra_attention.py: grouped_linear
#             modeling_hydra_deberta_v2.py: HydraDisentangledSelfAttention.relative_scores
#               modeling_hydra_deberta_v2.py: HydraDisentangledSelfAttention._position_projections
#                 modeling_hydra_deberta_v2.py: HydraDisentangledSelfAttention._shared_rows
#                 hydra_attention.py: HydraSelfAttention._member_rows
#               modeling_hydra_deberta_v2.py: HydraDisentangledSelfAttention._by_head
#             hydra_attention.py: HydraSelfAttention.attend
#               transformers: sdpa_attention_forward
#             hydra_attention.py: HydraSelfAttention._project_out
#               hydra_attention.py: HydraSelfAttention._member_rows
#               hydra_attention.py: grouped_linear
#           hydra_layers.py: HydraLayerNorm.forward
#           hydra_layers.py: HydraMLPBase.forward
#             hydra_layers.py: HydraMLP._mlp
#               hydra_layers.py: rows_linear
#               transformers: GELUActivation.forward
#         hydra_layers.py: LayerOutputs.add
#         hydra_layers.py: LayerOutputs.streams
#       hydra_skeletons.py: encoder_output
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     modeling_hydra_deberta_v2.py: HydraEnsembleDebertaV2ForSequenceClassification.member_logits
#       hydra_layers.py: HydraMemberLinear.forward
#       transformers: GELUActivation.forward
#     hydra_skeletons.py: classifier_output
#       hydra_layers.py: ensemble_outputs
#         hydra_formulas.py: ensemble_log_probs
#           hydra_formulas.py: log_mean_exp
# (end of the route map)

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DebertaV2Config
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.deberta_v2.modeling_deberta_v2 import DebertaV2Embeddings, make_log_bucket_position

from .configuration_hydra_deberta_v2 import HydraEnsembleDebertaV2Config
from .hydra_attention import HydraSelfAttention
from .hydra_layers import (
    HydraLayerNorm,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraMLP,
    HydraModelOutput,
    HydraPreTrainedModel,
    LayerOutputs,
    base_layer_specs,
)
from .hydra_skeletons import HydraTextEncoder, HydraTextForSequenceClassification


def relative_span(base: DebertaV2Config) -> int:
    """S: the attention span of the relative positions (``position_buckets`` when bucketed, else
    ``max_relative_positions``, else ``max_position_embeddings``); the table has ``2 S`` rows."""
    max_relative = getattr(base, "max_relative_positions", -1)
    if max_relative < 1:
        max_relative = base.max_position_embeddings
    buckets = getattr(base, "position_buckets", -1)
    return buckets if buckets > 0 else max_relative


def relative_positions(num_tokens: int, base: DebertaV2Config, device: torch.device) -> torch.Tensor:
    """``delta (T, T)``: relative position ``i - j`` of query token i to key token j, log-bucketed when the
    base has ``position_buckets > 0`` (as transformers' ``build_relative_position``)."""
    max_relative = getattr(base, "max_relative_positions", -1)
    if max_relative < 1:
        max_relative = base.max_position_embeddings
    buckets = getattr(base, "position_buckets", -1)
    ids = torch.arange(num_tokens, dtype=torch.long, device=device)
    delta = ids[:, None] - ids[None, :]  # (T, T)
    if buckets > 0 and max_relative > 0:
        delta = make_log_bucket_position(delta, buckets, max_relative)
    return delta.to(torch.long)


class HydraDisentangledSelfAttention(HydraSelfAttention):
    """DeBERTa's disentangled self-attention for M pruned members, computed jointly.

    The content projections are ``HydraSelfAttention``'s (grouped Q/K/V and output products, member-major
    packing). On top, the position projections of the shared relative-position table keep the same
    member-major packing: without ``share_att_key``, ``pos_key_weight (K*dk, d)``/``pos_key_bias`` (c2p)
    and ``pos_query_weight``/``pos_query_bias`` (p2c) hold each member's kept heads' rows of
    ``pos_key_proj`` / ``pos_query_proj``; with ``share_att_key`` they are the K and Q rows of
    ``qkv_weight`` themselves. The c2p and p2c terms, ``(B, K, T, T)`` over all kept heads, enter one
    attention call as an additive bias (eager or SDPA).
    """

    def __init__(self, config, spec: HydraLayerSpec, base: DebertaV2Config) -> None:
        super().__init__(config, spec)
        relative = bool(getattr(base, "relative_attention", False))
        pos_att_type = list(base.pos_att_type or [])
        # as in transformers, the scale counts the position terms the config names, used or not
        scale_factor = 1 + ("c2p" in pos_att_type) + ("p2c" in pos_att_type)
        self.scaling = (self.head_dim * scale_factor) ** -0.5  # 1 / sqrt(dk * scale_factor)
        self.c2p = relative and "c2p" in pos_att_type
        self.p2c = relative and "p2c" in pos_att_type
        self.share_att_key = bool(getattr(base, "share_att_key", False))
        self.pos_dropout = nn.Dropout(base.hidden_dropout_prob)
        d, kd = spec.hidden_size, self.total_heads * self.head_dim
        if not self.share_att_key:
            if self.c2p:
                self.pos_key_weight = nn.Parameter(torch.empty(kd, d))
                self.pos_key_bias = nn.Parameter(torch.empty(kd))
            if self.p2c:
                self.pos_query_weight = nn.Parameter(torch.empty(kd, d))
                self.pos_query_bias = nn.Parameter(torch.empty(kd))

    def _shared_rows(self, which: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``share_att_key``: the Q (``which=0``) or K (``which=1``) rows of every member's kept heads in
        ``qkv_weight`` / ``qkv_bias``, member-major: ``(K*dk, d)`` and ``(K*dk,)``."""
        dk = self.head_dim
        spans = [
            slice(
                dk * (3 * o + which * k), dk * (3 * o + (which + 1) * k)
            )  # member m's [Q; K; V] block starts at 3*dk*o_m
            for o, k in zip(self.offsets, self.widths)
            if k > 0
        ]
        return torch.cat([self.qkv_weight[s] for s in spans]), torch.cat([self.qkv_bias[s] for s in spans])

    def _position_projections(self, rel_embeddings: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The relative-position table, shared ``(2S, d)`` or normalised per member ``(M, 2S, d)`` -> position
        keys and queries of all kept heads, each ``(K, 2S, dk)`` in member order."""
        rel = self.pos_dropout(rel_embeddings)
        if self.share_att_key:
            weights = (self._shared_rows(1) if self.c2p else None, self._shared_rows(0) if self.p2c else None)
        else:
            weights = (
                (self.pos_key_weight, self.pos_key_bias) if self.c2p else None,
                (self.pos_query_weight, self.pos_query_bias) if self.p2c else None,
            )
        out = []
        for wb in weights:
            if wb is None:
                out.append(None)
                continue
            weight, bias = wb  # (K*dk, d), (K*dk,): member-major rows
            if rel.dim() == 2:  # one product over the shared table for every kept head
                pos = F.linear(rel, weight, bias)  # (2S, K*dk)
            else:  # member m's heads read member m's normalised table
                pos = torch.cat([
                    F.linear(rel[m], weight[self._member_rows(m, 1)], bias[self._member_rows(m, 1)])  # (2S, k_m*dk)
                    for m in range(self.num_members)
                    if self.widths[m] > 0
                ], dim=-1)
            out.append(pos.view(pos.shape[0], self.total_heads, self.head_dim).transpose(0, 1))  # (K, 2S, dk)
        return out[0], out[1]

    def _by_head(self, x: torch.Tensor, pos: torch.Tensor, folded: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Align the content ``x`` (``(M*B, k, T, dk)`` when ``folded``, else ``(B, K, T, dk)``) with
        ``pos (K, 2S, dk)`` for a broadcast product: ``(M, B, k, T, dk)`` with ``(M, 1, k, 2S, dk)``, or
        ``(B, K, T, dk)`` with ``(K, 2S, dk)``."""
        if not folded:
            return x, pos
        M = self.num_members
        return x.view(M, -1, *x.shape[1:]), pos.view(M, 1, self.total_heads // M, *pos.shape[1:])

    def relative_scores(
        self, query: torch.Tensor, key: torch.Tensor, rel_embeddings: torch.Tensor,
        c2p_index: torch.Tensor, p2c_index: torch.Tensor, folded: bool = True,
    ) -> torch.Tensor | None:
        """The unscaled c2p + p2c terms of every kept head, shaped like the content scores
        (``(M*B, k, T, T)`` or ``(B, K, T, T)``); None when the base has neither."""
        if not (self.c2p or self.p2c):
            return None
        pos_key, pos_query = self._position_projections(rel_embeddings)
        T = query.shape[-2]
        score = None
        if self.c2p:  # content of i -> position delta(i, j)
            q, pk = self._by_head(query, pos_key, folded)
            c2p = torch.matmul(q, pk.transpose(-1, -2))  # (..., T, 2S)
            score = torch.gather(c2p, -1, c2p_index.expand(*c2p.shape[:-1], T))  # (..., T, T)
        if self.p2c:  # position delta(i, j) of the query -> content of j
            k, pq = self._by_head(key, pos_query, folded)
            p2c = torch.matmul(k, pq.transpose(-1, -2))  # (..., T_k, 2S)
            p2c = torch.gather(p2c, -1, p2c_index.expand(*p2c.shape[:-1], T)).transpose(-1, -2)  # (..., T, T)
            score = p2c if score is None else score + p2c
        return score.reshape(*query.shape[:2], T, T)

    def forward(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        rel_embeddings: torch.Tensor | None = None,
        c2p_index: torch.Tensor | None = None,
        p2c_index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """
        Args:
            hidden: ``(M, B, T, d)`` member streams, or ``(B, T, d)`` shared by all members.
            attention_mask: boolean ``(B, 1, T, T)``, True where query i may attend to key j (DeBERTa's
                pairwise mask: a padded query attends uniformly, as in the stock model), or None.
            rel_embeddings: the relative-position table, ``(2S, d)`` or normalised per member ``(M, 2S, d)``,
                or None.
            c2p_index, p2c_index: ``(T, T)`` rows of the table used by the c2p / p2c terms.
        Returns:
            the block's output per member ``(M, B, T, d)`` and, with eager attention, the weights
            ``(B, K, T, T)`` over all kept heads in member order.
        """
        B, T, d = hidden.shape[-3], hidden.shape[-2], hidden.shape[-1]
        if self.total_heads == 0:  # every member removed every head of this layer
            out = self.o_bias[:, None, None, :].expand(self.num_members, B, T, d)
            return out, (hidden.new_zeros(B, 0, T, T) if self.config._attn_implementation == "eager" else None)
        M = self.num_members
        folded = self.folds_members()
        query, key, value = self.project(hidden, folded)  # each (M*B, k, T, dk) or (B, K, T, dk)
        bias = None
        if rel_embeddings is not None:
            rel = self.relative_scores(query, key, rel_embeddings, c2p_index, p2c_index, folded)
            bias = rel * self.scaling if rel is not None else None  # (N, k, T, T)
        if attention_mask is not None:
            if folded:  # members folded into the batch axis, member-major
                attention_mask = attention_mask.repeat(M, 1, 1, 1)  # (M*B, 1, T, T)
            if bias is None:
                bias = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
            bias = bias.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
        context, weights = self.attend(query, key, value, bias, B, folded)  # context (M*B, T, k, dk) or (B, T, K, dk)
        return self._project_out(context, B, folded), weights


class HydraDebertaV2Conv(nn.Module):
    """The convolution DeBERTa-v2 xlarge/xxlarge add after the first layer (``conv_kernel_size > 0``), one
    per member: ``h_m = LN_m(h_m + act(conv_m(embeddings))) * mask``, ``weight (M, d, d/groups, k)``."""

    def __init__(self, num_members: int, base: DebertaV2Config) -> None:
        super().__init__()
        d = base.hidden_size
        kernel = getattr(base, "conv_kernel_size", 3)
        self.groups = getattr(base, "conv_groups", 1)
        self.padding = (kernel - 1) // 2
        self.act = ACT2FN[getattr(base, "conv_act", "tanh")]
        self.weight = nn.Parameter(torch.empty(num_members, d, d // self.groups, kernel))
        self.bias = nn.Parameter(torch.empty(num_members, d))
        self.norm = HydraLayerNorm(num_members, d, base.layer_norm_eps)
        self.dropout = nn.Dropout(base.hidden_dropout_prob)

    def forward(
        self, embeddings: torch.Tensor, residual: torch.Tensor, input_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``embeddings (B, T, d)`` shared, ``residual (M, B, T, d)``, ``input_mask (B, T)`` 1/0 or None."""
        x = embeddings.transpose(1, 2)  # (B, d, T)
        out = torch.stack([
            F.conv1d(x, self.weight[m], self.bias[m], padding=self.padding, groups=self.groups)
            for m in range(self.weight.shape[0])
        ]).transpose(2, 3)  # (M, B, T, d)
        if input_mask is not None:
            out = out.masked_fill(~input_mask.bool()[None, :, :, None], 0.0)
        out = self.norm(residual + self.act(self.dropout(out)))
        if input_mask is not None:
            out = out * input_mask[None, :, :, None].to(out.dtype)
        return out


class HydraDebertaV2Layer(GradientCheckpointingLayer):
    """DeBERTa's post-LN layer for M members: ``h = LN1_m(h + Attn(h)); h = LN2_m(h + MLP(h))``. Checkpointed
    (recomputed in the backward pass) after ``model.gradient_checkpointing_enable()``."""

    def __init__(self, config: HydraEnsembleDebertaV2Config, spec: HydraLayerSpec, base: DebertaV2Config) -> None:
        super().__init__()
        self.attention = HydraDisentangledSelfAttention(config, spec, base)
        self.norm1 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.mlp = HydraMLP(spec)
        self.norm2 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.dropout = nn.Dropout(spec.hidden_dropout)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, rel_embeddings: torch.Tensor | None,
        c2p_index: torch.Tensor | None, p2c_index: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)``."""
        attn, weights = self.attention(hidden, attention_mask, rel_embeddings, c2p_index, p2c_index)  # (M, B, T, d)
        hidden = self.norm1(self.dropout(attn) + hidden)  # broadcasts a shared input over M
        hidden = self.norm2(self.dropout(self.mlp(hidden)) + hidden)
        return hidden, weights


class HydraEnsembleDebertaV2PreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleDebertaV2Config
    base_config_class = DebertaV2Config
    _no_split_modules = ["HydraDebertaV2Layer"]

    def init_family_weights(self, module: nn.Module, std: float) -> bool:
        if isinstance(module, HydraDisentangledSelfAttention):  # its position projections; the rest is fused
            for name in ("pos_key", "pos_query"):
                if hasattr(module, f"{name}_weight"):
                    init.normal_(getattr(module, f"{name}_weight"), mean=0.0, std=std)
                    init.zeros_(getattr(module, f"{name}_bias"))
            return False
        if isinstance(module, HydraDebertaV2Conv):
            init.normal_(module.weight, mean=0.0, std=std)
            init.zeros_(module.bias)
        elif isinstance(module, DebertaV2Embeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        else:
            return False
        return True


class HydraEnsembleDebertaV2Model(HydraEnsembleDebertaV2PreTrainedModel, HydraTextEncoder):
    """The fused encoder: shared DeBERTa embeddings and relative-position table (per-member LayerNorm of the
    table), M residual streams.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    def __init__(self, config: HydraEnsembleDebertaV2Config) -> None:
        super().__init__(config)
        base = self.base_config(config)
        self.deberta_config = base
        self.embeddings = DebertaV2Embeddings(base)
        self.relative_attention = bool(getattr(base, "relative_attention", False))
        self.span = relative_span(base)
        norm_rel = [x.strip() for x in str(getattr(base, "norm_rel_ebd", "none")).lower().split("|")]
        self.rel_embeddings = nn.Embedding(2 * self.span, base.hidden_size) if self.relative_attention else None
        # as in transformers, the table's LayerNorm exists whenever norm_rel_ebd names it (used with the table);
        # one per member, like every LayerNorm after the embeddings
        self.rel_norm = (
            HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
            if "layer_norm" in norm_rel
            else None
        )
        self.layers = nn.ModuleList(
            HydraDebertaV2Layer(config, spec, base) for spec in base_layer_specs(config, base)
        )
        self.conv = HydraDebertaV2Conv(config.num_members, base) if getattr(base, "conv_kernel_size", 0) > 0 else None
        self.post_init()

    def encode(
        self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_attentions,
        output_hidden_states,
    ) -> tuple[torch.Tensor, None, LayerOutputs]:
        shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
        if attention_mask is not None and tuple(attention_mask.shape) != tuple(shape):
            raise ValueError(
                f"attention_mask must have shape {tuple(shape)} (batch, tokens) with 1 for tokens and 0 for padding, "
                f"got {tuple(attention_mask.shape)}"
            )
        embeddings = self.embeddings(
            input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids,
            mask=attention_mask, inputs_embeds=inputs_embeds,
        )  # (B, T, d), shared by all members; padded tokens zeroed
        B, T, _ = embeddings.shape
        M = self.config.num_members
        pair_mask = None
        if attention_mask is not None:
            keep = attention_mask.bool()
            pair_mask = keep[:, None, None, :] & keep[:, None, :, None]  # (B, 1, T, T): both tokens are real
        rel_embeddings = c2p_index = p2c_index = None
        if self.relative_attention:
            rel_embeddings = self.rel_embeddings.weight  # (2S, d), shared
            if self.rel_norm is not None:
                rel_embeddings = self.rel_norm(rel_embeddings, shared=True)  # (M, 2S, d): member m's LayerNorm
            delta = relative_positions(T, self.deberta_config, embeddings.device)  # (T, T)
            c2p_index = torch.clamp(delta + self.span, 0, 2 * self.span - 1)
            p2c_index = torch.clamp(-delta + self.span, 0, 2 * self.span - 1)

        outs = LayerOutputs(embeddings, M, output_hidden_states, output_attentions)
        for i, layer in enumerate(self.layers):
            # tensors positional: what GradientCheckpointingLayer checkpoints
            hidden, weights = layer(outs.input, pair_mask, rel_embeddings, c2p_index, p2c_index)  # (M, B, T, d)
            if i == 0 and self.conv is not None:
                hidden = self.conv(embeddings, hidden, attention_mask)
            outs.add(hidden, weights)
        return outs.streams().transpose(0, 1), None, outs  # (B, M, T, d), no pooler


class HydraEnsembleDebertaV2ForSequenceClassification(
    HydraEnsembleDebertaV2PreTrainedModel, HydraTextForSequenceClassification
):
    """M pruned DeBERTa-v2/v3 classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    Member m: ``classifier_m(dropout(act(pooler_m(dropout(h_m[:, 0])))))``, DeBERTa's ``ContextPooler``
    and classifier with its own weights. ``AutoModelForSequenceClassification`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleDebertaV2Model

    def add_head(self, config: HydraEnsembleDebertaV2Config, base: DebertaV2Config) -> None:
        self.pooler = HydraMemberLinear(config.num_members, base.hidden_size, base.hidden_size)
        self.pooler_dropout = nn.Dropout(base.pooler_dropout)
        self.pooler_act = ACT2FN[base.pooler_hidden_act]
        dropout = getattr(base, "cls_dropout", None)
        self.dropout = nn.Dropout(base.hidden_dropout_prob if dropout is None else dropout)
        self.classifier = HydraMemberLinear(config.num_members, base.hidden_size, config.num_labels)

    def member_logits(self, outputs: HydraModelOutput, attention_mask: torch.Tensor | None) -> torch.Tensor:
        context = outputs.member_last_hidden_state[:, :, 0].transpose(0, 1)  # (M, B, d): every member's first token
        pooled = self.pooler_act(self.pooler(self.pooler_dropout(context)))  # (M, B, d)
        return self.classifier(self.dropout(pooled)).transpose(0, 1)  # (B, M, C)
