# Shipped with every Hydra Ensemble model folder built on GPT-2 (remote code): imports only the standard
# library, torch, transformers and sibling files.
"""Hydra Ensemble of GPT-2: M head-pruned members run as one model in one forward pass, with one key/value
cache for all of them.

Shared token and learned position embeddings (``wte``, ``wpe``) feed M residual streams. Every layer is
GPT-2's pre-LN block, ``h = h + Attn(LN1_m(h)); h = h + MLP(LN2_m(h))``, with causal self-attention over
all members' kept heads at once: member m projects its own stream with the Q / K / V columns of its kept
heads in ``c_attn`` (GPT-2's ``Conv1D`` stores weights ``(in, out)``; here they are stored transposed, as
``nn.Linear`` does), the cache stores every member's kept heads side by side (one cache layer per layer,
``(B, K_l, S, dk)``), and member m's output projection uses the ``c_proj`` rows of its kept heads plus its
own output bias. The MLP (``c_fc``, ``gelu_new``, ``c_proj``) is averaged across members or kept per member;
every member has its own LayerNorms and final ``ln_f``; the language-model head is shared (tied to
``wte``, as GPT-2's) or per member (``lm_head_fusion``), a classifier's ``score`` is per member.
GPT-2's attention scaling options (``scale_attn_weights``, ``scale_attn_by_inverse_layer_idx``,
``reorder_and_upcast_attn``) are the base's.

Outputs: a causal LM returns ``member_logits (B, M, T, V)`` and ``logits (B, T, V)`` = log of the mean of
the members' softmaxes, so ``generate()`` decodes from the ensemble's predictive distribution;
``generate_with_uncertainty`` adds per-token entropy, mutual information and each member's top token
(``hydra_decoder.py``). A sequence classifier pools every member's last non-padding token, as transformers'
``GPT2ForSequenceClassification`` does.

The reference is transformers' GPT-2 with member m's removed heads' ``c_proj`` rows set to zero
(``tests/modeling/test_modeling_gpt2.py``), with and without the cache, on left-padded batches.
"""

# Route of forward: what HydraEnsembleGPT2ForCausalLM(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_decoder.py: HydraCausalLMMixin.forward
#     hydra_decoder.py: HydraDecoderModelMixin.forward
#       hydra_decoder.py: HydraDecoderModelMixin.mask_config
#         hydra_layers.py: HydraPreTrainedModel.base_config
#       modeling_hydra_gpt2.py: HydraEnsembleGPT2Model.embed
#       transformers: create_causal_mask
#       hydra_decoder.py: HydraDecoderModelMixin.position_embeddings
#       hydra_layers.py: LayerOutputs.__init__
#       modeling_hydra_gpt2.py: HydraGPT2Block.forward
#         hydra_layers.py: HydraLayerNorm.forward
#         hydra_attention.py: HydraSelfAttention.forward
#           hydra_attention.py: HydraSelfAttention.folds_members
#           hydra_attention.py: HydraSelfAttention.project
#             hydra_attention.py: HydraSelfAttention._member_rows
#             hydra_attention.py: grouped_linear
#           hydra_attention.py: HydraSelfAttention.expand_kv
#           modeling_hydra_gpt2.py: HydraGPT2Attention.attend
#             hydra_attention.py: HydraSelfAttention.attend
#               transformers: sdpa_attention_forward
#           hydra_attention.py: HydraSelfAttention._project_out
#             hydra_attention.py: HydraSelfAttention._member_rows
#             hydra_attention.py: grouped_linear
#           hydra_attention.py: HydraSelfAttention.unfold
#           hydra_attention.py: HydraSelfAttention.fold_mask
#         hydra_layers.py: HydraMLPBase.forward
#           hydra_layers.py: HydraMLP._mlp
#             hydra_layers.py: rows_linear
#             transformers: NewGELUActivation.forward
#       hydra_layers.py: LayerOutputs.add
#       hydra_layers.py: LayerOutputs.streams
#       hydra_layers.py: HydraLayerNorm.forward
#       hydra_layers.py: LayerOutputs.output_fields
#     hydra_decoder.py: HydraCausalLMMixin.member_logits_of
#       hydra_layers.py: rows_linear
#     hydra_decoder.py: ensemble_lm_outputs
#       hydra_formulas.py: ensemble_log_probs
#         hydra_formulas.py: log_mean_exp
# (end of the route map)

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin, GPT2Config
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from .configuration_hydra_gpt2 import HydraEnsembleGPT2Config
from .hydra_attention import HydraSelfAttention
from .hydra_decoder import FULL_ATTENTION, HydraCausalLMMixin, HydraDecoderClassifierMixin, HydraDecoderModelMixin
from .hydra_layers import HydraLayerNorm, HydraMLP, HydraPreTrainedModel, layer_spec


