"""hydra_hf: Hydra Ensembles (arXiv 2510.18358) for the Hugging Face ecosystem.

Importing hydra_hf registers its classes with transformers' Auto classes, so that
``AutoModelForSequenceClassification.from_pretrained(folder)`` works on a Hydra folder without
``trust_remote_code`` in a process that imported hydra_hf.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

from .masks import HeadMasks
from .modeling.configuration_hydra import HydraEnsembleConfig
from .modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification, HydraEnsembleModel

__version__ = "0.1.0"

AutoConfig.register(HydraEnsembleConfig.model_type, HydraEnsembleConfig, exist_ok=True)
AutoModel.register(HydraEnsembleConfig, HydraEnsembleModel, exist_ok=True)
AutoModelForSequenceClassification.register(HydraEnsembleConfig, HydraEnsembleForSequenceClassification, exist_ok=True)


def __getattr__(name: str):
    # Heavier entry points are imported on first use.
    if name == "convert_checkpoint":
        from .convert import convert_checkpoint

        return convert_checkpoint
    raise AttributeError(f"module 'hydra_hf' has no attribute {name!r}")


__all__ = [
    "HeadMasks",
    "HydraEnsembleConfig",
    "HydraEnsembleForSequenceClassification",
    "HydraEnsembleModel",
    "convert_checkpoint",
]
