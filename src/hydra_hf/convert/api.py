"""Building a Hydra Ensemble from checkpoints on disk: ``convert_checkpoint``.

Two sources: (a) one base checkpoint plus a masks file (every member starts from the same weights and
keeps its own heads), or (b) M member checkpoints of the same architecture (e.g. fine-tuned
separately) plus the masks file saying which heads each kept. The state-dict work is done by the pure
functions of the per-architecture readers and ``fuse.py``; this module reads files, checks that they
fit together, builds the model and (optionally) saves it atomically.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from ..errors import HydraInputError
from ..export import check_output_dir, save_hydra_model
from ..families import Family, detect_family, family_names, get_family
from ..masks import HeadMasks, load_masks
from ..modeling.configuration_hydra import HydraEnsembleConfig
from ..modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification
from .hf_bert import bert_member_from_state_dict, fuse_bert
from .hf_clip import TOWERS, clip_member_from_state_dict, fuse_clip, tower_shape
from .hf_vit import fuse_vit, vit_member_from_state_dict
from .open_clip import open_clip_member_from_state_dict, open_clip_processor, read_open_clip_folder
from .timm_vit import timm_image_processor, timm_vit_member_from_state_dict
from .io import checkpoint_dir, read_config, read_state_dict

logger = logging.getLogger(__name__)

# The registered family names (a view of hydra_hf.families at import time; families() is the source).
SUPPORTED_ARCHS = tuple(family_names())
# config.json keys of the base that describe the checkpoint, not the architecture
_NOT_ARCHITECTURE = {
    "architectures", "id2label", "label2id", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
    "problem_type", "auto_map", "num_labels", "finetuning_task", "gradient_checkpointing", "use_cache",
}  # fmt: skip
_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def detect_arch(path: str | os.PathLike) -> str:
    """The family name of a checkpoint folder (:func:`hydra_hf.families.detect_family`), or
    ``HydraInputError`` (a ``ValueError``) naming the fix.

    HF folders by ``config.json``'s ``model_type``; ``"timm_vit"``: a timm folder (``config.json`` with
    ``architecture: "vit_..."``); ``"open_clip"``: a folder with ``open_clip_config.json``. A task head
    the family does not build (e.g. ``BertForTokenClassification``) is refused.
    """
    return detect_family(checkpoint_dir(path)).name


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
        import json

        name = json.loads(config.read_text()).get("_name_or_path")
    except (ValueError, OSError, AttributeError):
        return None
    return name if isinstance(name, str) and name.strip() else None


def base_config_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The architecture part of a base ``config.json`` (labels and bookkeeping dropped)."""
    return {k: v for k, v in config.items() if k not in _NOT_ARCHITECTURE}


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
        base: one checkpoint folder shared by all members.
        members: M checkpoint folders, member m keeping ``masks.kept_heads[m]`` of its own weights.
        output_dir: if given, save the model there (config, safetensors, shipped code, tokenizer).
        mlp_fusion: ``"average"`` (the paper's merged MLP) or ``"per_member"``.
        shared: what to do when the members' shared parts (embeddings) differ: ``"error"``,
            ``"average"`` or ``"first"``.
        arch: force the base architecture instead of detecting it.
        num_labels, id2label: labels of a classifier built from a bare encoder (its per-member
            classifiers are newly initialised, seeded by ``seed``); ignored when the checkpoints have
            a classifier.
        overwrite: replace a non-empty ``output_dir``.
        towers: CLIP only: the towers to prune (``["vision"]``, ``["text"]`` or both); each must be in the
            masks file (else ``ValueError`` naming it). Default: the towers the masks file lists; a tower
            it does not list keeps all heads.

    Returns:
        the fused model, in eval mode.
    """
    if (base is None) == (members is None or len(members) == 0):
        raise ValueError("pass exactly one of base=DIR or members=[DIR, ...]")
    # what the output may never be (or contain): the checkpoints and the masks file we read
    inputs = [base, *(members or []), None if isinstance(masks, HeadMasks) else masks]
    if output_dir is not None:
        check_output_dir(output_dir, overwrite, command="convert", inputs=inputs)  # fail before any work
    masks = _load_masks(masks)
    folders = [checkpoint_dir(base, what="base")] if base is not None else [checkpoint_dir(p, what="member") for p in members]
    if members is not None and len(folders) != masks.num_members:
        raise ValueError(
            f"{len(folders)} member checkpoints but the masks file describes {masks.num_members} members; "
            "give one checkpoint per member, in the masks file's order"
        )
    found = [_family_for(f, arch) for f in folders]
    if len({f.name for f in found}) != 1:
        raise ValueError(f"member checkpoints have different architectures {[f.name for f in found]}; use members of one base model")
    family = found[0]
    masks.check_towers(family.towers, towers, model=f"a {family.name} checkpoint")  # the file shape the family reads; towers=
    built = family.build(
        folders, masks, mlp_fusion=mlp_fusion, shared=shared, num_labels=num_labels, id2label=id2label, seed=seed,
        towers=towers,
    )
    model = built.model
    # what the card names as the base model: the checkpoint's own record of where it came from
    recorded = _recorded_source(folders[0])
    if recorded:
        model.config.base_model_name_or_path = recorded
    if output_dir is not None:
        save_hydra_model(model, output_dir, preprocessor_from=built.preprocessor_from, overwrite=overwrite,
                         extra=built.extra, command="convert", inputs=inputs)
    return model


def _build_bert(
    folders: list[Path],
    masks: HeadMasks,
    mlp_fusion: str,
    shared: str,
    num_labels: int | None,
    id2label: dict[int, str] | None,
    seed: int,
) -> HydraEnsembleForSequenceClassification:
    configs = [read_config(f) for f in folders]
    for f, c in zip(folders[1:], configs[1:]):
        diff = {k: (configs[0].get(k), c.get(k)) for k in _SHAPE_KEYS if configs[0].get(k) != c.get(k)}
        if diff:
            raise ValueError(f"member {str(f)!r} does not have the first member's architecture: {diff}")
    base_cfg = configs[0]
    masks.check_compatible(base_cfg["num_hidden_layers"], base_cfg["num_attention_heads"], model=repr(str(folders[0])))
    loaded = [bert_member_from_state_dict(read_state_dict(f), cfg, source=repr(str(f))) for f, cfg in zip(folders, configs)]
    member_weights = loaded * masks.num_members if len(loaded) == 1 else loaded
    state = fuse_bert(member_weights, masks.kept_heads, mlp_fusion, shared)

    has_classifier = "classifier.weight" in state
    labels: dict[str, Any] = {}
    if has_classifier:
        n = state["classifier.weight"].shape[1]
        if base_cfg.get("id2label") and len(base_cfg["id2label"]) == n:
            labels["id2label"] = {int(k): v for k, v in base_cfg["id2label"].items()}
        else:
            labels["num_labels"] = n
        if base_cfg.get("problem_type"):
            labels["problem_type"] = base_cfg["problem_type"]
    elif id2label:
        labels["id2label"] = {int(k): v for k, v in id2label.items()}
    else:
        labels["num_labels"] = num_labels or 2
    config = HydraEnsembleConfig(
        base_model_type="bert",
        base_config=base_config_dict(base_cfg),
        kept_heads=masks.kept_heads,
        mlp_fusion=mlp_fusion,
        member_metadata=masks.member_metadata,
        **labels,
    )
    torch.manual_seed(seed)  # the per-member classifiers of a bare encoder are initialised from this seed
    model = HydraEnsembleForSequenceClassification(config)
    result = model.load_state_dict({f"hydra.{k}" if not k.startswith("classifier.") else k: v for k, v in state.items()}, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"converter produced tensors the model does not have: {result.unexpected_keys[:5]}")
    new = sorted(result.missing_keys)
    allowed = {"classifier.weight", "classifier.bias", "hydra.pooler.weight", "hydra.pooler.bias"}
    if set(new) - allowed:
        raise ValueError(f"converter left model tensors unset: {sorted(set(new) - allowed)[:5]}")
    if new:
        logger.warning(
            "Some weights of the Hydra model were not in %s and are newly initialized (one per member, seed %d): %s. "
            "Fine-tune the model before using it for predictions.",
            folders[0], seed, new,
        )
    return model.eval()


# --------------------------------------------------------------------------------- ViT and CLIP
_VIT_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size", "patch_size")


def _full_config(cls, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a config.json) with the defaults of its transformers config class filled in, labels and
    bookkeeping dropped."""
    return base_config_dict(cls.from_dict(base_config_dict(raw)).to_dict())


def _check_same_architecture(folders: list[Path], configs: list[dict[str, Any]], keys: tuple[str, ...] | None = None) -> None:
    for f, c in zip(folders[1:], configs[1:]):
        names = keys or sorted(set(configs[0]) | set(c))
        diff = {k: (configs[0].get(k), c.get(k)) for k in names if configs[0].get(k) != c.get(k)}
        if diff:
            raise ValueError(f"member {str(f)!r} does not have the first member's architecture: {diff}")


def _load_checked(model: PreTrainedModel, state: dict[str, torch.Tensor], allowed_missing: set[str], source: Path, seed: int) -> None:
    """Load the converter's tensors; every model tensor must be set except ``allowed_missing`` (newly
    initialised classifiers, with a warning) and no converter tensor may be left over."""
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"converter produced tensors the model does not have: {result.unexpected_keys[:5]}")
    missing = set(result.missing_keys)
    if missing - allowed_missing:
        raise ValueError(f"converter left model tensors unset: {sorted(missing - allowed_missing)[:5]}")
    if missing:
        logger.warning(
            "Some weights of the Hydra model were not in %s and are newly initialized (one per member, seed %d): %s. "
            "Fine-tune the model before using it for predictions.",
            source, seed, sorted(missing),
        )


