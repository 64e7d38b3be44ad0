# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a CLIP model for zero-shot image classification.

Member m = pruned vision tower m + pruned text tower m, both run fused with the other members' towers
(one pass per tower). Each tower follows transformers' CLIP: shared embeddings (and, in the vision
tower, the shared ``pre_layrnorm`` applied to them), pre-LN layers with per-member LayerNorms, fused
attention (causal in the text tower) and MLP, then a per-member final LayerNorm, pooling (CLS token;
EOT token in the text tower) and a per-member projection. ``logit_scale`` is shared.

Zero-shot prediction: member m scores image b against text n with its scaled cosine similarity
``member_logits_per_image[b, m, n]``; ``logits_per_image[b]`` is the log of the mean over members of
the softmax over the texts, so transformers' ``zero-shot-image-classification`` pipeline (which
applies a softmax to ``logits_per_image``) returns the ensemble mean.
"""

# Route of forward: what HydraEnsembleCLIPModel(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraTwoTowerModel.forward
#     hydra_skeletons.py: resolve_output_flags
#     hydra_skeletons.py: HydraVisionTower.forward
#       hydra_skeletons.py: check_pixel_values
#       modeling_hydra_clip.py: HydraCLIPVisionTower.embed
#         transformers: CLIPVisionEmbeddings.forward
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
#                 transformers: QuickGELUActivation.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#         modeling_hydra_clip.py: HydraCLIPVisionTower.pool
#           hydra_layers.py: HydraLayerNorm.forward
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     hydra_skeletons.py: HydraTextTower.forward
#       transformers: CLIPTextEmbeddings.forward
#       modeling_hydra_clip.py: HydraCLIPTextTower.text_mask
#         hydra_layers.py: may_mask
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
#                 transformers: QuickGELUActivation.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#         modeling_hydra_clip.py: HydraCLIPTextTower.pool
#           hydra_layers.py: HydraLayerNorm.forward
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     modeling_hydra_clip.py: HydraEnsembleCLIPModel.image_embeds
#       hydra_layers.py: HydraMemberLinear.forward
#     modeling_hydra_clip.py: HydraEnsembleCLIPModel.text_embeds
#       hydra_layers.py: HydraMemberLinear.forward
#     modeling_hydra_clip.py: HydraEnsembleCLIPModel.member_logits
#     modeling_hydra_clip.py: HydraEnsembleCLIPModel.ensemble_logits
#       hydra_formulas.py: ensemble_log_probs
#         hydra_formulas.py: log_mean_exp
#     hydra_skeletons.py: unit_mean
# (end of the route map)

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import CLIPConfig, CLIPTextConfig, CLIPVisionConfig
from transformers import initialization as init
from transformers.models.clip.modeling_clip import CLIPTextEmbeddings, CLIPVisionEmbeddings

from .configuration_hydra_clip import HydraEnsembleCLIPConfig
from .hydra_formulas import ensemble_log_probs
from .hydra_layers import HydraLayerNorm, HydraMemberLinear, HydraPreTrainedModel, init_hydra_weights, may_mask
from .hydra_skeletons import HydraTextTower, HydraTwoTowerModel, HydraTwoTowerOutput, HydraVisionTower, tower_layers


@dataclass
class HydraCLIPOutput(HydraTwoTowerOutput):
    """
    Args:
        loss: mean over members of each member's CLIP contrastive loss, with ``return_loss=True``.
        logits_per_image: ``(B, N)`` log of the mean over members of the softmax over the N texts.
        logits_per_text: ``(N, B)`` log of the mean over members of the softmax over the B images.
        member_logits_per_image: ``(B, M, N)`` member m's scaled cosine similarities.
        member_logits_per_text: ``(N, M, B)`` the same, per text.
        text_embeds, image_embeds: ``(N, P)``, ``(B, P)`` the members' mean of ``member_text_embeds`` /
            ``member_image_embeds``, L2-normalised (the stock fields' shapes).
        text_model_output, vision_model_output: the towers' ``HydraModelOutput``.
        member_text_embeds: ``(N, M, P)`` L2-normalised projected text embeddings of every member.
        member_image_embeds: ``(B, M, P)`` L2-normalised projected image embeddings of every member.
    """


class HydraCLIPVisionTower(HydraVisionTower):
    """CLIP's vision transformer for M members: shared embeddings and ``pre_layrnorm``, fused layers,
    per-member ``post_layernorm`` on the CLS token."""

    def __init__(self, config: HydraEnsembleCLIPConfig, base: CLIPVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = CLIPVisionEmbeddings(base)
        self.pre_layrnorm = nn.LayerNorm(base.hidden_size, eps=base.layer_norm_eps)
        self.layers = tower_layers(config, "vision", base)
        self.post_layernorm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)

    def embed(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool) -> torch.Tensor:
        return self.pre_layrnorm(self.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding))

    def pool(self, hidden: torch.Tensor, input_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return hidden, self.post_layernorm(hidden[:, :, 0])  # (M, B, d): every member's CLS token


def causal_additive_mask(
    attention_mask: torch.Tensor | None, num_tokens: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Causal mask combined with an optional ``(B, T)`` 1/0 padding mask, additive ``(B or 1, 1, T, T)``
    (0 = attend, dtype-min = masked), as transformers' ``create_causal_mask`` builds for CLIP's text tower."""
    allowed = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).tril()[None, None]  # (1, 1, T, T)
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[-1] != num_tokens:
            raise ValueError(
                f"attention_mask must have shape (batch, {num_tokens}) with 1 for tokens and 0 for padding, "
                f"got {tuple(attention_mask.shape)}"
            )
        allowed = allowed & attention_mask.bool()[:, None, None, :]  # (B, 1, T, T)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


