# Shipped with every SigLIP Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a SigLIP model for zero-shot image classification.

Member m = pruned vision tower m + pruned text tower m, each run fused with the other members' towers
(one pass per tower), following transformers' SigLIP:

- vision: shared patch/position embeddings (no [CLS] token), pre-LN layers with per-member LayerNorms
  and fused attention, per-member ``post_layernorm``, then the *attention-pooling head*
  (``SiglipMultiheadAttentionPoolingHead``: a learned probe attends over the tokens, then LayerNorm and
  MLP with a residual). The head is not pruned: every member keeps its own copy and runs it on its own
  tokens (batched over members);
- text: shared embeddings, bidirectional fused layers (padding mask only), per-member
  ``final_layer_norm``, the *last* token pooled (as transformers does; it may be padding), per-member
  ``head`` (a linear map with bias);
- member m's ``logit_scale`` and ``logit_bias``.

Zero-shot prediction. Member m scores image b against text n with ``z[b, m, n] = exp(logit_scale_m) *
cos + logit_bias_m``, and SigLIP's probability that the text matches is ``sigmoid(z)``: one independent
yes/no per (image, text), not a softmax over the texts. The ensemble's probability is the members'
mean, ``p[b, n] = mean_m sigmoid(z[b, m, n])``, and ``logits_per_image[b, n] = logit(p[b, n])``
(computed stably as ``logsumexp_m logsigmoid(z) - logsumexp_m logsigmoid(-z)``). transformers'
``zero-shot-image-classification`` pipeline applies a sigmoid to ``logits_per_image`` when the
``model_type`` contains "siglip" (this one's is ``hydra_ensemble_siglip``), so its scores are the mean
of the members' probabilities exactly as the stock SigLIP pipeline computes each member's.
``logits_per_text`` is its transpose (the same pairs).
"""

# Route of forward: what HydraEnsembleSiglipModel(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraTwoTowerModel.forward
#     hydra_skeletons.py: resolve_output_flags
#     hydra_skeletons.py: HydraVisionTower.forward
#       hydra_skeletons.py: check_pixel_values
#       hydra_skeletons.py: HydraVisionTower.embed
#         transformers: SiglipVisionEmbeddings.forward
#       hydra_skeletons.py: HydraTower.run
#         hydra_skeletons.py: run_layers
#           hydra_layers.py: LayerOutputs.__init__
#           hydra_layers.py: HydraPreLNLayer.forward
#             hydra_layers.py: HydraLayerNorm.forward
#             hydra_attention.py: HydraSelfAttention.forward
#               hydra_attention.py: HydraSelfAttention.folds_members
#               hydra_attention.py: HydraSelfAttention.project
#                 hydra_attention.py: HydraSelfAttention._member_rows
#                 hydra_attention.py: grouped_linear
#               hydra_attention.py: HydraSelfAttention.expand_kv
#               hydra_attention.py: HydraSelfAttention.attend
#                 transformers: sdpa_attention_forward
#               hydra_attention.py: HydraSelfAttention._project_out
#                 hydra_attention.py: HydraSelfAttention._member_rows
#                 hydra_attention.py: grouped_linear
#               hydra_attention.py: HydraSelfAttention.fold_mask
#             hydra_layers.py: HydraMLPBase.forward
#               hydra_layers.py: HydraMLP._mlp
#                 hydra_layers.py: rows_linear
#                 transformers: GELUTanh.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#         modeling_hydra_siglip.py: HydraSiglipVisionTower.pool
#           hydra_layers.py: HydraLayerNorm.forward
#           modeling_hydra_siglip.py: HydraSiglipAttentionPoolingHead.forward
#             hydra_layers.py: HydraMemberLinear.forward
#             hydra_layers.py: HydraLayerNorm.forward
#             hydra_layers.py: HydraMLPBase.forward
#               hydra_layers.py: HydraMLP._mlp
#                 hydra_attention.py: grouped_linear
#                 transformers: GELUTanh.forward
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     hydra_skeletons.py: HydraTextTower.forward
#       transformers: SiglipTextEmbeddings.forward
#       hydra_skeletons.py: HydraTextTower.text_mask
#         hydra_layers.py: padding_mask_to_additive
#       hydra_skeletons.py: HydraTower.run
#         hydra_skeletons.py: run_layers
#           hydra_layers.py: LayerOutputs.__init__
#           hydra_layers.py: HydraPreLNLayer.forward
#             hydra_layers.py: HydraLayerNorm.forward
#             hydra_attention.py: HydraSelfAttention.forward
#               hydra_attention.py: HydraSelfAttention.folds_members
#               hydra_attention.py: HydraSelfAttention.project
#                 hydra_attention.py: HydraSelfAttention._member_rows
#                 hydra_attention.py: grouped_linear
#               hydra_attention.py: HydraSelfAttention.expand_kv
#               hydra_attention.py: HydraSelfAttention.attend
#                 transformers: sdpa_attention_forward
#               hydra_attention.py: HydraSelfAttention._project_out
#                 hydra_attention.py: HydraSelfAttention._member_rows
#                 hydra_attention.py: grouped_linear
#               hydra_attention.py: HydraSelfAttention.fold_mask
#             hydra_layers.py: HydraMLPBase.forward
#               hydra_layers.py: HydraMLP._mlp
#                 hydra_layers.py: rows_linear
#                 transformers: GELUTanh.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#         modeling_hydra_siglip.py: HydraSiglipTextTower.pool
#           hydra_layers.py: HydraLayerNorm.forward
#           hydra_layers.py: HydraMemberLinear.forward
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     hydra_skeletons.py: HydraTwoTowerModel.image_embeds
#     hydra_skeletons.py: HydraTwoTowerModel.text_embeds
#     modeling_hydra_siglip.py: HydraEnsembleSiglipModel.member_logits
#     modeling_hydra_siglip.py: HydraEnsembleSiglipModel.ensemble_logits
#       hydra_formulas.py: ensemble_sigmoid_logits
#     hydra_skeletons.py: unit_mean
# (end of the route map)

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import SiglipConfig, SiglipTextConfig, SiglipVisionConfig
from transformers import initialization as init
from transformers.models.siglip.modeling_siglip import SiglipTextEmbeddings, SiglipVisionEmbeddings

from .configuration_hydra_siglip import HydraEnsembleSiglipConfig
from .hydra_formulas import ensemble_sigmoid_logits
from .hydra_layers import (
    HydraLayerNorm,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraMLP,
    HydraPreTrainedModel,
    init_hydra_weights,
)
from .hydra_skeletons import HydraTextTower, HydraTwoTowerModel, HydraTwoTowerOutput, HydraVisionTower, tower_layers


@dataclass
class HydraSiglipOutput(HydraTwoTowerOutput):
    """
    Args:
        loss: mean over members of each member's SigLIP (sigmoid) loss, with ``return_loss=True``.
        logits_per_image: ``(B, N)`` logit of the mean over members of ``sigmoid(member logits)``.
        logits_per_text: ``(N, B)`` its transpose.
        member_logits_per_image: ``(B, M, N)`` member m's ``exp(logit_scale_m) * cos + logit_bias_m``.
        member_logits_per_text: ``(N, M, B)`` the same, per text.
        text_embeds, image_embeds: ``(N, P)``, ``(B, P)`` the members' mean of ``member_text_embeds`` /
            ``member_image_embeds``, L2-normalised (the stock fields' shapes).
        text_model_output, vision_model_output: the towers' ``HydraModelOutput``.
        member_text_embeds: ``(N, M, P)`` L2-normalised text embeddings of every member.
        member_image_embeds: ``(B, M, P)`` L2-normalised image embeddings of every member.
    """


class HydraSiglipAttentionPoolingHead(nn.Module):
    """``SiglipMultiheadAttentionPoolingHead`` for M members, every member with its own weights (not pruned).

    Member m: ``x = MHA_m(probe_m, h_m, h_m)``; ``out = x + MLP_m(LN_m(x))``. Parameters: ``probe (M, 1, 1, d)``,
    ``in_proj_weight (M, 3d, d)``, ``in_proj_bias (M, 3d)``, ``out_proj`` (``HydraMemberLinear``),
    ``layernorm`` (``HydraLayerNorm``), ``mlp`` (a per-member ``HydraMLP``).
    """

    def __init__(self, config: HydraEnsembleSiglipConfig, base: SiglipVisionConfig) -> None:
        super().__init__()
        M, d = config.num_members, base.hidden_size
        self.num_heads = base.num_attention_heads
        self.probe = nn.Parameter(torch.zeros(M, 1, 1, d))  # the stock (1, 1, d) probe of every member
        self.in_proj_weight = nn.Parameter(torch.empty(M, 3 * d, d))
        self.in_proj_bias = nn.Parameter(torch.zeros(M, 3 * d))
        self.out_proj = HydraMemberLinear(M, d, d)
        self.layernorm = HydraLayerNorm(M, d, base.layer_norm_eps)
        self.mlp = HydraMLP(
            HydraLayerSpec(
                hidden_size=d,
                num_heads=base.num_attention_heads,
                kept_heads=((),) * M,  # the MLP reads only M
                intermediate_size=base.intermediate_size,
                hidden_act=base.hidden_act,
                layer_norm_eps=base.layer_norm_eps,
                attention_dropout=0.0,
                hidden_dropout=0.0,
                mlp_fusion="per_member",
            )
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden (M, B, T, d)`` every member's tokens -> ``(M, B, d)`` every member's pooled vector."""
        M, B, T, d = hidden.shape
        H = self.num_heads
        dk = d // H
        w_q, w_k, w_v = self.in_proj_weight.split(d, dim=1)  # (M, d, d) each
        b_q, b_k, b_v = self.in_proj_bias.split(d, dim=1)  # (M, d) each
        query = torch.baddbmm(b_q.unsqueeze(1), self.probe.view(M, 1, d), w_q.transpose(1, 2))  # (M, 1, d)
        tokens = hidden.reshape(M, B * T, d)
        key = torch.baddbmm(b_k.unsqueeze(1), tokens, w_k.transpose(1, 2)).view(M, B, T, H, dk)
        value = torch.baddbmm(b_v.unsqueeze(1), tokens, w_v.transpose(1, 2)).view(M, B, T, H, dk)
        query = query.view(M, H, dk) * dk**-0.5
        scores = torch.einsum("mhk,mbthk->mbht", query, key)  # (M, B, H, T)
        weights = scores.softmax(dim=-1)
        context = torch.einsum("mbht,mbthk->mbhk", weights, value).reshape(M, B, d)  # (M, B, d)
        pooled = self.out_proj(context)  # (M, B, d)
        return pooled + self.mlp(self.layernorm(pooled))


class HydraSiglipVisionTower(HydraVisionTower):
    """SigLIP's vision transformer for M members: shared embeddings, fused layers, per-member
    ``post_layernorm`` and attention-pooling head."""

    def __init__(self, config: HydraEnsembleSiglipConfig, base: SiglipVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = SiglipVisionEmbeddings(base)
        self.layers = tower_layers(config, "vision", base)
        self.post_layernorm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
        self.head = HydraSiglipAttentionPoolingHead(config, base)

    def pool(self, hidden: torch.Tensor, input_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.post_layernorm(hidden)
        return hidden, self.head(hidden)  # (M, B, d)


class HydraSiglipTextTower(HydraTextTower):
    """SigLIP's text transformer for M members: shared embeddings, fused bidirectional layers (padding mask
    only), per-member ``final_layer_norm``, the last token pooled through every member's ``head``."""

    def __init__(self, config: HydraEnsembleSiglipConfig, base: SiglipTextConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = SiglipTextEmbeddings(base)
        self.layers = tower_layers(config, "text", base)
        self.final_layer_norm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
        self.head = HydraMemberLinear(config.num_members, base.hidden_size, base.projection_size)

    def pool(self, hidden: torch.Tensor, input_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.final_layer_norm(hidden)  # (M, N, T, d)
        return hidden, self.head(hidden[:, :, -1])  # (M, N, P): the last token, as transformers' SigLIP


class HydraEnsembleSiglipPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleSiglipConfig
    base_config_class = SiglipConfig
    base_model_prefix = "hydra_siglip"
    _no_split_modules = [
        "SiglipTextEmbeddings",
        "SiglipVisionEmbeddings",
        "HydraPreLNLayer",
        "HydraSiglipAttentionPoolingHead",
    ]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        vision = self.config.base_config.get("vision_config", {})
        std = vision.get("initializer_range", 0.02)
        if init_hydra_weights(module, std):
            return
        if isinstance(module, HydraSiglipAttentionPoolingHead):
            init.normal_(module.probe, std=std)
            init.normal_(module.in_proj_weight, std=std)
            init.zeros_(module.in_proj_bias)
        elif isinstance(module, SiglipVisionEmbeddings):
            init.normal_(module.patch_embedding.weight, std=std)
            init.zeros_(module.patch_embedding.bias)
            init.normal_(module.position_embedding.weight, std=module.embed_dim**-0.5)
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, SiglipTextEmbeddings):
            init.normal_(module.token_embedding.weight, std=std)
            init.normal_(module.position_embedding.weight, std=std)
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, HydraEnsembleSiglipModel):
            init.zeros_(module.logit_scale)
            init.zeros_(module.logit_bias)


class HydraEnsembleSiglipModel(HydraEnsembleSiglipPreTrainedModel, HydraTwoTowerModel):
    """M pruned SigLIP models in one: ``logits_per_image`` = logit of the members' mean sigmoid probability.

    ``AutoModel`` / ``AutoModelForZeroShotImageClassification.from_pretrained(folder, trust_remote_code=True)``
    and ``pipeline("zero-shot-image-classification", model=folder, trust_remote_code=True)`` use this class;
    the pipeline's scores are the mean of the members' sigmoid probabilities (see the module docstring).
    Its image and text embeddings are the towers' pooled outputs (the pooling head's, the text ``head``'s).
    """

    output_class = HydraSiglipOutput

    def __init__(self, config: HydraEnsembleSiglipConfig) -> None:
        super().__init__(config)
        base = self.base_config(config)
        M = config.num_members
        self.vision_model = HydraSiglipVisionTower(config, base.vision_config)
        self.text_model = HydraSiglipTextTower(config, base.text_config)
        self.logit_scale = nn.Parameter(torch.zeros(M, 1))  # member m's log temperature (stock shape (1,))
        self.logit_bias = nn.Parameter(torch.zeros(M, 1))
        self.post_init()

    def member_logits(self, image_embeds: torch.Tensor, text_embeds: torch.Tensor) -> torch.Tensor:
        cosine = torch.einsum("bmp,nmp->bmn", image_embeds, text_embeds)  # (B, M, N)
        return cosine * self.logit_scale.exp() + self.logit_bias  # (B, M, N); (M, 1) broadcasts

    def ensemble_logits(
        self, member_logits_per_image: torch.Tensor, member_logits_per_text: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits_per_image = ensemble_sigmoid_logits(member_logits_per_image)  # (B, N)
        return logits_per_image, logits_per_image.t()

    def member_loss(self, member_logits_per_image: torch.Tensor, member_logits_per_text: torch.Tensor) -> torch.Tensor:
        return siglip_member_loss(member_logits_per_text)


def siglip_member_loss(member_logits_per_text: torch.Tensor) -> torch.Tensor:
    """Mean over members of SigLIP's sigmoid loss (text i matches image i, every other pair does not).

    Shape: ``member_logits_per_text (N, M, B)`` with ``N == B``.
    """
    N, M, B = member_logits_per_text.shape
    if N != B:
        raise ValueError(f"return_loss needs one text per image (matching pairs), got {B} images and {N} texts")
    per_member = member_logits_per_text.transpose(0, 1)  # (M, N, B)
    signs = 2 * torch.eye(N, device=per_member.device, dtype=per_member.dtype) - 1  # +1 on the diagonal, -1 off it
    nll = -F.logsigmoid(signs * per_member).sum(dim=-1)  # (M, N)
    return nll.mean()
