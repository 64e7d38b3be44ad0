# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of DistilBERT: M head-pruned members run as one model in one pass.

Shared DistilBERT embeddings (word + position, no token types) feed M residual streams through
post-LN layers (no dropout on the attention output, as in DistilBERT) with fused self-attention,
per-member LayerNorms and an MLP averaged across members (or kept per member). Every member has its
own ``pre_classifier`` -> ReLU -> ``classifier`` head on its first token; the prediction is the mean
of the members' softmaxes. The encoder and classifier skeletons are in ``hydra_skeletons.py``.
"""

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
