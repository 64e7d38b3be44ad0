# Shipped with every Hydra Ensemble model folder built on ModernBERT (remote code): imports only the
# standard library, torch, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a ModernBERT encoder."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig

CLASSIFIER_POOLINGS = ("cls", "mean")


class HydraEnsembleModernBertConfig(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a ModernBERT sequence classifier.

    The same fields as ``HydraEnsembleConfig``; ``base_config`` is the base's ``ModernBertConfig.to_dict()``
    (with its ``layer_types``: which layers attend globally and which within the sliding window of
    ``local_attention`` tokens, and the ``rope_parameters`` of each kind).
    """

    model_type = "hydra_ensemble_modernbert"
    supported_base_model_types = ("modernbert",)
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)

    def validate_hydra(self) -> None:
        super().validate_hydra()
        pooling = self.base_config.get("classifier_pooling", "cls")
        if pooling not in CLASSIFIER_POOLINGS:
            raise ValueError(
                f"base_config has classifier_pooling={pooling!r}; a ModernBERT classifier pools with one of "
                f"{list(CLASSIFIER_POOLINGS)}"
            )
        types = self.base_config.get("layer_types")
        if types is not None and len(types) != self.num_hidden_layers:
            raise ValueError(
                f"base_config has {len(types)} layer_types for num_hidden_layers={self.num_hidden_layers}; "
                "pass the base model's full ModernBertConfig"
            )