def _vit_labels(
    state: dict[str, torch.Tensor], names: Any, num_labels: int | None, id2label: dict[int, str] | None
) -> dict[str, Any]:
    """Label arguments of the config: the checkpoint's classifier and label names when it has them."""
    if "classifier.weight" in state:
        n = state["classifier.weight"].shape[1]
        if isinstance(names, dict) and len(names) == n:
            return {"id2label": {int(k): v for k, v in names.items()}}
        if isinstance(names, (list, tuple)) and len(names) == n:
            return {"id2label": dict(enumerate(names))}
        return {"num_labels": n}
    if id2label:
        return {"id2label": {int(k): v for k, v in id2label.items()}}
    return {"num_labels": num_labels or 2}


def _build_vit(
    arch: str,
    folders: list[Path],
    masks: HeadMasks,
    mlp_fusion: str,
    shared: str,
    num_labels: int | None,
    id2label: dict[int, str] | None,
    seed: int,
):
    """An HF ViT or timm ViT image classifier -> ``HydraEnsembleForImageClassification`` (and, for timm,
    a writer of the matching ``ViTImageProcessor``)."""
    from transformers import ViTConfig

    from ..modeling.configuration_hydra import HydraEnsembleViTConfig
    from ..modeling.modeling_hydra_vit import HydraEnsembleForImageClassification

    raw = [read_config(f) for f in folders]
    extra = None
    if arch == "vit":
        configs = [_full_config(ViTConfig, c) for c in raw]
        _check_same_architecture(folders, configs, _VIT_SHAPE_KEYS)
        loaded = [vit_member_from_state_dict(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, configs)]
        base_cfg, problem_type = configs[0], raw[0].get("problem_type")
        names = raw[0].get("id2label")
    else:
        loaded = [timm_vit_member_from_state_dict(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, raw)]
        _check_same_architecture(folders, [m.config for m in loaded])
        base_cfg, problem_type = _full_config(ViTConfig, loaded[0].config), None
        names = raw[0].get("label_names") or (raw[0].get("pretrained_cfg") or {}).get("label_names")
        processor = timm_image_processor(raw[0], base_cfg)
        extra = lambda folder: processor.save_pretrained(str(folder))  # noqa: E731
    masks.check_compatible(base_cfg["num_hidden_layers"], base_cfg["num_attention_heads"], model=repr(str(folders[0])))
    member_weights = loaded * masks.num_members if len(loaded) == 1 else loaded
    state = fuse_vit(member_weights, masks.kept_heads, mlp_fusion, shared)
    labels = _vit_labels(state, names, num_labels, id2label)
    if problem_type and "classifier.weight" in state:
        labels["problem_type"] = problem_type
    config = HydraEnsembleViTConfig(
        base_config=base_cfg, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion,
        member_metadata=masks.member_metadata, **labels,
    )
    torch.manual_seed(seed)  # the per-member classifiers of a bare encoder are initialised from this seed
    model = HydraEnsembleForImageClassification(config)
    state = {k if k.startswith("classifier.") else f"hydra.{k}": v for k, v in state.items()}
    _load_checked(model, state, {"classifier.weight", "classifier.bias"}, folders[0], seed)
    return model.eval(), extra


