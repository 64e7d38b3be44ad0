# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of DistilBERT: M head-pruned members run as one model in one pass.

Shared DistilBERT embeddings (word + position, no token types) feed M residual streams through
post-LN layers (no dropout on the attention output, as in DistilBERT) with fused self-attention,
per-member LayerNorms and an MLP averaged across members (or kept per member). Every member has its
own ``pre_classifier`` -> ReLU -> ``classifier`` head on its first token; the prediction is the mean
of the members' softmaxes. The encoder and classifier skeletons are in ``hydra_skeletons.py``.
"""

# Route of forward: what HydraEnsembleDistilBertForSequenceClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraTextForSequenceClassification.forward_without_token_types
#     hydra_skeletons.py: HydraTextForSequenceClassification.forward
#       hydra_skeletons.py: HydraTextEncoder.forward_without_token_types
#         hydra_skeletons.py: HydraTextEncoder.forward
#           hydra_skeletons.py: resolve_output_flags
#           hydra_skeletons.py: HydraPostLNTextModel.encode
#             modeling_hydra_distilbert.py: HydraEnsembleDistilBertModel.embed
#               transformers: Embeddings.forward
#             hydra_layers.py: padding_mask_to_additive
#               hydra_layers.py: may_mask
#             hydra_skeletons.py: run_layers
#               hydra_layers.py: LayerOutputs.__init__
#               hydra_layers.py: HydraPostLNLayer.forward
#                 hydra_attention.py: HydraSelfAttention.forward
#                   hydra_attention.py: HydraSelfAttention.folds_members
#                   hydra_attention.py: HydraSelfAttention.project
#                     hydra_attention.py: grouped_linear
#                   hydra_attention.py: HydraSelfAttention.expand_kv
#                   hydra_attention.py: HydraSelfAttention.attend
#                     transformers: sdpa_attention_forward
#                   hydra_attention.py: HydraSelfAttention._project_out
#                     hydra_attention.py: HydraSelfAttention._member_rows
#                     hydra_attention.py: grouped_linear
#                   hydra_attention.py: HydraSelfAttention.fold_mask
#                 hydra_layers.py: HydraLayerNorm.forward
#                 hydra_layers.py: HydraMLPBase.forward
#                   hydra_layers.py: HydraMLP._mlp
#                     hydra_layers.py: rows_linear
#                     transformers: GELUActivation.forward
#               hydra_layers.py: LayerOutputs.add
#               hydra_layers.py: LayerOutputs.streams
#           hydra_skeletons.py: encoder_output
#             hydra_skeletons.py: model_output
#               hydra_layers.py: LayerOutputs.output_fields
#       hydra_skeletons.py: HydraTextForSequenceClassification.member_logits
#         hydra_layers.py: HydraClassificationHead.forward
#           hydra_layers.py: HydraMemberLinear.forward
#       hydra_skeletons.py: classifier_output
#         hydra_layers.py: ensemble_outputs
#           hydra_formulas.py: ensemble_log_probs
#             hydra_formulas.py: log_mean_exp
# (end of the route map)

from __future__ import annotations

from transformers import DistilBertConfig
from transformers.models.distilbert.modeling_distilbert import Embeddings as DistilBertEmbeddings

from .configuration_hydra_distilbert import HydraEnsembleDistilBertConfig
from .hydra_layers import HydraLayerSpec, layer_spec
from .hydra_skeletons import HydraPostLNTextModel, HydraTextForSequenceClassification, HydraTextPreTrainedModel

DISTILBERT_LAYER_NORM_EPS = 1e-12  # its LayerNorms' epsilon whatever its config says (transformers' TransformerBlock)


class HydraEnsembleDistilBertPreTrainedModel(HydraTextPreTrainedModel):
    config_class = HydraEnsembleDistilBertConfig
    base_config_class = DistilBertConfig
    embeddings_class = DistilBertEmbeddings


class HydraEnsembleDistilBertModel(HydraEnsembleDistilBertPreTrainedModel, HydraPostLNTextModel):
    """The fused encoder: shared DistilBERT embeddings, M residual streams (``AutoModel``)."""

    attention_output_dropout = False
    forward = HydraPostLNTextModel.forward_without_token_types  # DistilBERT has no token types

    @staticmethod
    def layer_specs(config: HydraEnsembleDistilBertConfig, base: DistilBertConfig) -> list[HydraLayerSpec]:
        sizes = dict(hidden_size=base.dim, num_heads=base.n_heads, intermediate_size=base.hidden_dim,
                     hidden_act=base.activation, layer_norm_eps=DISTILBERT_LAYER_NORM_EPS,
                     attention_dropout=base.attention_dropout, hidden_dropout=base.dropout)
        return [
            layer_spec(config.kept_heads, i, **sizes, mlp_fusion=config.mlp_fusion, kept_neurons=config.kept_neurons)
            for i in range(base.n_layers)
        ]

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds):
        return self.embeddings(input_ids, inputs_embeds, position_ids)  # (B, T, d)


class HydraEnsembleDistilBertForSequenceClassification(
    HydraEnsembleDistilBertPreTrainedModel, HydraTextForSequenceClassification
):
    """M pruned DistilBERT classifiers: every member's pre_classifier (``classifier.dense``) -> ReLU ->
    dropout -> classifier (``classifier.out_proj``)."""

    encoder_class = HydraEnsembleDistilBertModel
    head_activation, head_dropout_first = "relu", False
    forward = HydraTextForSequenceClassification.forward_without_token_types

    @staticmethod
    def classifier_dropout(base: DistilBertConfig) -> float:
        return base.seq_classif_dropout
