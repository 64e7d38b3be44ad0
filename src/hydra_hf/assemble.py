"""Assembling a Hydra folder from checkpoints on disk: ``convert_checkpoint`` (detect the family, look
it up in the registry, build, save).

This stage sits above the family registry (:mod:`hydra_hf.families`), which sits above the build
helpers (:mod:`hydra_hf.convert`). Two sources: (a) one base checkpoint plus a masks file (every
member starts from the same weights and keeps its own heads), or (b) M member checkpoints of the same
architecture (e.g. fine-tuned separately) plus the masks file saying which heads each kept. The state-dict
work is done by the pure functions of the per-architecture readers and ``fuse.py``; this module reads files,
checks that they fit together, builds the model and (optionally) saves it atomically.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedModel

from .convert.gguf import CONFIG_KEY as GGUF_KEY
from .convert.gguf import checkpoint_inputs, gguf_source
from .convert.io import checkpoint_dir, read_config
from .convert.slim import check_slim_widths, neurons_by_field, slim_model
from .errors import HydraInputError
from .families import Family, detect_family, family_names, get_family, resolve_checkpoint
from .masks import HeadMasks, load_masks
from .saving import check_output_dir, save_hydra_model

logger = logging.getLogger(__name__)

# The registered family names (a view of hydra_hf.families at import time; families() is the source).
SUPPORTED_ARCHS = tuple(family_names())


def detect_arch(path: str | os.PathLike) -> str:
    """The family name of a checkpoint folder (:func:`hydra_hf.families.detect_family`), or
    ``HydraInputError`` (a ``ValueError``) naming the fix.

    HF folders by ``config.json``'s ``model_type``; ``"timm_vit"``: a timm folder (``config.json`` with
    ``architecture: "vit_..."``); ``"open_clip"``: a folder with ``open_clip_config.json``; a GGUF checkpoint
    (a ``.gguf`` file or a folder holding one): its materialised folder's. A task head the family does not
    build (e.g. ``BertForTokenClassification``) is refused.
    """
    return detect_family(checkpoint_dir(resolve_checkpoint(path))).name


def _family_for(folder: Path, arch: str | None) -> Family:
    """The family of ``folder``: detected, or ``arch`` when forced (which must then fit the folder)."""
    if arch is None:
        return detect_family(folder)
    family = get_family(arch)
    try:
        found = detect_family(folder, check=False)
    except ValueError:  # not detectable: the forced family's reader decides
        found = None
    if found is not None and found is not family:
        raise HydraInputError(
            f"--arch {arch!r} does not fit {str(folder)!r}, which is a {found.name} checkpoint; leave --arch out"
        )
    config = read_config(folder) if (folder / "config.json").is_file() else None
    family.check_checkpoint(config, repr(str(folder)))
    return family


def _recorded_source(folder: Path) -> str | None:
    """The base checkpoint's ``_name_or_path`` (a Hub id or the folder it was loaded from), if it has one."""
    config = folder / "config.json"
    if not config.is_file():
        return None
    try:
        name = json.loads(config.read_text()).get("_name_or_path")
    except (ValueError, OSError, AttributeError):
        return None
    return name if isinstance(name, str) and name.strip() else None


def _load_masks(masks: HeadMasks | str | os.PathLike) -> HeadMasks:
    if isinstance(masks, HeadMasks):
        return masks
    return load_masks(masks)


