# Shipped with every Hydra Ensemble model folder built on a Llama-style decoder (remote code): imports only
# the standard library, torch, transformers and sibling files.
"""Hydra Ensemble of a Llama-style decoder (Llama, Mistral, Qwen2, Qwen3): M head-pruned members run as
one model in one forward pass, with one key/value cache for all of them.

Shared token embeddings feed M residual streams. Every layer is the base's pre-norm decoder layer,
``h = h + Attn(RMSNorm1_m(h)); h = h + SwiGLU(RMSNorm2_m(h))``, with causal self-attention over all members'
kept query heads at once: member m projects its own stream with the Q rows of its kept query heads and the
K / V rows of the key/value heads they read (grouped-query attention: a key/value head stays while any of
its query heads is kept), rotary position embeddings (and Qwen3's per-head RMSNorm of queries and keys)
are applied per head, the cache stores every member's kept key/value heads side by side (one cache layer
per layer, ``(B, KV_l, S, dk)`` with ``KV_l`` the key/value heads all members keep in layer l), each query
head attends over its own key/value head, and member m's output projection uses the W_O columns of its kept
heads. The MLP is averaged across members or kept per member; every member has its own RMSNorms, final
norm and head (classifier ``score``; the language-model head is shared or per member, ``lm_head_fusion``).

Outputs: a causal LM returns ``member_logits (B, M, T, V)`` and ``logits (B, T, V)`` = log of the mean of
the members' softmaxes, so ``generate()`` (greedy, sampling, beam search) decodes from the ensemble's
predictive distribution; :meth:`HydraEnsembleLlamaForCausalLM.generate_with_uncertainty` adds, for every
generated token, the predictive entropy, the mutual information (the members' disagreement) and each
member's top token. A sequence classifier pools every member's last non-padding token, as transformers does.

The reference is transformers' model of the base with member m's removed query heads' W_O column blocks
set to zero (``tests/modeling/test_modeling_llama.py``), with and without the cache, on left-padded batches.
"""

# Route of forward: what HydraEnsembleLlamaForCausalLM(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_decoder.py: HydraCausalLMMixin.forward
#     hydra_decoder.py: HydraDecoderModelMixin.forward
#       hydra_decoder.py: HydraDecoderModelMixin.mask_config
#         modeling_hydra_llama.py: HydraEnsembleLlamaPreTrainedModel.base_config
#       hydra_decoder.py: HydraDecoderModelMixin.embed
#       transformers: create_causal_mask
#       modeling_hydra_llama.py: HydraEnsembleLlamaModel.position_embeddings
#         transformers: LlamaRotaryEmbedding.forward
#       hydra_layers.py: LayerOutputs.__init__
#       modeling_hydra_llama.py: HydraDecoderLayer.forward
#         modeling_hydra_llama.py: HydraRMSNorm.forward
#         hydra_attention.py: HydraSelfAttention.forward
#           hydra_attention.py: HydraSelfAttention.folds_members
#           hydra_attention.py: HydraGroupedQueryAttention.project
#             hydra_attention.py: HydraGroupedQueryAttention._heads
#               hydra_attention.py: grouped_linear
#           hydra_attention.py: HydraSelfAttention.rotate
#             hydra_attention.py: apply_rotary
#               hydra_attention.py: rotate_half
#           hydra_attention.py: HydraSelfAttention.expand_kv
#           hydra_attention.py: HydraSelfAttention.attend
#             transformers: sdpa_attention_forward
#           hydra_attention.py: HydraSelfAttention._project_out
#             hydra_attention.py: HydraSelfAttention._member_rows
#             hydra_attention.py: grouped_linear
#           hydra_attention.py: HydraSelfAttention.unfold
#           hydra_attention.py: HydraSelfAttention.fold_mask
#         hydra_layers.py: HydraMLPBase.forward
#           hydra_layers.py: HydraGatedMLP._mlp
#             hydra_layers.py: HydraGatedMLP._linear
#               hydra_layers.py: rows_linear
#             hydra_layers.py: HydraMLPBase._activate
#               transformers: SiLUActivation.forward
#       hydra_layers.py: LayerOutputs.add
#       hydra_layers.py: LayerOutputs.streams
#       modeling_hydra_llama.py: HydraRMSNorm.forward
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
from transformers import GenerationMixin, MistralConfig, Qwen2Config, Qwen3Config
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaConfig, LlamaRotaryEmbedding

