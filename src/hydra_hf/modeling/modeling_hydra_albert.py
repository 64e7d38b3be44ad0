# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of ALBERT: M head-pruned members run as one model in one pass.

Shared ALBERT embeddings (width ``embedding_size``) and the shared ``embedding_hidden_mapping_in``
projection feed M residual streams through post-LN layers. ALBERT shares one layer's weights across
its layers (``num_hidden_groups`` groups); here every layer is its own fused layer holding a copy of
its group's weights, so that every member prunes every layer separately. As in ALBERT, no dropout is
applied to the MLP output. Every member has its own pooler (tanh) and classifier; the prediction is
the mean of the members' softmaxes. The skeletons are in ``hydra_skeletons.py``.
"""

# Route of forward: what HydraEnsembleAlbertForSequenceClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraTextForSequenceClassification.forward
#     hydra_skeletons.py: HydraTextEncoder.forward
#       hydra_skeletons.py: resolve_output_flags
#       hydra_skeletons.py: HydraPostLNTextModel.encode
#         modeling_hydra_albert.py: HydraEnsembleAlbertModel.embed
#           hydra_skeletons.py: HydraPostLNTextModel.embed
#             transformers: AlbertEmbeddings.forward
#         hydra_layers.py: padding_mask_to_additive
#           hydra_layers.py: may_mask
#         hydra_skeletons.py: run_layers
#           hydra_layers.py: LayerOutputs.__init__
#           hydra_layers.py: HydraPostLNLayer.forward
#             hydra_attention.py: HydraSelfAttention.forward
#               hydra_attention.py: HydraSelfAttention.folds_members
#               hydra_attention.py: HydraSelfAttention.project
#                 hydra_attention.py: grouped_linear
#               hydra_attention.py: HydraSelfAttention.expand_kv
#               hydra_attention.py: HydraSelfAttention.attend
#                 transformers: sdpa_attention_forward
#               hydra_attention.py: HydraSelfAttention._project_out
#                 hydra_attention.py: HydraSelfAttention._member_rows
#                 hydra_attention.py: grouped_linear
#               hydra_attention.py: HydraSelfAttention.fold_mask
#             hydra_layers.py: HydraLayerNorm.forward
#             hydra_layers.py: HydraMLPBase.forward
#               hydra_layers.py: HydraMLP._mlp
#                 hydra_layers.py: rows_linear
#                 transformers: NewGELUActivation.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#         hydra_layers.py: HydraMemberLinear.forward
#       hydra_skeletons.py: encoder_output
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     hydra_skeletons.py: HydraTextForSequenceClassification.member_logits
#       hydra_layers.py: HydraMemberLinear.forward
#     hydra_skeletons.py: classifier_output
#       hydra_layers.py: ensemble_outputs
#         hydra_formulas.py: ensemble_log_probs
#           hydra_formulas.py: log_mean_exp
# (end of the route map)

from __future__ import annotations

import torch
from torch import nn
from transformers import AlbertConfig
from transformers.models.albert.modeling_albert import AlbertEmbeddings

from .configuration_hydra_albert import HydraEnsembleAlbertConfig
from .hydra_skeletons import HydraPostLNTextModel, HydraTextForSequenceClassification, HydraTextPreTrainedModel


class HydraEnsembleAlbertPreTrainedModel(HydraTextPreTrainedModel):
    config_class = HydraEnsembleAlbertConfig
    base_config_class = AlbertConfig
    embeddings_class = AlbertEmbeddings


class HydraEnsembleAlbertModel(HydraEnsembleAlbertPreTrainedModel, HydraPostLNTextModel):
    """The fused encoder: shared ALBERT embeddings and input projection, one fused layer per layer,
    per-member poolers (``AutoModel.from_pretrained(folder, trust_remote_code=True)``)."""

    has_pooler = True
    mlp_output_dropout = False

    def add_input_projection(self, base: AlbertConfig) -> None:
        self.embedding_hidden_mapping_in = nn.Linear(base.embedding_size, base.hidden_size)  # shared

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds) -> torch.Tensor:
        embeddings = super().embed(input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, T, E)
        return self.embedding_hidden_mapping_in(embeddings)  # (B, T, d)


class HydraEnsembleAlbertForSequenceClassification(
    HydraEnsembleAlbertPreTrainedModel, HydraTextForSequenceClassification
):
    """M pruned ALBERT classifiers in one model: every member's pooler -> dropout -> classifier.

    ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleAlbertModel

    @staticmethod
    def classifier_dropout(base: AlbertConfig) -> float:
        return base.classifier_dropout_prob
