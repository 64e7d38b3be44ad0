# Shipped with every Hydra Ensemble model folder built on ModernBERT (remote code): imports only the
# standard library, torch, transformers and sibling files.
"""Hydra Ensemble of a ModernBERT encoder: M head-pruned members run as one model in one pass.

Shared embeddings (token embeddings + LayerNorm) feed M residual streams. Every layer is ModernBERT's
pre-LN layer, ``h = h + Attn(LN1_m(h)); h = h + GLU-MLP(LN2_m(h))`` (no LayerNorm before the first
layer's attention), with fused rotary self-attention over all members' kept heads: global attention
(RoPE with the global theta) or attention within a sliding window of ``local_attention`` tokens (the
local theta), as the base's ``layer_types`` say. The gated MLP is averaged across members (or kept per
member). Every member has its own final LayerNorm, prediction head (dense + activation + LayerNorm) and
classifier over its CLS token or its mean over the real tokens (``classifier_pooling``); the
prediction is the mean of the members' softmaxes.

ModernBERT has no biases by default (``attention_bias``, ``mlp_bias``, ``norm_bias`` and
``classifier_bias`` False): the fused model then has no bias parameters either. The shared fused
kernels (``HydraSelfAttention``, ``HydraLayerNorm``) read a bias tensor, so a missing bias is a zero
buffer that is neither saved nor trained.

The reference is transformers' ModernBERT with its eager or SDPA attention on padded batches (the
flash-attention path unpads the batch, the same numbers).
"""

# Route of forward: what HydraEnsembleModernBertForSequenceClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraTextForSequenceClassification.forward_without_token_types
#     hydra_skeletons.py: HydraTextForSequenceClassification.forward
#       hydra_skeletons.py: HydraTextEncoder.forward_without_token_types
#         hydra_skeletons.py: HydraTextEncoder.forward
#           hydra_skeletons.py: resolve_output_flags
#           modeling_hydra_modernbert.py: HydraEnsembleModernBertModel.encode
#             transformers: ModernBertEmbeddings.forward
#             modeling_hydra_modernbert.py: HydraEnsembleModernBertModel._masks
#               hydra_layers.py: padding_mask_to_additive
#                 hydra_layers.py: may_mask
#             transformers: ModernBertRotaryEmbedding.forward
#             hydra_layers.py: LayerOutputs.__init__
#             modeling_hydra_modernbert.py: HydraModernBertLayer.forward
#               modeling_hydra_modernbert.py: HydraRotarySelfAttention.forward
#                 hydra_attention.py: HydraSelfAttention.forward
#                   hydra_attention.py: HydraSelfAttention.folds_members
#                   hydra_attention.py: HydraSelfAttention.project
#                     hydra_attention.py: grouped_linear
#                   hydra_attention.py: HydraSelfAttention.rotate
#                     hydra_attention.py: apply_rotary
#                       hydra_attention.py: rotate_half
#                   hydra_attention.py: HydraSelfAttention.expand_kv
#                   hydra_attention.py: HydraSelfAttention.attend
#                     transformers: sdpa_attention_forward
#                   hydra_attention.py: HydraSelfAttention._project_out
#                     hydra_attention.py: HydraSelfAttention._member_rows
#                     hydra_attention.py: grouped_linear
#                   hydra_attention.py: HydraSelfAttention.fold_mask
#               hydra_layers.py: HydraLayerNorm.forward
#               hydra_layers.py: HydraMLPBase.forward
#                 hydra_layers.py: HydraGatedMLP._mlp
#                   hydra_layers.py: HydraGatedMLP._linear
#                     hydra_layers.py: rows_linear
#                   hydra_layers.py: HydraMLPBase._activate
#                     transformers: GELUActivation.forward
#             hydra_layers.py: LayerOutputs.add
#             hydra_layers.py: LayerOutputs.streams
#             hydra_layers.py: HydraLayerNorm.forward
#           hydra_skeletons.py: encoder_output
#             hydra_skeletons.py: model_output
#               hydra_layers.py: LayerOutputs.output_fields
#       modeling_hydra_modernbert.py: HydraEnsembleModernBertForSequenceClassification.member_logits
#         modeling_hydra_modernbert.py: HydraModernBertHead.forward
#           hydra_layers.py: HydraMemberLinear.forward
#           transformers: GELUActivation.forward
#           hydra_layers.py: HydraLayerNorm.forward
#         hydra_layers.py: HydraMemberLinear.forward
#       hydra_skeletons.py: classifier_output
#         hydra_layers.py: ensemble_outputs
#           hydra_formulas.py: ensemble_log_probs
#             hydra_formulas.py: log_mean_exp
# (end of the route map)

from __future__ import annotations

import torch
from torch import nn
from transformers import ModernBertConfig
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.modernbert.modeling_modernbert import ModernBertEmbeddings, ModernBertRotaryEmbedding

from .configuration_hydra_modernbert import HydraEnsembleModernBertConfig
from .hydra_attention import HydraSelfAttention
from .hydra_layers import (
    HydraGatedMLP,
    HydraLayerNorm,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraModelOutput,
    HydraPreTrainedModel,
    LayerOutputs,
    layer_spec,
    padding_mask_to_additive,
)
from .hydra_skeletons import HydraTextEncoder, HydraTextForSequenceClassification

