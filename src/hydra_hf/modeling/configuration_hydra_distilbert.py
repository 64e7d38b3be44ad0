# Shipped with every Hydra Ensemble model folder built on DistilBERT (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on DistilBERT."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleDistilBertConfig(HydraEnsembleConfig):
    """A Hydra Ensemble built on DistilBERT: the fields of ``HydraEnsembleConfig``; ``base_config`` also holds
    ``hidden_size``, ``num_hidden_layers`` and ``num_attention_heads`` (the converter adds these aliases of
    ``dim`` / ``n_layers`` / ``n_heads``)."""

    model_type = "hydra_ensemble_distilbert"
    supported_base_model_types = ("distilbert",)
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)
