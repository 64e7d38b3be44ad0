"""hydra_hf: Hydra Ensembles (arXiv 2510.18358) for the Hugging Face ecosystem.

Importing hydra_hf registers its classes with transformers' Auto classes, so that
``AutoModelForSequenceClassification.from_pretrained(folder)`` works on a Hydra folder without
``trust_remote_code`` in a process that imported hydra_hf; registers them for auto classes
(``register_for_auto_class``) so that ``save_pretrained``, ``push_to_hub`` and the Trainer's saves write
the modeling code next to the weights, as transformers does for classes loaded as remote code; and
registers the uncertainty pipelines (``pipeline("hydra-text-classification", model=model, ...)``).

Importing it imports only what that registration needs (the model classes, their configs and the family
registry): the stages (``hydra_hf.hub``, ``hydra_hf.evaluation``, ``hydra_hf.finetune``, ...) are imported when
first used, and no heavy optional package (datasets, pandas, scikit-learn, open_clip, timm, onnxruntime,
matplotlib) is imported at all (tests/repo/test_import_cost.py; bench/bench_import.py measures the cost).
"""

import importlib
from typing import Any

import transformers
from transformers import AutoConfig
from transformers.pipelines import PIPELINE_REGISTRY

from . import families
from .assemble import convert_checkpoint
from .masks import HeadMasks, load_masks
from .modeling import pipeline_hydra
from .modeling.configuration_hydra import HYDRA_PIPELINES, HydraEnsembleConfig
from .modeling.configuration_hydra_clip import HydraEnsembleCLIPConfig
from .modeling.configuration_hydra_vit import HydraEnsembleViTConfig
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
from .version import __version__

# With hydra_hf imported, `pipeline("hydra-...", model=model_object, ...)` builds the uncertainty
# pipelines (a folder or repository names them in config.custom_pipelines; trust_remote_code loads them).
for _auto_model, (_task, _pipeline, _kind) in HYDRA_PIPELINES.items():
    if _task not in PIPELINE_REGISTRY.supported_tasks:
        PIPELINE_REGISTRY.register_pipeline(
            _task, pipeline_class=getattr(pipeline_hydra, _pipeline), pt_model=getattr(transformers, _auto_model),
            type=_kind,
        )


def _register_families() -> None:
    """Register every family's classes: with the Auto classes (hydra_hf imported, `from_pretrained`
    needs no remote code), for `save_pretrained`'s custom-code copy (`register_for_auto_class`: every
    save path writes the shipped files and names them in `auto_map`), and for push_to_hub. The family
    registry is the source of each config's default `auto_map` and uncertainty pipelines.

    `register_for_auto_class` does what transformers does to a class it loads as remote code:
    `save_pretrained` then copies the class's file and its sibling imports (all shipped files) and writes
    the class into `config.auto_map`. :func:`push_to_hub` replaces transformers' on these classes:
    `model.push_to_hub(...)` on hydra_hf's own classes uploads the same repository as `hydra-hf push`
    (card, shipped code, validation); see docs/hub.md."""
    for family in families.families():
        config_class = family.config_class()
        if "hydra_auto_map" not in vars(config_class):  # no map of its own: a config built here names its code
            config_class.hydra_auto_map = dict(family.auto_map)
        config_class.hydra_uncertainty_pipelines = bool(family.uncertainty_pipelines)
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class("AutoConfig")
        # the task class last: a class serving several Auto classes (CLIP) is saved under its task
        names = sorted(family.model_class_names, key=lambda name: name == family.task_auto_class)
        for auto_name in names:
            model_class = family.model_class(auto_name)
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_name)
            model_class.push_to_hub = push_to_hub


def push_to_hub(self: Any, repo_id: str, **kwargs: Any) -> Any:
    """``model.push_to_hub(repo_id, ...)`` on hydra_hf's model classes: the repository ``hydra-hf push`` makes
    (:func:`hydra_hf.hub.hydra_push_to_hub`: card, shipped code, validation in a fresh process, one commit)."""
    # hydra_hf.hub is imported on the first push, through the module __getattr__ below: importing it at the top
    # would import the evaluation and calibration stack (and their data) with every `import hydra_hf`
    return __getattr__("hub").hydra_push_to_hub(self, repo_id, **kwargs)


push_to_hub.__hydra_hub__ = True  # type: ignore[attr-defined]

# The sub-packages and modules of hydra_hf, imported on first access (`hydra_hf.hub.push(...)`, `hydra_hf.evaluation`
# after a bare `import hydra_hf`): PEP 562's module __getattr__ keeps `import hydra_hf` to the registration above
# instead of importing every stage of the library with it (bench/bench_import.py measures the difference).
_SUBMODULES = frozenset({
    "assemble", "calibration", "cli", "convert", "cost", "data", "distributed", "errors", "evaluation", "families",
    "finetune", "hub", "lazy", "masks", "metrics", "modeling", "onnx", "outputs", "progress", "pruning", "recipes",
    "reproducibility", "saving", "version", "workflows",
})
# The library calls under the commands, imported with their module on first access (`hydra_hf.serve(spec)`)
_WORKFLOWS = {"ServeSpec": "workflows.serve", "serve": "workflows.serve"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _WORKFLOWS:
        return getattr(importlib.import_module(f".{_WORKFLOWS[name]}", __name__), name)
    raise AttributeError(f"module 'hydra_hf' has no attribute {name!r}")


_register_families()

__all__ = [
    "HeadMasks",
    "HydraEnsembleCLIPConfig",
    "HydraEnsembleCLIPModel",
    "HydraEnsembleCLIPPreTrainedModel",
    "HydraEnsembleConfig",
    "HydraEnsembleForImageClassification",
    "HydraEnsembleForSequenceClassification",
    "HydraEnsembleModel",
    "HydraEnsemblePreTrainedModel",
    "HydraEnsembleViTConfig",
    "HydraEnsembleViTModel",
    "HydraEnsembleViTPreTrainedModel",
    "ServeSpec",
    "__version__",
    "convert_checkpoint",
    "load_masks",
    "serve",
]