FULL, SLIDING = "full_attention", "sliding_attention"


def _zero_bias(module: nn.Module, name: str) -> None:
    """Replace the bias parameter ``name`` of ``module`` by a zero buffer (not saved, not trained)."""
    bias = module._parameters.pop(name)
    module.register_buffer(name, torch.zeros(bias.shape, dtype=bias.dtype, device=bias.device), persistent=False)


def hydra_norm(num_members: int, base: ModernBertConfig) -> HydraLayerNorm:
    """Per-member LayerNorm; without a bias when the base has ``norm_bias=False``."""
    norm = HydraLayerNorm(num_members, base.hidden_size, base.norm_eps)
    if not base.norm_bias:
        _zero_bias(norm, "bias")
    return norm


def modernbert_layer_spec(
    config: HydraEnsembleModernBertConfig, base: ModernBertConfig, layer_idx: int
) -> HydraLayerSpec:
    return layer_spec(
        config.kept_heads, layer_idx, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
        intermediate_size=base.intermediate_size, hidden_act=base.hidden_activation, layer_norm_eps=base.norm_eps,
        attention_dropout=base.attention_dropout, hidden_dropout=base.mlp_dropout, mlp_fusion=config.mlp_fusion,
        kept_neurons=config.kept_neurons,
    )


class HydraRotarySelfAttention(HydraSelfAttention):
    """ModernBERT's self-attention for M pruned members: the fused Q/K/V (rows of ``Wqkv``) and output
    (columns of ``Wo``) products of ``HydraSelfAttention``, rotary position embeddings on every kept
    head's queries and keys, one attention call over all kept heads (global, or masked to the sliding
    window), and dropout after the output projection."""

    rotary_in_float32 = True  # as transformers' ModernBERT

    def __init__(self, config, spec: HydraLayerSpec, base: ModernBertConfig) -> None:
        super().__init__(config, spec)
        if not base.attention_bias:
            _zero_bias(self, "qkv_bias")
            _zero_bias(self, "o_bias")
        self.out_drop = nn.Dropout(spec.attention_dropout)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``HydraSelfAttention.forward`` with the rotary tables ``cos``, ``sin`` ``(B or 1, T, dk)`` of this layer's
        attention type and an additive mask ``(B, 1, T or 1, T)`` (or None); dropout after the output projection."""
        out, weights = super().forward(hidden, attention_mask, position_embeddings=(cos, sin))  # (M, B, T, d)
        return self.out_drop(out), weights


class HydraModernBertLayer(GradientCheckpointingLayer):
    """ModernBERT's pre-LN layer for M members: ``h = h + Attn(LN1_m(h)); h = h + MLP(LN2_m(h))``; the first
    layer has no ``LN1`` (the embeddings are normalised already), so its attention sees the shared input.
    Checkpointed (recomputed in the backward pass) after ``model.gradient_checkpointing_enable()``."""

    def __init__(
        self, config: HydraEnsembleModernBertConfig, spec: HydraLayerSpec, base: ModernBertConfig, layer_idx: int
    ) -> None:
        super().__init__()
        self.attention_type = base.layer_types[layer_idx]
        self.norm1 = hydra_norm(spec.num_members, base) if layer_idx > 0 else None
        self.attention = HydraRotarySelfAttention(config, spec, base)
        self.norm2 = hydra_norm(spec.num_members, base)
        self.mlp = HydraGatedMLP(spec, bias=base.mlp_bias, dropout=base.mlp_dropout)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)``."""
        normed = hidden if self.norm1 is None else self.norm1(hidden, shared=hidden.dim() == 3)
        attn, weights = self.attention(normed, attention_mask, cos, sin)  # (M, B, T, d)
        hidden = hidden + attn  # broadcasts a shared input over M
        hidden = hidden + self.mlp(self.norm2(hidden))
        return hidden, weights


