"""hydra_hf: Hydra Ensembles (arXiv 2510.18358) for the Hugging Face ecosystem.

Importing hydra_hf registers its classes with transformers' Auto classes, so that
``AutoModelForSequenceClassification.from_pretrained(folder)`` works on a Hydra folder without
``trust_remote_code`` in a process that imported hydra_hf; registers them for auto classes
(``register_for_auto_class``) so that ``save_pretrained``, ``push_to_hub`` and the Trainer's saves write
the modeling code next to the weights, as transformers does for classes loaded as remote code; and
registers the uncertainty pipelines (``pipeline("hydra-text-classification", model=model, ...)``).
"""

import transformers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoModelForZeroShotImageClassification,
)
from transformers.pipelines import PIPELINE_REGISTRY

from .masks import HeadMasks, load_masks
from .modeling import pipeline_hydra as _pipelines
from .modeling.configuration_hydra import (
    HYDRA_PIPELINES,
    HydraEnsembleCLIPConfig,
    HydraEnsembleConfig,
    HydraEnsembleViTConfig,
)
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

# What transformers does to a class it loads as remote code: `save_pretrained` then copies the class's file
# and its sibling imports (all shipped files, pipeline_hydra.py included: configuration_hydra.py names it)
# and writes the class into `config.auto_map` under these names (the module's last component).
# With hydra_hf imported, `pipeline("hydra-...", model=model_object, ...)` builds the uncertainty
# pipelines (a folder or repository names them in config.custom_pipelines; trust_remote_code loads them).
for _auto_model, (_task, _pipeline, _kind) in HYDRA_PIPELINES.items():
    if _task not in PIPELINE_REGISTRY.supported_tasks:
        PIPELINE_REGISTRY.register_pipeline(
            _task, pipeline_class=getattr(_pipelines, _pipeline), pt_model=getattr(transformers, _auto_model), type=_kind
        )

# The one place push_to_hub is overridden: `model.push_to_hub(...)` on a model built or loaded through
# hydra_hf (its own classes, not remote-code ones) uploads the same repository as `hydra-hf push` (card,
# shipped code, validation) -- hydra_hf.hub.publish.hydra_push_to_hub; see docs/hub.md.
from .hub.publish import install_push_to_hub as _install_push_to_hub  # noqa: E402


def _register_families() -> None:
    """Register every family's classes: with the Auto classes (hydra_hf imported, `from_pretrained`
    needs no remote code), for `save_pretrained`'s custom-code copy (`register_for_auto_class`: every
    save path writes the shipped files and names them in `auto_map`), and for push_to_hub. The family
    registry is the source of each config's default `auto_map` and uncertainty pipelines."""
    from .families import families

    for family in families():
        config_class = family.config_class()
        if config_class.hydra_auto_map.get("AutoConfig", "").rsplit(".", 1)[-1] != config_class.__name__:
            config_class.hydra_auto_map = dict(family.auto_map)  # a config built in this process names its code
        config_class.hydra_uncertainty_pipelines = bool(family.uncertainty_pipelines)
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class("AutoConfig")
        # the task class last: a class serving several Auto classes (CLIP) is saved under its task
        names = sorted(family.model_class_names, key=lambda name: name == family.task_auto_class)
        for auto_name in names:
            model_class = family.model_class(auto_name)
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_name)
            _install_push_to_hub(model_class)


_register_families()


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
    "convert_checkpoint",
    "load_masks",
]