from .configuration_hydra_llama import HydraEnsembleLlamaConfig
from .hydra_attention import HydraGroupedQueryAttention
from .hydra_decoder import (  # noqa: F401  the decoders' shared outputs and uncertainty, also this module's names
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    HydraCausalLMMixin,
    HydraCausalLMOutput,
    HydraDecoderClassifierMixin,
    HydraDecoderModelMixin,
    HydraDecoderOutput,
    HydraGenerateOutput,
    token_uncertainty,
)
from .hydra_formulas import kept_kv_heads
from .hydra_layers import (
    HydraGatedMLP,
    HydraPreTrainedModel,
    layer_spec,
)

BASE_CONFIGS = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}


class HydraRMSNorm(nn.Module):
    """One RMSNorm per member: ``weight (M, d)``; input ``(M, ..., d)`` or ``(..., d)`` shared by all members
    (the output gains the M axis). As transformers' ``LlamaRMSNorm``: normalised in float32, scaled after
    casting back."""

    def __init__(self, num_members: int, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_members, hidden_size))

    def forward(self, x: torch.Tensor, shared: bool = False) -> torch.Tensor:
        dtype, d = x.dtype, x.shape[-1]
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        extra = x.dim() - (0 if shared else 1) - 1
        return self.weight.view((self.weight.shape[0],) + (1,) * extra + (d,)) * h.to(dtype)


