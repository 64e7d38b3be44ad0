# Shipped with every Hydra Ensemble model folder built on DeiT (remote code): imports only the standard
# library, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a DeiT image classifier."""

from __future__ import annotations

from typing import Any

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleDeiTConfig(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a DeiT image classifier.

    The fields of ``HydraEnsembleConfig`` (``base_config`` is a ``DeiTConfig.to_dict()``), plus:

    Args:
        distilled (`bool`): the base is a ``DeiTForImageClassificationWithTeacher``: every member keeps
            both heads (``cls_classifier`` on the [CLS] token, ``distillation_classifier`` on the
            distillation token) and its logits are their mean, as in the stock model. False: a
            ``DeiTForImageClassification`` (one classifier on the [CLS] token).
    """

    model_type = "hydra_ensemble_deit"
    supported_base_model_types = ("deit",)

    def __init__(self, distilled: bool = False, **kwargs: Any) -> None:
        self.distilled = distilled
        super().__init__(**kwargs)

    def validate_hydra(self) -> None:
        if not isinstance(self.distilled, bool):
            raise ValueError(f"distilled must be true or false, got {self.distilled!r}")
        super().validate_hydra()