class HydraModernBertHead(nn.Module):
    """ModernBERT's prediction head per member: ``LN_m(act(dense_m(x)))`` on ``(M, B, d)``."""

    def __init__(self, num_members: int, base: ModernBertConfig) -> None:
        super().__init__()
        self.dense = HydraMemberLinear(num_members, base.hidden_size, base.hidden_size, bias=base.classifier_bias)
        self.act = ACT2FN[base.classifier_activation]
        self.norm = hydra_norm(num_members, base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class HydraEnsembleModernBertPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleModernBertConfig
    base_config_class = ModernBertConfig
    _no_split_modules = ["HydraModernBertLayer"]

    def init_family_weights(self, module: nn.Module, std: float) -> bool:
        if not isinstance(module, ModernBertRotaryEmbedding):
            return False
        for layer_type in module.layer_types:  # non-persistent tables, as transformers does
            rope_init_fn = module.compute_default_rope_parameters
            if module.rope_type[layer_type] != "default":
                rope_init_fn = ROPE_INIT_FUNCTIONS[module.rope_type[layer_type]]
            inv_freq, _ = rope_init_fn(module.config, layer_type=layer_type)
            init.copy_(getattr(module, f"{layer_type}_inv_freq"), inv_freq)
            init.copy_(getattr(module, f"{layer_type}_original_inv_freq"), inv_freq)
        return True


class HydraEnsembleModernBertModel(HydraEnsembleModernBertPreTrainedModel, HydraTextEncoder):
    """The fused encoder: shared ModernBERT embeddings, M residual streams, per-member final LayerNorms.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    forward = HydraTextEncoder.forward_without_token_types  # ModernBERT has no token types
    tie_last_hidden_state = True  # hidden_states[-1] after the final norm, as transformers' ModernBERT returns it

    def __init__(self, config: HydraEnsembleModernBertConfig) -> None:
        super().__init__(config)
        base = self.base_config(config)
        self.sliding_window = base.local_attention // 2  # a token sees the tokens within this distance
        self.embeddings = ModernBertEmbeddings(base)
        self.layers = nn.ModuleList(
            HydraModernBertLayer(config, modernbert_layer_spec(config, base, i), base, i)
            for i in range(base.num_hidden_layers)
        )
        self.final_norm = hydra_norm(config.num_members, base)
        self.rotary_emb = ModernBertRotaryEmbedding(config=base)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.tok_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.tok_embeddings = value

    def _masks(self, attention_mask: torch.Tensor | None, embeddings: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """Additive masks per attention type: padding ``(B, 1, 1, T)`` (or None) for global layers, padding
        and the band ``|i - j| <= local_attention // 2`` ``(B, 1, T, T)`` for sliding-window layers."""
        B, T = embeddings.shape[0], embeddings.shape[1]
        full = padding_mask_to_additive(attention_mask, embeddings.dtype, T)  # (B, 1, 1, T) or None
        if T - 1 <= self.sliding_window:  # the window covers the whole sequence
            return {FULL: full, SLIDING: full}
        pos = torch.arange(T, device=embeddings.device)
        outside = (pos[:, None] - pos[None, :]).abs() > self.sliding_window  # (T, T)
        band = torch.zeros(T, T, dtype=embeddings.dtype, device=embeddings.device)
        band = band.masked_fill(outside, torch.finfo(embeddings.dtype).min)  # (T, T)
        sliding = band.expand(B, 1, T, T) if full is None else torch.minimum(band, full)  # (B, 1, T, T): both allow
        return {FULL: full, SLIDING: sliding}

    def encode(
        self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_attentions,
        output_hidden_states,
    ) -> tuple[torch.Tensor, None, LayerOutputs]:
        embeddings = self.embeddings(input_ids=input_ids, inputs_embeds=inputs_embeds)  # (B, T, d), shared
        T = embeddings.shape[1]
        M = self.config.num_members
        if position_ids is None:
            position_ids = torch.arange(T, device=embeddings.device).unsqueeze(0)  # (1, T)
        masks = self._masks(attention_mask, embeddings)
        rotary = {
            kind: self.rotary_emb(embeddings, position_ids, kind) for kind in {l.attention_type for l in self.layers}
        }

        outs = LayerOutputs(embeddings, M, output_hidden_states, output_attentions)
        for layer in self.layers:
            cos, sin = rotary[layer.attention_type]  # (B or 1, T, dk) each
            outs.add(*layer(outs.input, masks[layer.attention_type], cos, sin))  # (M, B, T, d)
        last = self.final_norm(outs.streams()).transpose(0, 1)  # (B, M, T, d)
        return last, None, outs  # no pooler


class HydraEnsembleModernBertForSequenceClassification(
    HydraEnsembleModernBertPreTrainedModel, HydraTextForSequenceClassification
):
    """M pruned ModernBERT classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    Member m: ``classifier_m(drop(head_m(pool(h_m))))`` with ``pool`` the CLS token or the mean over the
    real tokens (``classifier_pooling``). ``AutoModelForSequenceClassification`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleModernBertModel
    forward = HydraTextForSequenceClassification.forward_without_token_types  # ModernBERT has no token types

    def add_head(self, config: HydraEnsembleModernBertConfig, base: ModernBertConfig) -> None:
        self.pooling = base.classifier_pooling
        self.head = HydraModernBertHead(config.num_members, base)
        self.drop = nn.Dropout(base.classifier_dropout)
        self.classifier = HydraMemberLinear(config.num_members, base.hidden_size, config.num_labels)

    def member_logits(self, outputs: HydraModelOutput, attention_mask: torch.Tensor | None) -> torch.Tensor:
        hidden = outputs.member_last_hidden_state.transpose(0, 1)  # (M, B, T, d)
        if self.pooling == "cls":
            pooled = hidden[:, :, 0]  # (M, B, d)
        elif attention_mask is None:  # mean over the tokens
            pooled = hidden.mean(dim=2)
        else:  # mean over the real tokens
            keep = attention_mask.to(hidden.dtype)[None, :, :, None]  # (1, B, T, 1)
            pooled = (hidden * keep).sum(dim=2) / keep.sum(dim=2)  # (M, B, d)
        return self.classifier(self.drop(self.head(pooled))).transpose(0, 1)  # (B, M, C)
