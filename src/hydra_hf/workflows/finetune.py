"""``hydra-hf finetune``: every pruned member fine-tuned on a task (Accelerate), then the members fused into
one Hydra Ensemble folder; or the fused model trained directly.

:func:`finetune` reads a :class:`FinetuneSpec`: its training settings are a registered recipe
(:data:`hydra_hf.finetune.RECIPES`; default the paper's for the base: image for ViT, text otherwise), then a
settings file, then the settings given one by one (:meth:`FinetuneSpec.training_config`, logged in one line);
:func:`hydra_hf.finetune.finetune_members` or :func:`~hydra_hf.finetune.finetune_fused` trains.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..assemble import detect_arch
from ..errors import HydraInputError
from ..finetune import FinetuneConfig, finetune_fused, finetune_members, get_recipe

__all__ = ["FinetuneSpec", "finetune"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinetuneSpec:
    """What ``hydra-hf finetune`` trains; one field per option of the command.

    Attributes:
        model: the base checkpoint folder (or GGUF checkpoint).
        masks: the masks file for this base.
        train_data, eval_data: training data and validation data for early stopping (data specs).
        output: the fused model folder (must not exist or be empty, unless ``overwrite``).
        work_dir: checkpoints, logs and per-member folders (default: ``OUTPUT.work``).
        members: train only these members (several launches sharing ``work_dir``); fusing waits for all.
        fused: train the fused model directly instead of member by member.
        resume, resume_partial: continue an interrupted run exactly; or go on with a warning where a checkpoint
            lacks its RNG or trainer state.
        overwrite: replace ``output`` and empty ``work_dir``, only folders an earlier ``hydra-hf finetune`` wrote.
        recipe: a registered recipe's name (default: the paper's for the base).
        config: a JSON / YAML file of training settings.
        settings: training settings given one by one (:class:`~hydra_hf.finetune.FinetuneConfig` fields), over
            the recipe and the file.
        labels: comma-separated class names for a bare encoder or a causal LM.

    Raises:
        HydraInputError: fewer than two ``labels``, ``members`` with ``fused``, a setting that is no
            ``FinetuneConfig`` field.
    """

    model: str | os.PathLike
    masks: str | os.PathLike
    train_data: str
    output: str | os.PathLike
    eval_data: str | None = None
    work_dir: str | os.PathLike | None = None
    members: Sequence[int] | None = None
    fused: bool = False
    resume: bool = False
    resume_partial: bool = False
    overwrite: bool = False
    recipe: str | None = None
    config: str | os.PathLike | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    labels: str | None = None

    def __post_init__(self) -> None:
        names = self.label_names()
        if names is not None and len(names) < 2:
            raise HydraInputError(f"--labels needs at least two comma-separated class names, got {self.labels!r}")
        known = {f for f in FinetuneConfig.__dataclass_fields__}
        unknown = sorted(set(self.settings) - known)
        if unknown:
            raise HydraInputError(f"{unknown[0]!r} is not a training setting; use one of {sorted(known)}")

    def label_names(self) -> list[str] | None:
        """The class names of ``labels``, in order (None without it)."""
        if not self.labels:
            return None
        return [s.strip() for s in self.labels.split(",") if s.strip()]

    def training_config(self) -> FinetuneConfig:
        """The training settings: the recipe, then the ``config`` file, then ``settings``; the recipe and what
        overrides it are logged in one line."""
        overrides = dict(self.settings)
        if self.config:
            if self.recipe:
                overrides["recipe"] = self.recipe
            config = FinetuneConfig.from_file(self.config, **overrides)
            logger.info("settings from %s (recipe %s), flags over them: %s", self.config,
                        self.recipe or "from the file",
                        ", ".join(f"{k}={v}" for k, v in overrides.items() if k != "recipe") or "none")
            return config
        # no recipe: the paper's recipe for this base, image for ViT, text otherwise
        recipe = get_recipe(self.recipe or ("image" if detect_arch(self.model) == "vit" else "text"))
        config = recipe.config(**overrides)
        logger.info("%s", recipe.describe(overrides))
        return config


def finetune(spec: FinetuneSpec) -> Path | None:
    """Train ``spec``'s members (or the fused model) and fuse them into ``spec.output``; returns the folder,
    or None on a process that does not write it (under ``accelerate launch``) or a launch training some
    members only."""
    config = spec.training_config()
    names = spec.label_names()
    if spec.fused and spec.members is not None:
        raise HydraInputError("--members selects members to train one by one; it cannot be combined with --fused")
    common = dict(
        model_dir=spec.model, masks=spec.masks, train_data=spec.train_data, eval_data=spec.eval_data,
        output_dir=spec.output, config=config, work_dir=spec.work_dir, resume=spec.resume,
        resume_partial=spec.resume_partial, overwrite=spec.overwrite,
        id2label=None if names is None else dict(enumerate(names)),
        inputs=[spec.config] if spec.config else [],  # read here: never inside the output or the work folder
    )
    if spec.fused:
        return finetune_fused(**common)
    return finetune_members(**common, members=None if spec.members is None else list(spec.members))
