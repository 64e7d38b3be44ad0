"""Choosing which attention heads each Hydra member keeps.

- :mod:`.adapters` — where the heads of BERT / ViT / CLIP / timm / open_clip models live;
- :mod:`.gates` — :class:`HeadGates`: switch heads on/off (and differentiate) on stock models;
- :mod:`.layout` — :class:`HeadLayout`: one tower, or both towers of CLIP stacked (``tower="joint"``);
- :mod:`.taylor` — Strategy 1, Taylor importance with prune–recompute;
- :mod:`.scoring` — the circuit score ``S`` (accuracy / MSP AUROC) and the batch type both evaluators read;
- :mod:`.circuits` — Strategy 2, greedy circuit search (CircAcc / CircOOD / CircAvg);
- :mod:`.cached_bert` — the cached, batched circuit evaluator for BERT classifiers;
- :mod:`.lm` — decoders (causal LMs) on next-token prediction: batches, adapter, sequence-level evaluator;
- :mod:`.zero_shot_lm` — a causal LM as a zero-shot classifier: prompt batches, the label-word adapter;
- :mod:`.diversity` — M members from seeds, criteria and user masks;
- :mod:`.members` — :class:`PruningTarget`: what selection needs of a loaded model (data specs -> masks,
  ``hydra-hf prune`` and every recipe: :func:`hydra_hf.workflows.prune.build_members`);
- :mod:`.loading` — open_clip / timm models from local weights, zero-shot class prompts (the CLI's loaders).
"""

from ..families import get_adapter
from ..families.adapters import AttentionLayer, ModelAdapter
from .budget import Budget
from .cached_bert import CachedBertEvaluator
from .circuits import (
    Evaluator,
    GatedEvaluator,
    circuit_prune,
    circuit_prune_criteria,
    make_evaluator,
    reference_circuit_ranking,
)
from .diversity import (
    METHODS,
    PRUNING_METHODS,
    MemberContext,
    PruningMethod,
    parse_methods,
    prune_members,
    random_prune,
    random_prune_layout,
    register_pruning_method,
    uses_ood,
)
from .gates import HeadGates, zero_head_columns_
from .layout import JOINT, HeadLayout
from .lm import LMGatedEvaluator, causal_lm_adapter, lm_batches, lm_batches_from_ids
from .members import PruningTarget, load_pruning_target, load_zero_shot_lm_target
from .scoring import batch_labels, circuit_score
from .taylor import PruneResult, normalize_layer_scores, select_top, taylor_prune, taylor_scores
from .zero_shot_lm import zero_shot_lm_adapter, zero_shot_lm_batches

__all__ = [
    "METHODS",
    "PRUNING_METHODS",
    "MemberContext",
    "PruningMethod",
    "register_pruning_method",
    "uses_ood",
    "AttentionLayer",
    "Budget",
    "CachedBertEvaluator",
    "Evaluator",
    "GatedEvaluator",
    "HeadGates",
    "HeadLayout",
    "JOINT",
    "LMGatedEvaluator",
    "ModelAdapter",
    "PruneResult",
    "PruningTarget",
    "batch_labels",
    "causal_lm_adapter",
    "circuit_prune",
    "circuit_prune_criteria",
    "circuit_score",
    "get_adapter",
    "lm_batches",
    "lm_batches_from_ids",
    "load_pruning_target",
    "load_zero_shot_lm_target",
    "make_evaluator",
    "normalize_layer_scores",
    "parse_methods",
    "prune_members",
    "random_prune",
    "random_prune_layout",
    "reference_circuit_ranking",
    "select_top",
    "taylor_prune",
    "taylor_scores",
    "zero_head_columns_",
    "zero_shot_lm_adapter",
    "zero_shot_lm_batches",
]
