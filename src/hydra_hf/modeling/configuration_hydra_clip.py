# Shipped with every Hydra Ensemble model folder built on CLIP (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a CLIP model (Hugging Face or open_clip)."""

from __future__ import annotations

from .configuration_hydra import HydraTwoTowerConfig


class HydraEnsembleCLIPConfig(HydraTwoTowerConfig):
    r"""Configuration of a Hydra Ensemble built on a CLIP model (zero-shot image classification).

    The fields of ``HydraTwoTowerConfig``: ``base_config`` is ``CLIPConfig.to_dict()`` of the base (an open_clip
    model is converted to the equivalent ``CLIPConfig``), ``vision_kept_heads`` / ``text_kept_heads`` per tower.
    """

    model_type = "hydra_ensemble_clip"
    supported_base_model_types = ("clip",)
    __init__ = HydraTwoTowerConfig.__init__  # the inherited one (see HydraEnsembleConfig)
