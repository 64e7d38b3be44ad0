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