def upcast_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-2's eager attention with ``reorder_and_upcast_attn``: scores and softmax in float32 (the scale
    folded into the product), the weights cast back to the values' dtype. ``query (B, K, T, dk)``,
    ``key`` / ``value (B, K, S, dk)`` -> context ``(B, T, K, dk)``, weights ``(B, K, T, S)``."""
    B, K, T, dk = query.shape
    S = key.shape[-2]
    with torch.autocast(query.device.type, enabled=False):
        scores = torch.baddbmm(
            torch.empty(B * K, T, S, dtype=torch.float32, device=query.device),
            query.reshape(-1, T, dk).float(), key.transpose(-1, -2).reshape(-1, dk, S).float(), beta=0, alpha=scaling,
        ).view(B, K, T, S)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1).type(value.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class HydraGPT2Attention(HydraSelfAttention):
    """GPT-2's causal self-attention of M pruned members with a shared key/value cache: ``HydraSelfAttention``
    (``qkv_weight (3*K*dk, d)``: member m's block is [Q rows of its kept heads; K rows; V rows], the transposed
    ``c_attn`` columns; ``o_weight (K*dk, d)``: the ``c_proj`` rows of its kept heads; ``qkv_bias``,
    ``o_bias (M, d)``) with GPT-2's scaling options and, in eager mode, ``reorder_and_upcast_attn``."""

    def __init__(self, config, spec, base: GPT2Config, layer_idx: int) -> None:
        super().__init__(config, spec, is_causal=True, layer_idx=layer_idx)
        scaling = self.head_dim**-0.5 if base.scale_attn_weights else 1.0
        if base.scale_attn_by_inverse_layer_idx:
            scaling /= float(layer_idx + 1)
        self.scaling = scaling
        self.reorder_and_upcast_attn = bool(base.reorder_and_upcast_attn)

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
        batch: int, folded: bool, is_causal: bool = False, **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``HydraSelfAttention.attend``; eager attention with ``reorder_and_upcast_attn`` in float32."""
        if self.reorder_and_upcast_attn and self.config._attn_implementation == "eager":
            dropout = self.dropout if self.training else 0.0
            return upcast_attention_forward(self, query, key, value, attention_mask, self.scaling, dropout=dropout)
        return super().attend(query, key, value, attention_mask, batch, folded, is_causal, **kwargs)


class HydraGPT2Block(GradientCheckpointingLayer):
    """GPT-2's pre-LN block for M members: ``h = h + drop(Attn(LN1_m(h))); h = h + drop(MLP(LN2_m(h)))``
    (the first block reads the shared embeddings)."""

    attention_type = FULL_ATTENTION

    def __init__(self, config, base: GPT2Config, layer_idx: int) -> None:
        super().__init__()
        M, d = config.num_members, base.hidden_size
        spec = layer_spec(
            config.kept_heads, layer_idx, hidden_size=d, num_heads=base.num_attention_heads,
            intermediate_size=base.n_inner if base.n_inner is not None else 4 * d,
            hidden_act=base.activation_function, layer_norm_eps=base.layer_norm_epsilon,
            attention_dropout=base.attn_pdrop, hidden_dropout=base.resid_pdrop, mlp_fusion=config.mlp_fusion,
            kept_neurons=config.kept_neurons,
        )
        self.ln_1 = HydraLayerNorm(M, d, base.layer_norm_epsilon)
        self.attn = HydraGPT2Attention(config, spec, base, layer_idx)
        self.ln_2 = HydraLayerNorm(M, d, base.layer_norm_epsilon)
        self.mlp = HydraMLP(spec)
        self.dropout = nn.Dropout(base.resid_pdrop)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, position_embeddings: None = None,
        cache: Cache | None = None, output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)`` (GPT-2's positions are learned:
        ``position_embeddings`` is None)."""
        normed = self.ln_1(hidden, shared=hidden.dim() == 3)  # (M, B, T, d)
        attn, weights = self.attn(normed, attention_mask, output_attentions, cache=cache)
        hidden = hidden + self.dropout(attn)  # broadcasts a shared input over M
        hidden = hidden + self.dropout(self.mlp(self.ln_2(hidden)))
        return hidden, weights