class HydraDecoderLayer(GradientCheckpointingLayer):
    """The base's pre-norm decoder layer for M members:
    ``h = h + Attn(RMSNorm1_m(h)); h = h + MLP(RMSNorm2_m(h))`` (the first layer reads the shared embeddings)."""

    def __init__(self, config, base, layer_idx: int) -> None:
        super().__init__()
        M, d = config.num_members, base.hidden_size
        self.attention_type = layer_types(base)[layer_idx]
        H, Hkv = base.num_attention_heads, base.num_key_value_heads
        spec = layer_spec(
            config.kept_heads, layer_idx, hidden_size=d, num_heads=H, intermediate_size=base.intermediate_size,
            hidden_act=base.hidden_act, layer_norm_eps=base.rms_norm_eps, attention_dropout=base.attention_dropout,
            hidden_dropout=0.0, mlp_fusion=config.mlp_fusion, kept_neurons=config.kept_neurons,
            head_size=getattr(base, "head_dim", None) or d // H,
        )
        kept_kv = [kept_kv_heads(member[layer_idx], H, Hkv) for member in config.kept_heads]
        attention_bias = bool(getattr(base, "attention_bias", False))
        self.input_layernorm = HydraRMSNorm(M, d, base.rms_norm_eps)
        self.self_attn = HydraGroupedQueryAttention(
            config, spec, layer_idx, kept_kv, Hkv, qkv_bias=attention_bias or base.model_type == "qwen2",
            o_bias=attention_bias, qk_norm_eps=base.rms_norm_eps if base.model_type == "qwen3" else None,
        )
        self.post_attention_layernorm = HydraRMSNorm(M, d, base.rms_norm_eps)
        self.mlp = HydraGatedMLP(spec, bias=bool(getattr(base, "mlp_bias", False)), dropout=0.0)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor], cache: Cache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)``; ``position_embeddings``: rotary
        ``(cos, sin)``, each ``(B or 1, T, dk)``."""
        normed = self.input_layernorm(hidden, shared=hidden.dim() == 3)  # (M, B, T, d)
        attn, weights = self.self_attn(normed, attention_mask, output_attentions, position_embeddings, cache)
        hidden = hidden + attn  # broadcasts a shared input over M
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, weights


def layer_types(base) -> list[str]:
    """Full or sliding-window attention per layer, as the base's own model decides (Qwen2/Qwen3:
    ``layer_types``; Mistral: a ``sliding_window`` for every layer; Llama: full)."""
    types = getattr(base, "layer_types", None)
    if types:
        return list(types)
    sliding = base.model_type == "mistral" and getattr(base, "sliding_window", None) is not None
    return [SLIDING_ATTENTION if sliding else FULL_ATTENTION] * base.num_hidden_layers


class HydraEnsembleLlamaPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleLlamaConfig
    base_config_class = LlamaConfig  # the base's class is chosen by ``base_model_type`` (``base_config``)
    _no_split_modules = ["HydraDecoderLayer"]
    _supports_flash_attn = False

    @classmethod
    def base_config(cls, config):
        """The base configuration (``LlamaConfig``, ``MistralConfig``, ``Qwen2Config`` or ``Qwen3Config``)."""
        return BASE_CONFIGS[config.base_model_type].from_dict(config.base_config)

    def init_family_weights(self, module: nn.Module, std: float) -> bool:
        if isinstance(module, HydraRMSNorm):  # (the MLPs and the attention: init_hydra_weights)
            init.ones_(module.weight)
        elif isinstance(module, LlamaRotaryEmbedding):  # non-persistent tables, as transformers does
            rope_init_fn = module.compute_default_rope_parameters
            if module.rope_type != "default":
                rope_init_fn = ROPE_INIT_FUNCTIONS[module.rope_type]
            inv_freq, _ = rope_init_fn(module.config)
            init.copy_(module.inv_freq, inv_freq)
            init.copy_(module.original_inv_freq, inv_freq)
        else:
            return False
        return True


class HydraEnsembleLlamaModel(HydraDecoderModelMixin, HydraEnsembleLlamaPreTrainedModel):
    """The fused decoder: shared token embeddings, M residual streams, per-member final RMSNorms, one cache
    (the forward: ``HydraDecoderModelMixin``). ``AutoModel.from_pretrained(folder, trust_remote_code=True)``
    returns this class."""

    layers_name, norm_name = "layers", "norm"

    def __init__(self, config: HydraEnsembleLlamaConfig) -> None:
        super().__init__(config)
        base = self.base_config(config)
        self.embed_tokens = nn.Embedding(base.vocab_size, base.hidden_size, base.pad_token_id)
        self.layers = nn.ModuleList(HydraDecoderLayer(config, base, i) for i in range(base.num_hidden_layers))
        self.norm = HydraRMSNorm(config.num_members, base.hidden_size, base.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=base)
        self.post_init()

    def position_embeddings(
        self, embeddings: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary_emb(embeddings, position_ids=position_ids)  # (cos, sin), each (B or 1, T, dk)


class HydraEnsembleLlamaForSequenceClassification(HydraDecoderClassifierMixin, HydraEnsembleLlamaPreTrainedModel):
    """M pruned decoder classifiers in one model (``HydraDecoderClassifierMixin``): every member's ``score_m``
    reads its last non-padding token; ``logits`` = log of the mean of the members' softmaxes."""

    decoder_class = HydraEnsembleLlamaModel


class HydraEnsembleLlamaForCausalLM(HydraCausalLMMixin, HydraEnsembleLlamaPreTrainedModel, GenerationMixin):
    """M pruned causal LMs in one model, one cache, one forward pass per step.

    ``logits (B, T, V)`` = log of the mean of the members' next-token softmaxes, so ``generate()`` decodes
    from the ensemble's predictive distribution; ``member_logits (B, M, T, V)`` are the members' own.
    ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    decoder_class = HydraEnsembleLlamaModel
    embeddings_name = "embed_tokens"

    # the losses are means (over tokens or, with the Trainer's num_items_in_batch, normalised by it): see
    # HydraCausalLMMixin.forward
    accepts_loss_kwargs = True

