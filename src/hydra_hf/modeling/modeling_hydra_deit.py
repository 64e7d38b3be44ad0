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
from transformers import DeiTConfig
from transformers.models.deit.modeling_deit import DeiTEmbeddings

from .configuration_hydra_deit import HydraEnsembleDeiTConfig
from .hydra_layers import HydraMemberLinear, HydraModelOutput
from .hydra_skeletons import HydraPreLNVisionModel, HydraVisionForImageClassification, HydraVisionPreTrainedModel


class HydraEnsembleDeiTPreTrainedModel(HydraVisionPreTrainedModel):
    config_class = HydraEnsembleDeiTConfig
    base_config_class = DeiTConfig
    embeddings_class = DeiTEmbeddings
    trunc_normal_tokens = ("position_embeddings", "cls_token", "distillation_token")
    _no_split_modules = ["DeiTEmbeddings", "HydraPreLNLayer"]


class HydraEnsembleDeiTModel(HydraEnsembleDeiTPreTrainedModel, HydraPreLNVisionModel):
    """The fused DeiT encoder: shared DeiT embeddings, M residual streams, per-member final LayerNorms.

    Returns ``member_last_hidden_state (B, M, T, d)`` (token 0 is [CLS], token 1 the distillation token) and
    its members' mean ``last_hidden_state (B, T, d)``.
    """


class HydraEnsembleDeiTForImageClassification(HydraEnsembleDeiTPreTrainedModel, HydraVisionForImageClassification):
    """M pruned DeiT classifiers in one model. ``logits`` = log of the mean of the members' softmaxes.

    With ``config.distilled`` every member has the two heads of ``DeiTForImageClassificationWithTeacher``
    (``cls_classifier``, ``distillation_classifier``, each ``(M, C, d)``) and member m's logits are their
    mean; otherwise one ``classifier`` on the [CLS] token. ``AutoModelForImageClassification`` and
    ``pipeline("image-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleDeiTModel

    def add_head(self, config: HydraEnsembleDeiTConfig, base: DeiTConfig) -> None:
        if not config.distilled:
            return super().add_head(config, base)
        M, d, C = config.num_members, base.hidden_size, config.num_labels
        self.cls_classifier = HydraMemberLinear(M, d, C)
        self.distillation_classifier = HydraMemberLinear(M, d, C)

    def member_logits(self, outputs: HydraModelOutput) -> torch.Tensor:
        if not self.config.distilled:
            return super().member_logits(outputs)
        tokens = outputs.member_last_hidden_state.transpose(0, 1)  # (M, B, T, d)
        cls_logits = self.cls_classifier(tokens[:, :, 0])  # (M, B, C)
        distillation_logits = self.distillation_classifier(tokens[:, :, 1])  # (M, B, C)
        return ((cls_logits + distillation_logits) / 2).transpose(0, 1)  # (B, M, C)
