# Shipped with every Hydra Ensemble model folder built on BEiT (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a BEiT image classifier."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleBeitConfig(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a BEiT image classifier (``BeitForImageClassification``).

    The fields of ``HydraEnsembleConfig``; ``base_config`` is a ``BeitConfig.to_dict()``. Its relative
    position bias (shared or per layer), layer scale and pooling (mean of the patch tokens + LayerNorm,
    or the [CLS] token after the final LayerNorm) are the base's; every member keeps its own copy of the
    per-head bias of the heads it keeps, its own layer scales and its own pooling LayerNorm.
    """

    model_type = "hydra_ensemble_beit"
    supported_base_model_types = ("beit",)
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)