def _build_clip(
    arch: str,
    folders: list[Path],
    masks: HeadMasks,
    mlp_fusion: str,
    shared: str,
    towers: Sequence[str] | None,
):
    """An HF CLIP or open_clip model -> ``HydraEnsembleCLIPModel`` (and, for open_clip, a writer of the
    matching ``CLIPProcessor``)."""
    from transformers import CLIPConfig

    from ..modeling.configuration_hydra import HydraEnsembleCLIPConfig
    from ..modeling.modeling_hydra_clip import HydraEnsembleCLIPModel

    masks.check_towers(TOWERS, towers, model="a CLIP checkpoint")
    extra = None
    if arch == "clip":
        configs = [_full_config(CLIPConfig, read_config(f)) for f in folders]
        _check_same_architecture(folders, [{t: tower_shape(c, t) for t in TOWERS} for c in configs])
        loaded = [clip_member_from_state_dict(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, configs)]
        base_cfg = configs[0]
    else:
        read = [read_open_clip_folder(f) for f in folders]
        loaded = [open_clip_member_from_state_dict(s, c["model_cfg"], source=repr(str(f))) for f, (s, c) in zip(folders, read)]
        _check_same_architecture(folders, [{t: tower_shape(m.config, t) for t in TOWERS} for m in loaded])
        base_cfg = base_config_dict(loaded[0].config)
        processor = open_clip_processor(base_cfg, read[0][1])
        extra = lambda folder: processor.save_pretrained(str(folder))  # noqa: E731
    shapes = {t: tower_shape(base_cfg, t) for t in TOWERS}
    kept = masks.kept_heads_by_tower(shapes, model=repr(str(folders[0])))  # a tower not in the masks keeps all heads
    M = masks.num_members
    member_weights = loaded * M if len(loaded) == 1 else loaded
    state = fuse_clip(member_weights, kept, mlp_fusion, shared)
    config = HydraEnsembleCLIPConfig(
        base_config=base_cfg, vision_kept_heads=kept["vision"], text_kept_heads=kept["text"], mlp_fusion=mlp_fusion,
        member_metadata=masks.member_metadata,
    )
    model = HydraEnsembleCLIPModel(config)
    _load_checked(model, state, set(), folders[0], 0)
    return model.eval(), extra
