"""``hydra-hf convert``: a base checkpoint (or M member checkpoints) and a masks file fused into one Hydra
Ensemble folder that loads with ``trust_remote_code=True``.

:func:`convert` reads a :class:`ConvertSpec`, loads the masks (one tower, or named towers in a file with
``"towers"``) and hands them to :func:`hydra_hf.assemble.convert_checkpoint` (detect the family, read, fuse,
build, save).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from ..assemble import convert_checkpoint
from ..errors import HydraInputError
from ..masks import load_masks

__all__ = ["ConvertSpec", "convert"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConvertSpec:
    """What ``hydra-hf convert`` fuses; one field per option of the command.

    Attributes:
        masks: the masks file (``hydra-hf prune``'s output).
        output: the Hydra folder (must not exist or be empty, unless ``overwrite``).
        base, members: one checkpoint folder (or GGUF checkpoint) shared by every member, or one per member
            in masks order (exactly one of the two).
        mlp_fusion: ``average`` (the paper) or ``per_member``.
        shared_weights: when the members' shared parts differ: ``error``, ``average`` or ``first``.
        arch: the family, instead of detecting it.
        towers: CLIP: the towers to prune (default: those the masks file lists).
        num_labels, labels: the classes of a classifier built from a bare encoder or a causal LM (new heads);
            ``labels`` comma-separated class names.
        seed: the seed of newly initialised per-member classifiers.
        overwrite: replace ``output`` when an earlier ``hydra-hf convert`` wrote it.

    Raises:
        HydraInputError: no checkpoint or both kinds, or ``num_labels`` that disagrees with ``labels``.
    """

    masks: str | os.PathLike
    output: str | os.PathLike
    base: str | os.PathLike | None = None
    members: Sequence[str | os.PathLike] | None = None
    mlp_fusion: str = "average"
    shared_weights: str = "error"
    arch: str | None = None
    towers: Sequence[str] | None = None
    num_labels: int | None = None
    labels: str | None = None
    seed: int = 0
    overwrite: bool = False

    def __post_init__(self) -> None:
        if (self.base is None) == (self.members is None):
            raise HydraInputError("give one checkpoint shared by all members (--base) or one per member (--members), "
                                  "not both or neither")
        names = self.label_names()
        if names is not None and self.num_labels is not None and self.num_labels != len(names):
            raise HydraInputError(f"--num-labels {self.num_labels} disagrees with {len(names)} --labels {names}")

    def label_names(self) -> list[str] | None:
        """The class names of ``labels``, in order (None without it)."""
        if not self.labels:
            return None
        return [s.strip() for s in self.labels.split(",") if s.strip()]


def convert(spec: ConvertSpec) -> nn.Module:
    """Fuse ``spec``'s checkpoints and masks into the Hydra folder ``spec.output``; returns the model."""
    masks = load_masks(spec.masks)  # one tower, or named towers (CLIP) in a masks file with "towers"
    logger.info("masks: %s", masks.summary())
    if masks.num_members == 1:
        logger.warning(
            "the masks file has 1 member: the model is one pruned network, which cannot disagree with itself "
            "(mutual information 0, no ensemble uncertainty); prune 2 or more members (hydra-hf prune --members M)"
        )
    names = spec.label_names()
    return convert_checkpoint(
        masks,
        base=spec.base,
        members=None if spec.members is None else list(spec.members),
        output_dir=spec.output,
        mlp_fusion=spec.mlp_fusion,
        shared=spec.shared_weights,
        arch=spec.arch,
        num_labels=spec.num_labels,
        id2label=None if names is None else dict(enumerate(names)),
        seed=spec.seed,
        overwrite=spec.overwrite,
        towers=None if spec.towers is None else list(spec.towers),
    )
