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

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import CLIPConfig, CLIPTextConfig, CLIPVisionConfig
from transformers import initialization as init
from transformers.models.clip.modeling_clip import (
    CLIPTextEmbeddings,
    CLIPVisionEmbeddings,
)
from transformers.utils import ModelOutput

from .configuration_hydra import HydraEnsembleCLIPConfig
from .hydra_layers import (
    HydraLayerNorm,
    HydraMemberLinear,
    HydraModelOutput,
    HydraPreLNLayer,
    HydraPreTrainedModel,
    check_pixel_values,
    ensemble_log_probs,
    init_hydra_weights,
    layer_spec,
    may_mask,
    run_layers,
)


@dataclass
class HydraCLIPOutput(ModelOutput):
    """
    Args:
        loss: mean over members of each member's CLIP contrastive loss, with ``return_loss=True``.
        logits_per_image: ``(B, N)`` log of the mean over members of the softmax over the N texts.
        logits_per_text: ``(N, B)`` log of the mean over members of the softmax over the B images.
        member_logits_per_image: ``(B, M, N)`` member m's scaled cosine similarities.
        member_logits_per_text: ``(N, M, B)`` the same, per text.
        text_embeds: ``(N, M, P)`` L2-normalised projected text embeddings of every member.
        image_embeds: ``(B, M, P)`` L2-normalised projected image embeddings of every member.
        text_model_output, vision_model_output: the towers' ``HydraModelOutput``.
    """

    loss: torch.Tensor | None = None
    logits_per_image: torch.Tensor | None = None
    logits_per_text: torch.Tensor | None = None
    member_logits_per_image: torch.Tensor | None = None
    member_logits_per_text: torch.Tensor | None = None
    text_embeds: torch.Tensor | None = None
    image_embeds: torch.Tensor | None = None
    text_model_output: HydraModelOutput | None = None
    vision_model_output: HydraModelOutput | None = None

    def to_tuple(self) -> tuple:
        return tuple(
            self[k] if k not in ("text_model_output", "vision_model_output") else getattr(self, k).to_tuple()
            for k in self.keys()
        )


def clip_base_config(config: HydraEnsembleCLIPConfig) -> CLIPConfig:
    """The base CLIP configuration stored in ``config.base_config``."""
    return CLIPConfig.from_dict(config.base_config)


def _tower_layers(config: HydraEnsembleCLIPConfig, tower: str, base: CLIPVisionConfig | CLIPTextConfig) -> nn.ModuleList:
    kept = config.kept_heads_of(tower)
    return nn.ModuleList(
        HydraPreLNLayer(
            config,
            layer_spec(
                kept, i, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
                intermediate_size=base.intermediate_size, hidden_act=base.hidden_act,
                layer_norm_eps=base.layer_norm_eps, attention_dropout=base.attention_dropout, hidden_dropout=0.0,
                mlp_fusion=config.mlp_fusion,
            ),
            is_causal=tower == "text",
        )
        for i in range(base.num_hidden_layers)
    )


