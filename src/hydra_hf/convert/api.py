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

from ..export import check_output_dir, save_hydra_model
from ..masks import HeadMasks
from ..modeling.configuration_hydra import HydraEnsembleConfig
from ..modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification
from .hf_bert import bert_member_from_state_dict, fuse_bert
from .io import checkpoint_dir, read_config, read_state_dict

logger = logging.getLogger(__name__)

SUPPORTED_ARCHS = ("bert",)
# config.json keys of the base that describe the checkpoint, not the architecture
_NOT_ARCHITECTURE = {
    "architectures", "id2label", "label2id", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
    "problem_type", "auto_map", "num_labels", "finetuning_task", "gradient_checkpointing", "use_cache",
}  # fmt: skip
_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def detect_arch(path: str | os.PathLike) -> str:
    """The base architecture of a checkpoint folder (``"bert"``), or ``ValueError`` naming the fix."""
    config = read_config(path)
    model_type = config.get("model_type")
    if model_type == "hydra_ensemble":
        raise ValueError(f"{str(path)!r} is already a Hydra Ensemble; convert the base model it was built from")
    if model_type == "bert":
        return "bert"
    raise ValueError(
        f"{str(path)!r} has model_type={model_type!r}; hydra_hf converts {list(SUPPORTED_ARCHS)} checkpoints "
        "(pass a BERT-family folder, or --arch to force one)"
    )


def base_config_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The architecture part of a base ``config.json`` (labels and bookkeeping dropped)."""
    return {k: v for k, v in config.items() if k not in _NOT_ARCHITECTURE}


def _load_masks(masks: HeadMasks | str | os.PathLike) -> HeadMasks:
    if isinstance(masks, HeadMasks):
        return masks
    return HeadMasks.load(masks)


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
) -> PreTrainedModel:
    """Fuse a base checkpoint (``base``) or M member checkpoints (``members``) into one Hydra model.

    Args:
        masks: a ``HeadMasks`` or the path of a masks file.
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

    Returns:
        the fused model, in eval mode.
    """
    if (base is None) == (members is None or len(members) == 0):
        raise ValueError("pass exactly one of base=DIR or members=[DIR, ...]")
    if output_dir is not None:
        check_output_dir(output_dir, overwrite)  # fail before any work
    masks = _load_masks(masks)
    folders = [checkpoint_dir(base, what="base")] if base is not None else [checkpoint_dir(p, what="member") for p in members]
    if members is not None and len(folders) != masks.num_members:
        raise ValueError(
            f"{len(folders)} member checkpoints but the masks file describes {masks.num_members} members; "
            "give one checkpoint per member, in the masks file's order"
        )
    archs = [arch or detect_arch(f) for f in folders]
    if arch is not None and arch not in SUPPORTED_ARCHS:
        raise ValueError(f"--arch {arch!r} is not supported here; use one of {list(SUPPORTED_ARCHS)}")
    if len(set(archs)) != 1:
        raise ValueError(f"member checkpoints have different architectures {archs}; use members of one base model")
    model = _build_bert(folders, masks, mlp_fusion, shared, num_labels, id2label, seed)
    if output_dir is not None:
        save_hydra_model(model, output_dir, preprocessor_from=folders[0], overwrite=overwrite)
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