class HydraCLIPTextTower(HydraTextTower):
    """CLIP's text transformer for M members: shared embeddings, fused causal layers, per-member
    ``final_layer_norm``, pooled at the end-of-text token exactly as transformers' ``CLIPTextTransformer``
    (``eos_token_id == 2``: the legacy argmax of ``input_ids``; else the first ``eos_token_id``)."""

    def __init__(self, config: HydraEnsembleCLIPConfig, base: CLIPTextConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = CLIPTextEmbeddings(base)
        self.layers = tower_layers(config, "text", base, is_causal=True)
        self.final_layer_norm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
        self.eos_token_id = base.eos_token_id

    def text_mask(self, attention_mask: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor | None:
        padded = may_mask(attention_mask)  # False for no mask or (eager only) an all-ones mask
        if not padded and self.config._attn_implementation == "sdpa":
            return None  # causal only: SDPA applies it itself (is_causal), which keeps its fast kernels
        return causal_additive_mask(attention_mask if padded else None, hidden.shape[1], hidden.dtype, hidden.device)

    def pool(self, hidden: torch.Tensor, input_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.final_layer_norm(hidden)  # (M, N, T, d)
        ids = input_ids.to(dtype=torch.int, device=hidden.device)
        if self.eos_token_id == 2:  # legacy configs: the end-of-text token has the largest id
            eot = ids.argmax(dim=-1)  # (N,)
        else:  # the first end-of-text token (padding may use the same id)
            eot = (ids == self.eos_token_id).int().argmax(dim=-1)  # (N,)
        return hidden, hidden[:, torch.arange(ids.shape[0], device=hidden.device), eot]  # (M, N, d)


class HydraEnsembleCLIPPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleCLIPConfig
    base_config_class = CLIPConfig
    base_model_prefix = "hydra_clip"
    _no_split_modules = ["CLIPTextEmbeddings", "CLIPVisionEmbeddings", "HydraPreLNLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        base = self.config.base_config
        std = base.get("initializer_range", base.get("vision_config", {}).get("initializer_range", 0.02))
        if init_hydra_weights(module, std):
            return
        if isinstance(module, CLIPVisionEmbeddings):
            init.normal_(module.class_embedding, mean=0.0, std=module.embed_dim**-0.5)
            init.normal_(module.patch_embedding.weight, std=std)
            init.normal_(module.position_embedding.weight, std=std)
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, CLIPTextEmbeddings):
            init.normal_(module.token_embedding.weight, mean=0.0, std=std)
            init.normal_(module.position_embedding.weight, mean=0.0, std=std)
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, HydraEnsembleCLIPModel):
            init.constant_(module.logit_scale, float(base.get("logit_scale_init_value", 2.6592)))
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class HydraEnsembleCLIPModel(HydraEnsembleCLIPPreTrainedModel, HydraTwoTowerModel):
    """M pruned CLIP models in one: zero-shot ``logits_per_image`` = log of the members' mean softmax.

    ``AutoModel`` / ``AutoModelForZeroShotImageClassification.from_pretrained(folder, trust_remote_code=True)``
    and ``pipeline("zero-shot-image-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    output_class = HydraCLIPOutput

    def __init__(self, config: HydraEnsembleCLIPConfig) -> None:
        super().__init__(config)
        base = self.base_config(config)
        M, P = config.num_members, base.projection_dim
        self.vision_model = HydraCLIPVisionTower(config, base.vision_config)
        self.text_model = HydraCLIPTextTower(config, base.text_config)
        self.visual_projection = HydraMemberLinear(M, base.vision_config.hidden_size, P, bias=False)
        self.text_projection = HydraMemberLinear(M, base.text_config.hidden_size, P, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(float(base.logit_scale_init_value)))
        self.post_init()

    def image_embeds(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.visual_projection(pooled.transpose(0, 1)).transpose(0, 1)  # (B, M, P)

    def text_embeds(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.text_projection(pooled.transpose(0, 1)).transpose(0, 1)  # (N, M, P)

    def member_logits(self, image_embeds: torch.Tensor, text_embeds: torch.Tensor) -> torch.Tensor:
        return self.logit_scale.exp() * torch.einsum("bmp,nmp->bmn", image_embeds, text_embeds)  # (B, M, N)

    def ensemble_logits(
        self, member_logits_per_image: torch.Tensor, member_logits_per_text: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ensemble_log_probs(member_logits_per_image), ensemble_log_probs(member_logits_per_text)

    def member_loss(self, member_logits_per_image: torch.Tensor, member_logits_per_text: torch.Tensor) -> torch.Tensor:
        return clip_member_loss(member_logits_per_image)


def clip_member_loss(member_logits_per_image: torch.Tensor) -> torch.Tensor:
    """Mean over members of CLIP's symmetric contrastive loss (image i matches text i).

    Shape: ``member_logits_per_image (B, M, B)``.
    """
    B, M, N = member_logits_per_image.shape
    if B != N:
        raise ValueError(f"return_loss needs one text per image (matching pairs), got {B} images and {N} texts")
    per_member = member_logits_per_image.transpose(0, 1)  # (M, B, N)
    target = torch.arange(B, device=per_member.device).repeat(M)  # (M*B,)
    image_loss = F.cross_entropy(per_member.reshape(M * B, N), target)
    text_loss = F.cross_entropy(per_member.transpose(1, 2).reshape(M * N, B), target)
    return (image_loss + text_loss) / 2