class HydraEnsembleGPT2PreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleGPT2Config
    base_config_class = GPT2Config
    _no_split_modules = ["HydraGPT2Block"]
    _supports_flash_attn = False


class HydraEnsembleGPT2Model(HydraDecoderModelMixin, HydraEnsembleGPT2PreTrainedModel):
    """The fused GPT-2: shared token and position embeddings, M residual streams, per-member final
    LayerNorms, one cache (the forward: ``HydraDecoderModelMixin``).
    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class."""

    _input_embed_layer = "wte"  # transformers' get_input_embeddings / set_input_embeddings read it

    layers_name, norm_name = "h", "ln_f"

    def __init__(self, config: HydraEnsembleGPT2Config) -> None:
        super().__init__(config)
        base = self.base_config(config)
        d = base.hidden_size
        self.wte = nn.Embedding(base.vocab_size, d)
        self.wpe = nn.Embedding(base.max_position_embeddings, d)
        self.drop = nn.Dropout(base.embd_pdrop)
        self.h = nn.ModuleList(HydraGPT2Block(config, base, i) for i in range(base.num_hidden_layers))
        self.ln_f = HydraLayerNorm(config.num_members, d, base.layer_norm_epsilon)
        self.post_init()

    def embed(
        self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """GPT-2's: the tokens plus the learned positions (and token types, embedded with ``wte``), dropout."""
        embeddings = inputs_embeds + self.wpe(position_ids).to(inputs_embeds.device)
        if token_type_ids is not None:
            embeddings = embeddings + self.wte(token_type_ids)
        return self.drop(embeddings)


class HydraEnsembleGPT2ForSequenceClassification(HydraDecoderClassifierMixin, HydraEnsembleGPT2PreTrainedModel):
    """M pruned GPT-2 classifiers in one model (``HydraDecoderClassifierMixin``): every member's ``score_m``
    reads its last non-padding token; ``logits`` = log of the mean of the members' softmaxes."""

    decoder_class = HydraEnsembleGPT2Model


class HydraEnsembleGPT2ForCausalLM(HydraCausalLMMixin, HydraEnsembleGPT2PreTrainedModel, GenerationMixin):
    """M pruned GPT-2 language models in one model, one cache, one forward pass per step.

    ``logits (B, T, V)`` = log of the mean of the members' next-token softmaxes, so ``generate()`` decodes
    from the ensemble's predictive distribution; ``member_logits (B, M, T, V)`` are the members' own;
    ``generate_with_uncertainty`` / ``score_generated`` give per-token entropy and mutual information.
    ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    decoder_class = HydraEnsembleGPT2Model
    embeddings_name = "wte"

    # the losses are means (over tokens or, with the Trainer's num_items_in_batch, normalised by it): see
    # HydraCausalLMMixin.forward
    accepts_loss_kwargs = True

