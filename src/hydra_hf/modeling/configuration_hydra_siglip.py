# Shipped with every Hydra Ensemble model folder built on SigLIP (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a SigLIP model."""

from __future__ import annotations

from .configuration_hydra import HydraTwoTowerConfig


class HydraEnsembleSiglipConfig(HydraTwoTowerConfig):
    r"""Configuration of a Hydra Ensemble built on a SigLIP model (``SiglipModel``).

    The fields of ``HydraTwoTowerConfig``: ``base_config`` is a ``SiglipConfig.to_dict()`` (nested
    ``vision_config`` and ``text_config``), ``vision_kept_heads`` / ``text_kept_heads`` per tower (a tower
    given none keeps every head). The vision tower's attention-pooling head is not pruned: every member
    keeps its own copy.

    The ``model_type`` contains ``"siglip"`` on purpose: transformers' zero-shot pipeline then applies a
    sigmoid to ``logits_per_image`` (and pads the prompts to 64 tokens), as for a stock SigLIP.
    """

    model_type = "hydra_ensemble_siglip"
    supported_base_model_types = ("siglip",)
    __init__ = HydraTwoTowerConfig.__init__  # the inherited one (see HydraEnsembleConfig)

    def validate_hydra(self) -> None:
        super().validate_hydra()
        if self.base_config.get("vision_config", {}).get("vision_use_head") is False:
            raise ValueError(
                "base_config['vision_config'] has vision_use_head=False: a SiglipModel needs the vision "
                "tower's attention-pooling head; pass a SiglipModel checkpoint"
            )
