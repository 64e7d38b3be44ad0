# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a ViT image classifier: M head-pruned members run as one model in one pass.

Shared patch/position embeddings feed M residual streams. Every layer is ViT's pre-LN layer with
per-member LayerNorms before the fused self-attention (all members' kept heads in one attention call)
and before the MLP (averaged across members, or kept per member). Every member has its own final
LayerNorm and classifier on its CLS token; the prediction is the mean of the members' softmaxes.

The pre-LN layer (``HydraPreLNLayer``, in ``hydra_layers.py``), the weight initialisation and the tower
output are shared with the other pre-LN families (CLIP, DeiT, BEiT, DINOv2, SigLIP).

Input images: ``pixel_values (B, C, H, W)`` must have the base's channel count and, unless
``interpolate_pos_encoding=True`` (bicubic interpolation of the position embeddings, as in
transformers' ``ViTForImageClassification``), the base's image size; anything else raises a
``ValueError`` that says how to fix it. Use the image processor saved with the model.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import ViTConfig
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.vit.modeling_vit import ViTEmbeddings

from .configuration_hydra import HydraEnsembleViTConfig
from .hydra_layers import (
    HydraClassifierOutput,
    HydraLayerNorm,
    HydraLayerSpec,
    HydraMemberLinear,
    HydraModelOutput,
    HydraPreLNLayer,
    HydraPreTrainedModel,
    check_pixel_values,
    ensemble_outputs,
    init_hydra_weights,
    layer_spec,
    run_layers,
)



def vit_base_config(config: HydraEnsembleViTConfig) -> ViTConfig:
    """The base ViT configuration stored in ``config.base_config``."""
    return ViTConfig.from_dict(config.base_config)


class HydraEnsembleViTPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleViTConfig
    main_input_name = "pixel_values"
    input_modalities = ("image",)
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
    ) -> HydraModelOutput | tuple:
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
        return HydraModelOutput(last_hidden_state=last, hidden_states=all_hidden, attentions=all_attentions)


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
    ) -> HydraClassifierOutput | tuple:
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
        return HydraClassifierOutput(
            loss=loss,
            logits=logits,
            member_logits=member_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
