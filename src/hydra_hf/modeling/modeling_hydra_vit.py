# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a ViT image classifier: M head-pruned members run as one model in one pass.

Shared patch/position embeddings feed M residual streams. Every layer is ViT's pre-LN layer with
per-member LayerNorms before the fused self-attention (all members' kept heads in one attention call)
and before the MLP (averaged across members, or kept per member). Every member has its own final
LayerNorm and classifier on its CLS token; the prediction is the mean of the members' softmaxes.

The pre-LN layer (``HydraPreLNLayer``), the weight initialisation and the tower output are shared
with the CLIP model (``modeling_hydra_clip.py``), whose towers are pre-LN transformers too.

Input images: ``pixel_values (B, C, H, W)`` must have the base's channel count and, unless
``interpolate_pos_encoding=True`` (bicubic interpolation of the position embeddings, as in
transformers' ``ViTForImageClassification``), the base's image size; anything else raises a
``ValueError`` that says how to fix it. Use the image processor saved with the model.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel, ViTConfig
from transformers import initialization as init
from transformers.models.vit.modeling_vit import ViTEmbeddings

from .configuration_hydra import HydraEnsembleViTConfig
from .hydra_layers import (
    HydraClassifierOutput,
    HydraLayerNorm,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraMLP,
    HydraModelOutput,
    HydraSelfAttention,
    ensemble_outputs,
    init_hydra_weights,
    run_layers,
)

# the output classes are shared by every family (hydra_layers); these names are kept for ViT/CLIP
HydraTowerOutput = HydraModelOutput
HydraImageClassifierOutput = HydraClassifierOutput


def layer_spec(
    kept_heads: list[list[list[int]]], layer_idx: int, *, hidden_size: int, num_heads: int, intermediate_size: int,
    hidden_act: str, layer_norm_eps: float, attention_dropout: float, hidden_dropout: float, mlp_fusion: str,
) -> HydraLayerSpec:
    """The spec of fused layer ``layer_idx`` from the members' ``kept_heads[m][l]`` and the base's sizes."""
    return HydraLayerSpec(
        hidden_size=hidden_size,
        num_heads=num_heads,
        kept_heads=tuple(tuple(member[layer_idx]) for member in kept_heads),
        intermediate_size=intermediate_size,
        hidden_act=hidden_act,
        layer_norm_eps=layer_norm_eps,
        attention_dropout=attention_dropout,
        hidden_dropout=hidden_dropout,
        mlp_fusion=mlp_fusion,
    )


class HydraPreLNLayer(nn.Module):
    """A pre-LN transformer layer for M members (ViT, CLIP towers):
    ``h = h + Attn(LN1_m(h)); h = h + MLP(LN2_m(h))``, with member m's own LayerNorms and heads."""

    def __init__(self, config, spec: HydraLayerSpec, is_causal: bool = False) -> None:
        super().__init__()
        self.norm1 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.attention = HydraSelfAttention(config, spec, is_causal=is_causal)
        self.norm2 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.mlp = HydraMLP(spec)
        self.dropout = nn.Dropout(spec.hidden_dropout)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)``."""
        normed = self.norm1(hidden, shared=hidden.dim() == 3)  # (M, B, T, d): member m's own LayerNorm
        attn, weights = self.attention(normed, attention_mask)  # (M, B, T, d)
        hidden = hidden + self.dropout(attn)  # broadcasts a shared input over M
        hidden = hidden + self.dropout(self.mlp(self.norm2(hidden)))
        return hidden, weights


def check_pixel_values(
    pixel_values: torch.Tensor | None, num_channels: int, image_size: tuple[int, int], interpolate_pos_encoding: bool
) -> None:
    """``ValueError`` (with the fix) unless ``pixel_values`` is ``(B, num_channels, *image_size)``; any
    size is accepted with ``interpolate_pos_encoding``."""
    if pixel_values is None:
        raise ValueError("pixel_values is required: (batch, channels, height, width) from the model's image processor")
    if not isinstance(pixel_values, torch.Tensor):
        raise TypeError(f"pixel_values must be a torch.Tensor, got {type(pixel_values).__name__}")
    if pixel_values.dim() != 4:
        raise ValueError(
            f"pixel_values must have shape (batch, {num_channels}, {image_size[0]}, {image_size[1]}), got "
            f"{tuple(pixel_values.shape)}; add the batch dimension with pixel_values.unsqueeze(0)"
        )
    _, channels, height, width = pixel_values.shape
    if channels != num_channels:
        raise ValueError(
            f"pixel_values has {channels} channels but the model takes {num_channels}; convert the images "
            f"(e.g. image.convert('RGB') for grayscale/RGBA) and use the model's image processor"
        )
    if not interpolate_pos_encoding and (height, width) != tuple(image_size):
        raise ValueError(
            f"pixel_values are {height}x{width} but the model takes {image_size[0]}x{image_size[1]} images; resize "
            "them with the model's image processor, or pass interpolate_pos_encoding=True to interpolate the "
            "position embeddings"
        )


def vit_base_config(config: HydraEnsembleViTConfig) -> ViTConfig:
    """The base ViT configuration stored in ``config.base_config``."""
    return ViTConfig.from_dict(config.base_config)


class HydraEnsembleViTPreTrainedModel(PreTrainedModel):
    config_class = HydraEnsembleViTConfig
    base_model_prefix = "hydra"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _supports_sdpa = True
    _supports_attention_backend = False
    _no_split_modules = ["ViTEmbeddings", "HydraPreLNLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.base_config.get("initializer_range", 0.02)
        if init_hydra_weights(module, std):
            return
        if isinstance(module, ViTEmbeddings):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
        elif isinstance(module, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
            super()._init_weights(module)


class HydraEnsembleViTModel(HydraEnsembleViTPreTrainedModel):
    """The fused ViT encoder: shared ViT embeddings, M residual streams, per-member final LayerNorms.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class. (A stock
    ``ViTModel``'s pooler is not part of it: image classification reads the CLS token.)
    """

    def __init__(self, config: HydraEnsembleViTConfig) -> None:
        super().__init__(config)
        base = vit_base_config(config)
        self.embeddings = ViTEmbeddings(base)
        self.layers = nn.ModuleList(
            HydraPreLNLayer(config, self._spec(config, base, i)) for i in range(base.num_hidden_layers)
        )
        self.layernorm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
        self.post_init()

    @staticmethod
    def _spec(config: HydraEnsembleViTConfig, base: ViTConfig, layer_idx: int) -> HydraLayerSpec:
        return layer_spec(
            config.kept_heads, layer_idx, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
            intermediate_size=base.intermediate_size, hidden_act=base.hidden_act, layer_norm_eps=base.layer_norm_eps,
            attention_dropout=base.attention_probs_dropout_prob, hidden_dropout=base.hidden_dropout_prob,
            mlp_fusion=config.mlp_fusion,
        )

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HydraTowerOutput | tuple:
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = self.config.return_dict if return_dict is None else return_dict
        patch = self.embeddings.patch_embeddings
        check_pixel_values(pixel_values, patch.num_channels, patch.image_size, bool(interpolate_pos_encoding))
        pixel_values = pixel_values.to(patch.projection.weight.dtype)
        embeddings = self.embeddings(pixel_values, interpolate_pos_encoding=bool(interpolate_pos_encoding))  # (B, T, d)
        hidden, all_hidden, all_attentions = run_layers(
            self.layers, embeddings, self.config.num_members, None, output_hidden_states, output_attentions
        )
        last = self.layernorm(hidden).transpose(0, 1)  # (B, M, T, d)
        if not return_dict:
            return tuple(v for v in (last, all_hidden, all_attentions) if v is not None)
        return HydraTowerOutput(last_hidden_state=last, hidden_states=all_hidden, attentions=all_attentions)


class HydraEnsembleForImageClassification(HydraEnsembleViTPreTrainedModel):
    """M pruned ViT classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    ``AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("image-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    def __init__(self, config: HydraEnsembleViTConfig) -> None:
        super().__init__(config)
        base = vit_base_config(config)
        self.num_labels = config.num_labels
        self.hydra = HydraEnsembleViTModel(config)
        self.classifier = HydraMemberLinear(config.num_members, base.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HydraImageClassifierOutput | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hydra(
            pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        cls = outputs.last_hidden_state[:, :, 0].transpose(0, 1)  # (M, B, d): every member's CLS token
        member_logits = self.classifier(cls).transpose(0, 1)  # (B, M, C)
        logits, loss = ensemble_outputs(member_logits, labels, self.config)
        if not return_dict:
            out = (logits, member_logits, outputs.hidden_states, outputs.attentions)
            out = tuple(v for v in out if v is not None)
            return ((loss,) + out) if loss is not None else out
        return HydraImageClassifierOutput(
            loss=loss,
            logits=logits,
            member_logits=member_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
