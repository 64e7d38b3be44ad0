# Shipped with every Hydra Ensemble model folder built on RoBERTa, XLM-RoBERTa or CamemBERT (remote code):
# imports only the standard library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a RoBERTa-layout encoder."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleRobertaConfig(HydraEnsembleConfig):
    """A Hydra Ensemble built on a RoBERTa-layout encoder (RoBERTa, XLM-RoBERTa, CamemBERT): the fields of
    ``HydraEnsembleConfig``, ``base_config`` the base's own config dict."""

    model_type = "hydra_ensemble_roberta"
    supported_base_model_types = ("roberta", "xlm-roberta", "camembert")
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)
