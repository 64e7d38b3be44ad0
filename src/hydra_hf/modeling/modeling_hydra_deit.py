# Shipped with every DeiT Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a DeiT image classifier: M head-pruned members run as one model in one pass.

DeiT is ViT with a distillation token: shared patch/position embeddings and the [CLS] and distillation
tokens feed M residual streams through pre-LN layers (per-member LayerNorms, fused attention over all
members' kept heads, averaged or per-member MLP), then every member's own final LayerNorm and head(s):

- ``DeiTForImageClassification``: one classifier on the [CLS] token;
- ``DeiTForImageClassificationWithTeacher`` (``config.distilled``): ``cls_classifier`` on the [CLS]
  token and ``distillation_classifier`` on the distillation token; member m's logits are the mean of
  its two heads' logits, exactly as the stock model's.

``logits`` = log of the mean of the members' softmaxes. Input images: the base's size unless
``interpolate_pos_encoding=True``, as in transformers' DeiT.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DeiTConfig
from transformers import initialization as init
from transformers.models.deit.modeling_deit import DeiTEmbeddings

from .configuration_hydra import HydraEnsembleDeiTConfig
from .hydra_layers import (
    HydraClassifierOutput,
    HydraLayerNorm,
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


def deit_base_config(config: HydraEnsembleDeiTConfig) -> DeiTConfig:
    """The base DeiT configuration stored in ``config.base_config``."""
    return DeiTConfig.from_dict(config.base_config)


class HydraEnsembleDeiTPreTrainedModel(HydraPreTrainedModel):
    config_class = HydraEnsembleDeiTConfig
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _no_split_modules = ["DeiTEmbeddings", "HydraPreLNLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.base_config.get("initializer_range", 0.02)
        if init_hydra_weights(module, std):
            return
        if isinstance(module, DeiTEmbeddings):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
            init.trunc_normal_(module.distillation_token, mean=0.0, std=std)
        elif isinstance(module, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
            super()._init_weights(module)


class HydraEnsembleDeiTModel(HydraEnsembleDeiTPreTrainedModel):
    """The fused DeiT encoder: shared DeiT embeddings, M residual streams, per-member final LayerNorms.

    Returns ``last_hidden_state (B, M, T, d)``: token 0 is [CLS], token 1 the distillation token.
    """

    def __init__(self, config: HydraEnsembleDeiTConfig) -> None:
        super().__init__(config)
        base = deit_base_config(config)
        self.embeddings = DeiTEmbeddings(base)
        self.layers = nn.ModuleList(
            HydraPreLNLayer(
                config,
                layer_spec(
                    config.kept_heads, i, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
                    intermediate_size=base.intermediate_size, hidden_act=base.hidden_act,
                    layer_norm_eps=base.layer_norm_eps, attention_dropout=base.attention_probs_dropout_prob,
                    hidden_dropout=base.hidden_dropout_prob, mlp_fusion=config.mlp_fusion,
                ),
            )
            for i in range(base.num_hidden_layers)
        )
        self.layernorm = HydraLayerNorm(config.num_members, base.hidden_size, base.layer_norm_eps)
        self.post_init()

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
        )  # (M, B, T, d)
        last = self.layernorm(hidden).transpose(0, 1)  # (B, M, T, d)
        if not return_dict:
            return tuple(v for v in (last, all_hidden, all_attentions) if v is not None)
        return HydraModelOutput(last_hidden_state=last, hidden_states=all_hidden, attentions=all_attentions)


class HydraEnsembleDeiTForImageClassification(HydraEnsembleDeiTPreTrainedModel):
    """M pruned DeiT classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    With ``config.distilled`` every member has the two heads of ``DeiTForImageClassificationWithTeacher``
    (``cls_classifier``, ``distillation_classifier``, each ``(M, C, d)``) and member m's logits are their
    mean; otherwise one ``classifier`` on the [CLS] token. ``AutoModelForImageClassification`` and
    ``pipeline("image-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    def __init__(self, config: HydraEnsembleDeiTConfig) -> None:
        super().__init__(config)
        base = deit_base_config(config)
        M, d, C = config.num_members, base.hidden_size, config.num_labels
        self.num_labels = C
        self.hydra = HydraEnsembleDeiTModel(config)
        if config.distilled:
            self.cls_classifier = HydraMemberLinear(M, d, C)
            self.distillation_classifier = HydraMemberLinear(M, d, C)
        else:
            self.classifier = HydraMemberLinear(M, d, C)
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
        tokens = outputs.last_hidden_state.transpose(0, 1)  # (M, B, T, d)
        if self.config.distilled:
            cls_logits = self.cls_classifier(tokens[:, :, 0])  # (M, B, C)
            distillation_logits = self.distillation_classifier(tokens[:, :, 1])  # (M, B, C)
            member_logits = ((cls_logits + distillation_logits) / 2).transpose(0, 1)  # (B, M, C)
        else:
            member_logits = self.classifier(tokens[:, :, 0]).transpose(0, 1)  # (B, M, C): [CLS] tokens
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