class HydraCLIPVisionTower(nn.Module):
    """CLIP's vision transformer for M members: shared embeddings and ``pre_layrnorm``, fused layers,
    per-member ``post_layernorm`` on the CLS token."""

    def __init__(self, config: HydraEnsembleCLIPConfig, base: CLIPVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = CLIPVisionEmbeddings(base)
        self.pre_layrnorm = nn.LayerNorm(base.hidden_size, eps=base.layer_norm_eps)
        self.layers = _tower_layers(config, "vision", base)
        self.post_layernorm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)

    def forward(
        self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False, output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> HydraModelOutput:
        emb = self.embeddings
        size = (emb.image_size, emb.image_size)
        check_pixel_values(pixel_values, emb.patch_embedding.in_channels, size, bool(interpolate_pos_encoding))
        hidden = self.pre_layrnorm(self.embeddings(pixel_values, interpolate_pos_encoding=bool(interpolate_pos_encoding)))
        hidden, all_hidden, all_attentions = run_layers(
            self.layers, hidden, self.config.num_members, None, output_hidden_states, output_attentions
        )  # (M, B, T, d)
        pooled = self.post_layernorm(hidden[:, :, 0])  # (M, B, d): every member's CLS token
        return HydraModelOutput(
            last_hidden_state=hidden.transpose(0, 1), pooler_output=pooled.transpose(0, 1),
            hidden_states=all_hidden, attentions=all_attentions,
        )


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


class HydraCLIPTextTower(nn.Module):
    """CLIP's text transformer for M members: shared embeddings, fused causal layers, per-member
    ``final_layer_norm``, pooled at the end-of-text token exactly as transformers' ``CLIPTextTransformer``
    (``eos_token_id == 2``: the legacy argmax of ``input_ids``; else the first ``eos_token_id``)."""

    def __init__(self, config: HydraEnsembleCLIPConfig, base: CLIPTextConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = CLIPTextEmbeddings(base)
        self.layers = _tower_layers(config, "text", base)
        self.final_layer_norm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
        self.eos_token_id = base.eos_token_id

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None, output_attentions: bool = False, output_hidden_states: bool = False,
    ) -> HydraModelOutput:
        if input_ids is None:
            raise ValueError("input_ids is required: the texts tokenized with the model's tokenizer")
        input_ids = input_ids.view(-1, input_ids.shape[-1])  # (N, T)
        hidden = self.embeddings(input_ids=input_ids, position_ids=position_ids)  # (N, T, d)
        N, T, _ = hidden.shape
        padded = may_mask(attention_mask)  # False for no mask or (eager only) an all-ones mask
        mask = None  # causal only: SDPA applies it itself (is_causal), which keeps its fast kernels
        if padded or self.config._attn_implementation != "sdpa":
            mask = causal_additive_mask(attention_mask if padded else None, T, hidden.dtype, hidden.device)
        hidden, all_hidden, all_attentions = run_layers(
            self.layers, hidden, self.config.num_members, mask, output_hidden_states, output_attentions
        )
        hidden = self.final_layer_norm(hidden)  # (M, N, T, d)
        ids = input_ids.to(dtype=torch.int, device=hidden.device)
        if self.eos_token_id == 2:  # legacy configs: the end-of-text token has the largest id
            eot = ids.argmax(dim=-1)  # (N,)
        else:  # the first end-of-text token (padding may use the same id)
            eot = (ids == self.eos_token_id).int().argmax(dim=-1)  # (N,)
        pooled = hidden[:, torch.arange(N, device=hidden.device), eot]  # (M, N, d)
        return HydraModelOutput(
            last_hidden_state=hidden.transpose(0, 1), pooler_output=pooled.transpose(0, 1),
            hidden_states=all_hidden, attentions=all_attentions,
        )


class HydraEnsembleCLIPPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleCLIPConfig
    base_model_prefix = "hydra_clip"
    input_modalities = ("image", "text")
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


class HydraEnsembleCLIPModel(HydraEnsembleCLIPPreTrainedModel):
    """M pruned CLIP models in one: zero-shot ``logits_per_image`` = log of the members' mean softmax.

    ``AutoModel`` / ``AutoModelForZeroShotImageClassification.from_pretrained(folder, trust_remote_code=True)``
    and ``pipeline("zero-shot-image-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    def __init__(self, config: HydraEnsembleCLIPConfig) -> None:
        super().__init__(config)
        base = clip_base_config(config)
        M, P = config.num_members, base.projection_dim
        self.vision_model = HydraCLIPVisionTower(config, base.vision_config)
        self.text_model = HydraCLIPTextTower(config, base.text_config)
        self.visual_projection = HydraMemberLinear(M, base.vision_config.hidden_size, P, bias=False)
        self.text_projection = HydraMemberLinear(M, base.text_config.hidden_size, P, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(float(base.logit_scale_init_value)))
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.text_model.embeddings.token_embedding

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.text_model.embeddings.token_embedding = value

    def get_text_features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None, **kwargs,
    ) -> torch.Tensor:
        """Every member's projected text embeddings ``(N, M, P)`` (not normalised)."""
        pooled = self.text_model(input_ids, attention_mask, position_ids).pooler_output  # (N, M, d)
        return self.text_projection(pooled.transpose(0, 1)).transpose(0, 1)  # (N, M, P)

    def get_image_features(
        self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False, **kwargs
    ) -> torch.Tensor:
        """Every member's projected image embeddings ``(B, M, P)`` (not normalised)."""
        pooled = self.vision_model(pixel_values, interpolate_pos_encoding).pooler_output  # (B, M, d)
        return self.visual_projection(pooled.transpose(0, 1)).transpose(0, 1)  # (B, M, P)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        return_loss: bool | None = None,
        interpolate_pos_encoding: bool = False,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HydraCLIPOutput | tuple:
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = self.config.return_dict if return_dict is None else return_dict
        vision = self.vision_model(pixel_values, interpolate_pos_encoding, output_attentions, output_hidden_states)
        text = self.text_model(input_ids, attention_mask, position_ids, output_attentions, output_hidden_states)
        image_embeds = self.visual_projection(vision.pooler_output.transpose(0, 1)).transpose(0, 1)  # (B, M, P)
        text_embeds = self.text_projection(text.pooler_output.transpose(0, 1)).transpose(0, 1)  # (N, M, P)
        image_embeds = image_embeds / image_embeds.norm(p=2, dim=-1, keepdim=True)
        text_embeds = text_embeds / text_embeds.norm(p=2, dim=-1, keepdim=True)
        scale = self.logit_scale.exp()
        member_logits_per_image = scale * torch.einsum("bmp,nmp->bmn", image_embeds, text_embeds)  # (B, M, N)
        member_logits_per_text = member_logits_per_image.permute(2, 1, 0)  # (N, M, B)
        logits_per_image = ensemble_log_probs(member_logits_per_image)  # (B, N)
        logits_per_text = ensemble_log_probs(member_logits_per_text)  # (N, B)
        loss = None
        if return_loss:
            loss = clip_member_loss(member_logits_per_image)
        out = HydraCLIPOutput(
            loss=loss,
            logits_per_image=logits_per_image,
            logits_per_text=logits_per_text,
            member_logits_per_image=member_logits_per_image,
            member_logits_per_text=member_logits_per_text,
            text_embeds=text_embeds,
            image_embeds=image_embeds,
            text_model_output=text,
            vision_model_output=vision,
        )
        return out if return_dict else out.to_tuple()


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
