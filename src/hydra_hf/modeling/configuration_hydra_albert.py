# Shipped with every Hydra Ensemble model folder built on ALBERT (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on ALBERT."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleAlbertConfig(HydraEnsembleConfig):
    """A Hydra Ensemble built on ALBERT: the base's shared layer weights become one fused layer per
    layer (``num_hidden_layers`` of them), so that every member prunes every layer separately."""

    model_type = "hydra_ensemble_albert"
    supported_base_model_types = ("albert",)
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)
