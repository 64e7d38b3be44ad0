# Shipped with every Hydra Ensemble model folder built on DINOv2 (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a DINOv2 image classifier."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleDinov2Config(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a DINOv2 image classifier.

    The fields of ``HydraEnsembleConfig``. ``base_model_type`` is ``"dinov2"`` (``base_config`` a
    ``Dinov2Config.to_dict()``) or ``"dinov2_with_registers"`` (a ``Dinov2WithRegistersConfig.to_dict()``:
    register tokens after the [CLS] token). Layer scale and the SwiGLU MLP (``use_swiglu_ffn``) are the
    base's; every member keeps its own layer scales.
    """

    model_type = "hydra_ensemble_dinov2"
    supported_base_model_types = ("dinov2", "dinov2_with_registers")
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)
