# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Hydra Ensemble of a BERT-family encoder: M head-pruned members run as one model in one pass.

Shared embeddings feed M residual streams. Every layer is BERT's post-LN layer with fused
self-attention over all members' kept heads, per-member LayerNorms, and an MLP averaged across
members (or kept per member). Every member has its own pooler and classifier; the prediction is the
mean of the members' softmaxes. The encoder and classifier skeletons are in ``hydra_skeletons.py``.
"""

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
