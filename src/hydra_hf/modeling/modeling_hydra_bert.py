# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a BERT-family encoder: M head-pruned members run as one model in one pass.

Shared embeddings feed M residual streams. Every layer is BERT's post-LN layer with fused
self-attention over all members' kept heads, per-member LayerNorms, and an MLP averaged across
members (or kept per member). Every member has its own pooler and classifier; the prediction is the
mean of the members' softmaxes. The encoder and classifier skeletons are in ``hydra_skeletons.py``.
"""

# Route of forward: what HydraEnsembleForSequenceClassification(...) runs, file: function,
# each call under its caller, in the order they first run (members of unequal widths; written by
# tools/route_maps.py, checked by tests/modeling/test_route_maps.py).
#   hydra_skeletons.py: HydraTextForSequenceClassification.forward
#     hydra_skeletons.py: HydraTextEncoder.forward
#       hydra_skeletons.py: resolve_output_flags
#       hydra_skeletons.py: HydraPostLNTextModel.encode
#         hydra_skeletons.py: HydraPostLNTextModel.embed
#           transformers: BertEmbeddings.forward
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

from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertEmbeddings

from .configuration_hydra import HydraEnsembleConfig
from .hydra_skeletons import HydraPostLNTextModel, HydraTextForSequenceClassification, HydraTextPreTrainedModel


class HydraEnsemblePreTrainedModel(HydraTextPreTrainedModel):
    config_class = HydraEnsembleConfig
    base_config_class = BertConfig
    embeddings_class = BertEmbeddings


class HydraEnsembleModel(HydraEnsemblePreTrainedModel, HydraPostLNTextModel):
    """The fused encoder: shared BERT embeddings, M residual streams, per-member poolers.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """

    has_pooler = True


class HydraEnsembleForSequenceClassification(HydraEnsemblePreTrainedModel, HydraTextForSequenceClassification):
    """M pruned BERT classifiers in one model: every member's pooler -> dropout -> classifier.

    ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleModel
