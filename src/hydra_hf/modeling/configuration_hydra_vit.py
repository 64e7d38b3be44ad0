# Shipped with every Hydra Ensemble model folder built on ViT (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a ViT image classifier (Hugging Face or timm)."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleViTConfig(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a ViT image classifier.

    The same fields as ``HydraEnsembleConfig``; ``base_config`` is a ``ViTConfig.to_dict()`` (a timm
    ``vit_*`` checkpoint is converted to the equivalent ``ViTConfig``). A separate class (and
    ``model_type``) because transformers maps one config class to one model class per Auto class.
    """

    model_type = "hydra_ensemble_vit"
    supported_base_model_types = ("vit",)
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)