def convert_checkpoint(
    masks: HeadMasks | str | os.PathLike,
    *,
    base: str | os.PathLike | None = None,
    members: Sequence[str | os.PathLike] | None = None,
    output_dir: str | os.PathLike | None = None,
    mlp_fusion: str = "average",
    shared: str = "error",
    arch: str | None = None,
    num_labels: int | None = None,
    id2label: dict[int, str] | None = None,
    seed: int = 0,
    overwrite: bool = False,
    towers: Sequence[str] | None = None,
) -> PreTrainedModel:
    """Fuse a base checkpoint (``base``) or M member checkpoints (``members``) into one Hydra model.

    Args:
        masks: a ``HeadMasks`` (one tower for BERT, ViT...; named towers for CLIP, SigLIP, open_clip)
            or the path of a masks file.
        base: one checkpoint folder shared by all members, or a GGUF checkpoint (a ``.gguf`` file or a folder
            holding one: read through its cached plain folder, :func:`hydra_hf.families.resolve_checkpoint`).
        members: M checkpoint folders (or GGUF checkpoints), member m keeping ``masks.kept_heads[m]`` of its
            own weights.
        output_dir: if given, save the model there (config, safetensors, shipped code, tokenizer).
        mlp_fusion: ``"average"`` (the paper's merged MLP) or ``"per_member"``.
        shared: what to do when the members' shared parts (embeddings) differ: ``"error"``,
            ``"average"`` or ``"first"``.
        arch: force the base architecture instead of detecting it.
        num_labels, id2label: labels of a classifier built from a bare encoder or a decoder's causal LM (its
            per-member classifiers are newly initialised, seeded by ``seed``); ignored when the checkpoints
            have a classifier.
        overwrite: replace a non-empty ``output_dir``.
        towers: CLIP only: the towers to prune (``["vision"]``, ``["text"]`` or both); each must be in the
            masks file (else ``ValueError`` naming it). Default: the towers the masks file lists; a tower
            it does not list keeps all heads.

    Returns:
        the fused model, in eval mode.
    """
    if (base is None) == (members is None or len(members) == 0):
        raise ValueError("pass exactly one of base=DIR or members=[DIR, ...]")
    # what the output may never be (or contain): the checkpoints (a GGUF's folder and cache too) and the masks file
    # (masks loaded by the caller name their file too)
    sources = [base] if base is not None else list(members)
    inputs = [*(p for s in sources for p in checkpoint_inputs(s)),
              masks.source if isinstance(masks, HeadMasks) else masks]
    if output_dir is not None:
        check_output_dir(output_dir, overwrite, command="convert", inputs=inputs)  # fail before any work
    masks = _load_masks(masks)
    what = "base" if base is not None else "member"
    folders = [checkpoint_dir(resolve_checkpoint(p), what=what) for p in sources]
    inputs += [f for f, s in zip(folders, sources) if Path(s) != f]  # the materialised folders of GGUF checkpoints
    if members is not None and len(folders) != masks.num_members:
        raise ValueError(
            f"{len(folders)} member checkpoints but the masks file describes {masks.num_members} members; "
            "give one checkpoint per member, in the masks file's order"
        )
    found = [_family_for(f, arch) for f in folders]
    if len({f.name for f in found}) != 1:
        raise ValueError(
            f"member checkpoints have different architectures {[f.name for f in found]}; use members of one base model"
        )
    family = found[0]
    if base is not None:
        for i, j in masks.identical_members():
            logger.warning(
                "members %d and %d of the masks keep the same heads%s (Jaccard 1.0): fused from one base they "
                "are one model counted twice; prune them with other seeds or methods",
                i,
                j,
                " and the same MLP neurons" if masks.slim else "",
            )
    # the one check that the masks fit the family's towers (the file shape it reads; towers= in them)
    masks.check_towers(family.towers, towers, model=f"a {family.name} checkpoint")
    build_fusion = "per_member" if masks.slim else mlp_fusion  # slim: each neuron averaged over its members below
    built = family.build(
        folders, masks, mlp_fusion=build_fusion, shared=shared, num_labels=num_labels, id2label=id2label, seed=seed
    )
    model = built.model
    if masks.slim:  # members that keep subsets of the MLP neurons too: slice the fused whole MLPs
        check_slim_widths(masks, model, name=f"the checkpoint {str(folders[0])!r}")  # before lists of its width
        model = slim_model(model, neurons_by_field(masks), mlp_fusion)
    # what the card names as the base model: the checkpoint's own record of where it came from
    # a GGUF checkpoint (or members fine-tuned from one) records its source file and quantisation
    source = gguf_source(read_config(folders[0])) if (folders[0] / "config.json").is_file() else None
    recorded = _recorded_source(folders[0]) or (source["file"] if source else None)
    if recorded:
        model.config.base_model_name_or_path = recorded
    if source is not None:
        setattr(model.config, GGUF_KEY, source)
    if output_dir is not None:
        save_hydra_model(model, output_dir, preprocessor_from=built.preprocessor_from, overwrite=overwrite,
                         extra=built.extra, command="convert", inputs=inputs)
    return model
