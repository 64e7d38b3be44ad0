"""The end-to-end image pipeline of the paper (ViT), as one function: the CIFAR-100 recipe runs it.

The stages mirror :mod:`hydra_hf.recipes.text` (each writes one folder under ``output_dir``; with
``resume=True`` a finished stage is kept):

1. ``single/``      fine-tune the base Hugging Face ViT with all its heads (the **Single** baseline);
                    its stock checkpoint is ``single.work/member_0/model``.
2. ``masks.json``   M members by Taylor importance (default; seeds ``seed, seed+1, ...``: each member
                    sees its own seeded subset of the ID validation split and samples its kept heads
                    from the ranking) on the fine-tuned single model.
3. ``hydra/``       fine-tune every member (its own seed, embeddings frozen) and fuse them.
4. ``report/``      Hydra against Single, Single + temperature scaling, MC Dropout (when the model has
                    dropout), Deep Ensembles (D) and one pruned member on the ID test split and every OOD
                    test set.
5. ``hub/``         the Hub-ready repository, validated in a fresh process (``hub.validate_staged``).

Fine-tuning goes through :func:`hydra_hf.finetune.finetune_members`, which trains Hugging Face ViT
folders (``ViTForImageClassification`` or a bare ``ViTModel``); a timm ViT is not fine-tuned here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import evaluation as ev
from ..data import resolve_dataset
from ..finetune import image_recipe
from ..masks import HeadMasks
from ..pruning.budget import Budget
from ..workflows.prune import build_members
from .runner import (
    EvaluationData,
    PipelineResult,
    Stage,
    StageRunner,
    evaluate_against_baselines,
    finetune_members_stage,
    hub_stage,
    members_stage,
    single_model_dir,
    single_model_stage,
)

logger = logging.getLogger(__name__)


@dataclass
class ImagePipeline:
    """Every choice of an image run. The defaults are the paper's CIFAR-100 / ViT-B/16 setting
    (3 members, 10 heads removed each, the paper's image recipe for 7 epochs)."""

    base_model: str  # a Hugging Face ViT folder with its image processor
    train_data: str  # data specs: an image folder (one sub-folder per class) or FOLDER:SPLIT
    validation_data: str
    test_data: str
    ood_test_data: dict[str, str] = field(default_factory=dict)
    labels: tuple[str, ...] | None = None  # class names of a bare encoder (default: from the data)
    # members
    members: int = 3
    method: str = "taylor"
    remove: int | None = 10  # heads removed per member, anywhere (of L x H); None with heads_per_layer
    heads_per_layer: int | None = None  # or: keep K heads in every block (the paper's budgets; set remove=None)
    prune_samples: int = 512  # ID validation images per member's Taylor scores
    prune_data_fraction: float = 0.8
    # fine-tuning (single model and members): the paper's image recipe (finetune.image_recipe)
    batch_size: int = 64
    learning_rate: float = 0.01
    member_learning_rate: float = 0.01
    single_steps: int | None = None
    member_steps: int | None = None
    num_epochs: int = 7
    early_stopping_patience: int | None = 2
    max_train_samples: int | None = None
    max_validation_samples: int | None = None
    mlp_fusion: str = "average"
    # evaluation
    max_test_samples: int | None = None
    max_ood_samples: int | None = None
    eval_batch_size: int = 64
    mc_samples: int = 10
    ensemble_heads: int = 3
    seed: int = 0
    # report and Hub folder
    report_title: str = "Hydra Ensembles (ViT)"
    report_notes: str = ""
    hub_base_model: str | None = None

    def __post_init__(self) -> None:
        self.budget()  # exactly one of remove / heads_per_layer

    def budget(self) -> Budget:
        """The members' pruning budget (exactly one of ``remove`` / ``heads_per_layer``)."""
        return Budget.of(self)

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _finetune_config(p: ImagePipeline, steps: int | None, learning_rate: float):
    return image_recipe(
        learning_rate=learning_rate, max_steps=steps, num_epochs=p.num_epochs, batch_size=p.batch_size,
        eval_batch_size=p.eval_batch_size, max_train_samples=p.max_train_samples,
        max_eval_samples=p.max_validation_samples, early_stopping_patience=p.early_stopping_patience, seed=p.seed,
        mlp_fusion=p.mlp_fusion, log_every_steps=20,
    )


def _load_images(spec: str, labelled: bool, limit: int | None):
    return resolve_dataset(spec, text_column=None, image_column="image", label_column="label" if labelled else None,
                           require_labels=labelled, max_samples=limit)


def build_image_members(p: ImagePipeline, model_dir: Path) -> HeadMasks:
    """Stage 2: M members by ``p.method`` on the fine-tuned single model, ID validation data only."""
    return build_members(
        model_dir, method=p.method, budget=p.budget(), id_data=p.validation_data,
        max_samples=p.prune_samples, image_column="image", members=p.members, seed=p.seed,
        data_fraction=p.prune_data_fraction, batch_size=32,
        metadata={"base_model": str(model_dir), "id_validation": p.validation_data},
    )


def evaluate_image_pipeline(p: ImagePipeline, single_dir: Path, hydra_dir: Path, member_dir: Path, report_dir: Path,
                            settings: dict[str, Any]) -> dict[str, Any]:
    """Stage 4: Hydra vs the paper's baselines on the ID test split and every OOD test set."""
    single, processor, _ = ev.load_classifier(single_dir)
    hydra, _, _ = ev.load_classifier(hydra_dir)
    pruned, _, _ = ev.load_classifier(member_dir)

    def loader(spec, labelled, limit):
        return ev.make_loader(_load_images(spec, labelled, limit), processor, "image", batch_size=p.eval_batch_size)

    data = EvaluationData(
        test=loader(p.test_data, True, p.max_test_samples),
        validation=loader(p.validation_data, True, p.max_validation_samples),
        oods={name: loader(spec, False, p.max_ood_samples) for name, spec in p.ood_test_data.items()},
        train=loader(p.train_data, True, p.max_train_samples),
    )
    return evaluate_against_baselines(
        data, report_dir, hydra_row=f"Hydra ({p.method}, M={p.members})", hydra=hydra, single=single, pruned=pruned,
        mc_samples=p.mc_samples, ensemble_heads=p.ensemble_heads, seed=p.seed, title=p.report_title,
        settings=settings, unit="images", notes=[p.report_notes] if p.report_notes else [],
    )


def run_image_pipeline(p: ImagePipeline, output_dir: str | os.PathLike, *, resume: bool = False,
                       repo_id: str = "your-org/hydra-vit") -> PipelineResult:
    """Run all stages (see the module docstring) and return the report and timings.

    ``PipelineResult.hub_check`` is the summary of :func:`hydra_hf.hub.validate_staged`.
    """
    runner = StageRunner(output_dir, resume=resume)  # first: refuses a folder it did not create
    out = runner.output_dir
    base = Path(p.base_model)

    runner.run(single_model_stage(base, out, train_data=p.train_data, validation_data=p.validation_data,
                                  config=_finetune_config(p, p.single_steps, p.learning_rate),
                                  id2label=dict(enumerate(p.labels)) if p.labels else None))
    single_dir = single_model_dir(out)

    masks = runner.run(members_stage(out / "masks.json", lambda: build_image_members(p, single_dir)))

    hydra_dir, hydra_work = out / "hydra", out / "hydra.work"
    runner.run(
        finetune_members_stage(
            single_dir,
            masks,
            out,
            train_data=p.train_data,
            validation_data=p.validation_data,
            config=_finetune_config(p, p.member_steps, p.member_learning_rate),
        )
    )

    settings = {**p.describe(), "jaccard": masks.metadata.get("pairwise_jaccard")}
    report_dir = out / "report"
    report = runner.run(Stage("4. evaluate", report_dir, lambda: evaluate_image_pipeline(
        p, single_dir, hydra_dir, hydra_work / "member_0" / "model", report_dir, settings), resumable=False))

    hub_check = runner.run(hub_stage(
        hydra_dir, out / "hub", repo_id=repo_id, report=report_dir / "report.json", base_model=p.hub_base_model,
        training=f"{p.method} members (seeds {p.seed}..{p.seed + p.members - 1}) fine-tuned on {p.train_data}"))
    return runner.finish(report, hub_check)
