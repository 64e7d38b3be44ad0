# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a RoBERTa-layout encoder (RoBERTa, XLM-RoBERTa, CamemBERT): M head-pruned
members run as one model in one pass.

Shared RoBERTa embeddings (position ids count from ``pad_token_id + 1`` and skip padding) feed M
residual streams through post-LN layers with fused self-attention, per-member LayerNorms and an MLP
averaged across members (or kept per member). Every member has its own classification head
(``dense`` -> tanh -> ``out_proj`` on its first token, as ``RobertaClassificationHead``); the
prediction is the mean of the members' softmaxes. The skeletons are in ``hydra_skeletons.py``.
"""

from __future__ import annotations

from transformers import RobertaConfig
from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

from .configuration_hydra_roberta import HydraEnsembleRobertaConfig
from .hydra_skeletons import HydraPostLNTextModel, HydraTextForSequenceClassification, HydraTextPreTrainedModel


class HydraEnsembleRobertaPreTrainedModel(HydraTextPreTrainedModel):
    config_class = HydraEnsembleRobertaConfig
    base_config_class = RobertaConfig
    embeddings_class = RobertaEmbeddings


class HydraEnsembleRobertaModel(HydraEnsembleRobertaPreTrainedModel, HydraPostLNTextModel):
    """The fused encoder: shared RoBERTa embeddings, M residual streams (no pooler: RoBERTa's
    sequence classifier reads the first token).

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` returns this class.
    """


class HydraEnsembleRobertaForSequenceClassification(
    HydraEnsembleRobertaPreTrainedModel, HydraTextForSequenceClassification
):
    """M pruned RoBERTa classifiers in one model (every member's head: dense -> tanh -> out_proj).

    ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`` and
    ``pipeline("text-classification", model=folder, trust_remote_code=True)`` use this class.
    """

    encoder_class = HydraEnsembleRobertaModel
    head_activation = "tanh"
