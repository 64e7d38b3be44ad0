# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of an ELECTRA discriminator: M head-pruned members run as one model in one pass.

Shared ELECTRA embeddings (of width ``embedding_size``, projected to ``hidden_size`` by the shared
``embeddings_project`` when the two differ) feed M residual streams through post-LN layers with fused
self-attention, per-member LayerNorms and an MLP averaged across members (or kept per member). Every
member has its own classification head (``dense`` -> GELU -> ``out_proj`` on its first token, as
``ElectraClassificationHead``); the prediction is the mean of the members' softmaxes. The skeletons
are in ``hydra_skeletons.py``.
"""

# Route of forward: what HydraEnsembleElectraForSequenceClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraTextForSequenceClassification.forward
#     hydra_skeletons.py: HydraTextEncoder.forward
#       hydra_skeletons.py: resolve_output_flags
#       hydra_skeletons.py: HydraPostLNTextModel.encode
#         modeling_hydra_electra.py: HydraEnsembleElectraModel.embed
#           hydra_skeletons.py: HydraPostLNTextModel.embed
#             transformers: ElectraEmbeddings.forward
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
#                 transformers: GELUActivation.forward
#           hydra_layers.py: LayerOutputs.add
#           hydra_layers.py: LayerOutputs.streams
#       hydra_skeletons.py: encoder_output
#         hydra_skeletons.py: model_output
#           hydra_layers.py: LayerOutputs.output_fields
#     hydra_skeletons.py: HydraTextForSequenceClassification.member_logits
#       hydra_layers.py: HydraClassificationHead.forward
#         hydra_layers.py: HydraMemberLinear.forward
#         transformers: GELUActivation.forward
#     hydra_skeletons.py: classifier_output
#       hydra_layers.py: ensemble_outputs
#         hydra_formulas.py: ensemble_log_probs
#           hydra_formulas.py: log_mean_exp
# (end of the route map)

from __future__ import annotations

import torch
from torch import nn
from transformers import ElectraConfig
from transformers.models.electra.modeling_electra import ElectraEmbeddings

from .configuration_hydra_electra import HydraEnsembleElectraConfig
from .hydra_skeletons import HydraPostLNTextModel, HydraTextForSequenceClassification, HydraTextPreTrainedModel


class HydraEnsembleElectraPreTrainedModel(HydraTextPreTrainedModel):
    config_class = HydraEnsembleElectraConfig
    base_config_class = ElectraConfig
    embeddings_class = ElectraEmbeddings


class HydraEnsembleElectraModel(HydraEnsembleElectraPreTrainedModel, HydraPostLNTextModel):
    """The fused encoder: shared ELECTRA embeddings (and ``embeddings_project``), M residual streams.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    def add_input_projection(self, base: ElectraConfig) -> None:
        # shared, like the embeddings: (embedding_size -> hidden_size), only when they differ
        differ = base.embedding_size != base.hidden_size
        self.embeddings_project = nn.Linear(base.embedding_size, base.hidden_size) if differ else None

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds) -> torch.Tensor:
        embeddings = super().embed(input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, T, E)
        return embeddings if self.embeddings_project is None else self.embeddings_project(embeddings)  # (B, T, d)


class HydraEnsembleElectraForSequenceClassification(
    HydraEnsembleElectraPreTrainedModel, HydraTextForSequenceClassification
):
    """M pruned ELECTRA classifiers in one model (every member's head: dense -> GELU -> out_proj).

    ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleElectraModel
    head_activation = "gelu"
