"""hydra_hf: Hydra Ensembles (arXiv 2510.18358) for the Hugging Face ecosystem.

Importing hydra_hf registers its classes with transformers' Auto classes, so that
``AutoModelForSequenceClassification.from_pretrained(folder)`` works on a Hydra folder without
``trust_remote_code`` in a process that imported hydra_hf.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoModelForZeroShotImageClassification,
)

from .hub import install_push_to_hub as _install_push_to_hub
from .masks import HeadMasks, TowerHeadMasks, load_masks
from .modeling.configuration_hydra import HydraEnsembleCLIPConfig, HydraEnsembleConfig, HydraEnsembleViTConfig
from .modeling.modeling_hydra_bert import (
    HydraEnsembleForSequenceClassification,
    HydraEnsembleModel,
    HydraEnsemblePreTrainedModel,
)
from .modeling.modeling_hydra_clip import HydraEnsembleCLIPModel, HydraEnsembleCLIPPreTrainedModel
from .modeling.modeling_hydra_vit import (
    HydraEnsembleForImageClassification,
    HydraEnsembleViTModel,
    HydraEnsembleViTPreTrainedModel,
)

__version__ = "0.1.0"

AutoConfig.register(HydraEnsembleConfig.model_type, HydraEnsembleConfig, exist_ok=True)
AutoModel.register(HydraEnsembleConfig, HydraEnsembleModel, exist_ok=True)
AutoModelForSequenceClassification.register(HydraEnsembleConfig, HydraEnsembleForSequenceClassification, exist_ok=True)
# one config class per base family: transformers maps a config class to one model class per Auto class
AutoConfig.register(HydraEnsembleViTConfig.model_type, HydraEnsembleViTConfig, exist_ok=True)
AutoModel.register(HydraEnsembleViTConfig, HydraEnsembleViTModel, exist_ok=True)
AutoModelForImageClassification.register(HydraEnsembleViTConfig, HydraEnsembleForImageClassification, exist_ok=True)
AutoConfig.register(HydraEnsembleCLIPConfig.model_type, HydraEnsembleCLIPConfig, exist_ok=True)
AutoModel.register(HydraEnsembleCLIPConfig, HydraEnsembleCLIPModel, exist_ok=True)
AutoModelForZeroShotImageClassification.register(HydraEnsembleCLIPConfig, HydraEnsembleCLIPModel, exist_ok=True)

# `model.push_to_hub(...)` on a model built or loaded through hydra_hf uploads the same repository as
# `hydra-hf push` (card, shipped code, validation); see docs/hub.md.
_install_push_to_hub(HydraEnsemblePreTrainedModel)
_install_push_to_hub(HydraEnsembleViTPreTrainedModel)
_install_push_to_hub(HydraEnsembleCLIPPreTrainedModel)


def __getattr__(name: str):
    # Heavier entry points are imported on first use.
    if name == "convert_checkpoint":
        from .convert import convert_checkpoint

        return convert_checkpoint
    raise AttributeError(f"module 'hydra_hf' has no attribute {name!r}")


__all__ = [
    "HeadMasks",
    "HydraEnsembleCLIPConfig",
    "HydraEnsembleCLIPModel",
    "HydraEnsembleConfig",
    "HydraEnsembleForImageClassification",
    "HydraEnsembleForSequenceClassification",
    "HydraEnsembleModel",
    "HydraEnsembleViTConfig",
    "HydraEnsembleViTModel",
    "TowerHeadMasks",
    "convert_checkpoint",
    "load_masks",
]
