"""The paper's end-to-end pipelines, one function per setting: `make demo` and `examples/recipe_*.py`.

- :mod:`.runner` — what every pipeline shares: :class:`Stage` / :class:`StageRunner` (resume keeps
  finished stages, wall times in ``timings.json``), the fine-tuning stages of the trained settings,
  the members stage, the Hub stage (stage the repository, validate it, compare predictions in a
  fresh process) and :class:`PipelineResult`;
- :mod:`.text` — :class:`TextPipeline`, :func:`run_text_pipeline` (BERT-like classifiers: the demo, SST-2);
- :mod:`.image` — :class:`ImagePipeline`, :func:`run_image_pipeline` (ViT: CIFAR-100);
- :mod:`.zero_shot` — :class:`ZeroShotPipeline`, :func:`run_zero_shot_pipeline` (OpenCLIP, both
  towers pruned, no training).

Every setting builds its members with :func:`hydra_hf.workflows.prune.build_members`, as ``hydra-hf prune``
does. A setting's module holds only its settings and its stage bodies; it imports nothing private
from a sibling.
"""

from ..finetune.baselines import all_heads_masks  # the Single's masks: one member keeping every head
from .budget_args import add_budget_arguments, budget_arguments
from .image import ImagePipeline, build_image_members, evaluate_image_pipeline, run_image_pipeline
from .runner import (
    HUB_STAGE,
    PipelineResult,
    Stage,
    StageRunner,
    finetune_members_stage,
    hub_stage,
    members_stage,
    single_model_dir,
    single_model_stage,
    timed_stage,
)
from .text import (
    TextPipeline,
    build_text_members,
    check_hub_folder,
    evaluate_pipeline,
    export_int8,
    packaged_minilm,
    run_text_pipeline,
)
from .zero_shot import (
    OPEN_CLIP_CONFIG,
    OPEN_CLIP_WEIGHTS,
    TOWER_CHOICES,
    ZeroShotPipeline,
    build_zero_shot_members,
    check_zero_shot_hub_folder,
    evaluate_single_validation,
    evaluate_zero_shot,
    load_open_clip_folder,
    load_splits,
    member_masks,
    run_zero_shot_pipeline,
    save_open_clip_folder,
)

__all__ = [
    "HUB_STAGE",
    "OPEN_CLIP_CONFIG",
    "OPEN_CLIP_WEIGHTS",
    "TOWER_CHOICES",
    "ImagePipeline",
    "PipelineResult",
    "Stage",
    "StageRunner",
    "TextPipeline",
    "ZeroShotPipeline",
    "add_budget_arguments",
    "all_heads_masks",
    "budget_arguments",
    "build_image_members",
    "build_text_members",
    "build_zero_shot_members",
    "check_hub_folder",
    "check_zero_shot_hub_folder",
    "evaluate_image_pipeline",
    "evaluate_pipeline",
    "evaluate_single_validation",
    "evaluate_zero_shot",
    "export_int8",
    "finetune_members_stage",
    "hub_stage",
    "load_open_clip_folder",
    "load_splits",
    "member_masks",
    "members_stage",
    "packaged_minilm",
    "run_image_pipeline",
    "run_text_pipeline",
    "run_zero_shot_pipeline",
    "save_open_clip_folder",
    "single_model_dir",
    "single_model_stage",
    "timed_stage",
]
