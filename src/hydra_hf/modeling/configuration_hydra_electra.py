# Shipped with every Hydra Ensemble model folder built on ELECTRA (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on an ELECTRA discriminator."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleElectraConfig(HydraEnsembleConfig):
    """A Hydra Ensemble built on an ELECTRA discriminator: the fields of ``HydraEnsembleConfig``,
    ``base_config`` the base's ``ElectraConfig.to_dict()``."""

    model_type = "hydra_ensemble_electra"
    supported_base_model_types = ("electra",)
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)
