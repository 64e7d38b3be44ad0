"""The family registry: one module per base architecture, looked up by name or detected from a folder.

``get_family("roberta")``, ``detect_family(folder)``, ``family_of_model(model)``, ``families()``; see
:mod:`.base` for the :class:`Family` interface and how to add one. Importing this package registers the
built-in families. The registry sits above the build helpers (:mod:`hydra_hf.convert`) and the head
adapters (:mod:`.adapters`), which know no family, and below the stages that look families up
(:mod:`hydra_hf.assemble`, :mod:`hydra_hf.saving`, pruning, hub, onnx).
"""

from . import bert, vit, timm_vit, clip, open_clip  # noqa: F401  isort: skip
from . import roberta, electra, distilbert, albert  # noqa: F401  isort: skip
from . import deberta_v2, modernbert  # noqa: F401  isort: skip
from . import llama  # noqa: F401  isort: skip
from . import gpt2  # noqa: F401  isort: skip
from . import deit, beit, dinov2, siglip  # noqa: F401  isort: skip
from .base import (
    TASKS,
    Built,
    Family,
    canonical_name,
    detect_family,
    families,
    family_names,
    family_of_config,
    family_of_model,
    get_adapter,
    get_family,
    gguf_family,
    register_family,
    resolve_checkpoint,
)
from .decoder import CAUSAL_LM_SUFFIXES, is_causal_lm_config, is_causal_lm_folder

# Built-in families, in detection order (the first whose detect() accepts a folder wins).

__all__ = [
    "CAUSAL_LM_SUFFIXES",
    "TASKS",
    "Built",
    "Family",
    "canonical_name",
    "detect_family",
    "families",
    "family_names",
    "family_of_config",
    "family_of_model",
    "get_adapter",
    "get_family",
    "gguf_family",
    "is_causal_lm_config",
    "is_causal_lm_folder",
    "register_family",
    "resolve_checkpoint",
]
