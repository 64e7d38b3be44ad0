# Shipped with every Hydra Ensemble model folder built on DeBERTa-v2/v3 (remote code): imports only the
# standard library, torch, transformers and sibling files.
"""Configuration of a Hydra Ensemble built on a DeBERTa-v2 or DeBERTa-v3 encoder."""

from __future__ import annotations

from .configuration_hydra import HydraEnsembleConfig


class HydraEnsembleDebertaV2Config(HydraEnsembleConfig):
    r"""Configuration of a Hydra Ensemble built on a DeBERTa-v2 / DeBERTa-v3 sequence classifier.

    The same fields as ``HydraEnsembleConfig``; ``base_config`` is the base's ``DebertaV2Config.to_dict()``
    (DeBERTa-v3 checkpoints have ``model_type="deberta-v2"`` too). Besides the checks of the parent, the
    base must use ``hidden_size // num_attention_heads`` as its head size and a pooler as wide as the
    hidden states (``pooler_hidden_size == hidden_size``), as every published checkpoint does.
    """

    model_type = "hydra_ensemble_deberta_v2"
    supported_base_model_types = ("deberta-v2",)
    __init__ = HydraEnsembleConfig.__init__  # the inherited one (see HydraEnsembleConfig)

    def validate_hydra(self) -> None:
        super().validate_hydra()
        base = self.base_config
        d, H = int(base["hidden_size"]), int(base["num_attention_heads"])
        head_size = base.get("attention_head_size")
        if head_size is not None and int(head_size) != d // H:
            raise ValueError(
                f"base_config has attention_head_size={head_size} but hidden_size // num_attention_heads = {d // H}; "
                "hydra_hf supports DeBERTa bases whose heads split the hidden size evenly"
            )
        pooler = base.get("pooler_hidden_size", d)
        if int(pooler) != d:
            raise ValueError(
                f"base_config has pooler_hidden_size={pooler} != hidden_size={d}; the DeBERTa classifier reads a "
                "pooler as wide as the hidden states, use a base with pooler_hidden_size == hidden_size"
            )
