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

# Route of forward: what HydraEnsembleDeiTForImageClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraVisionForImageClassification.forward
#     hydra_skeletons.py: HydraVisionEncoder.forward
#       hydra_skeletons.py: resolve_output_flags
#       hydra_skeletons.py: check_pixel_values
#       hydra_skeletons.py: HydraPreLNVisionModel.encode
#         hydra_skeletons.py: HydraPreLNVisionModel.embed
#           transformers: DeiTEmbeddings.forward
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
#                 transformers: GELUActivation.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#         hydra_layers.py: HydraLayerNorm.forward
#         hydra_skeletons.py: HydraPreLNVisionModel.pool
#       hydra_skeletons.py: encoder_output
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     modeling_hydra_deit.py: HydraEnsembleDeiTForImageClassification.member_logits
#       hydra_skeletons.py: HydraVisionForImageClassification.member_logits
#         hydra_layers.py: HydraMemberLinear.forward
#     hydra_skeletons.py: classifier_output
#       hydra_layers.py: ensemble_outputs
#         hydra_formulas.py: ensemble_log_probs
#           hydra_formulas.py: log_mean_exp
# (end of the route map)

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
