"""Hugging Face DeiT checkpoints (``DeiTForImageClassification``, ``DeiTForImageClassificationWithTeacher``,
``DeiTModel``) <-> canonical members, as a ``members.Layout`` (saved-file names).

DeiT's layers are ViT's (same saved names); the embeddings add a distillation token, and the distilled
classifier has two heads (``cls_classifier``, ``distillation_classifier``), both kept per member.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import DeiTConfig

from ..modeling.configuration_hydra_deit import HydraEnsembleDeiTConfig
from ..modeling.modeling_hydra_deit import HydraEnsembleDeiTForImageClassification
from .build import label_arguments, load_fused, read_members
from .hf_vit import FILE_LAYER_MAP, VIT_SHAPE_KEYS
from .members import Layout, Member, Tower, fuse_members, read_member, unfuse_members
from .reader import Reader

HEADS = {"plain": ("classifier",), "distilled": ("cls_classifier", "distillation_classifier"), "none": ()}
EMBEDDING_KEYS = (
    "cls_token", "distillation_token", "position_embeddings", "patch_embeddings.projection.weight",
    "patch_embeddings.projection.bias",
)


def vit_layer_keys(config: dict[str, Any]) -> dict[str, str]:
    """Canonical key -> saved name inside a ViT-style layer (``attention.attention.query``...)."""
    keys = {}
    for short, path in FILE_LAYER_MAP.items():
        keys[f"{short}.weight"] = f"{path}.weight"
        if not (short in ("q", "k", "v") and config.get("qkv_bias") is False):
            keys[f"{short}.bias"] = f"{path}.bias"
    return keys


def deit_heads(state: dict[str, torch.Tensor]) -> str:
    """``"distilled"`` (WithTeacher), ``"plain"`` (one classifier) or ``"none"`` (a bare ``DeiTModel``)."""
    if "cls_classifier.weight" in state:
        return "distilled"
    return "plain" if "classifier.weight" in state else "none"


def deit_layout(config: dict[str, Any], heads: str = "plain", prefix: str = "deit.") -> Layout:
    """The layout of a DeiT checkpoint; ``prefix`` is ``"deit."`` for task models, ``""`` for ``DeiTModel``."""
    d = int(config["hidden_size"])
    per_member = {
        "hydra.layernorm.weight": f"{prefix}layernorm.weight",
        "hydra.layernorm.bias": f"{prefix}layernorm.bias",
    }
    for head in HEADS[heads]:
        per_member.update({f"{head}.weight": f"{head}.weight", f"{head}.bias": f"{head}.bias"})
    return Layout(
        family="DeiT",
        shared={f"hydra.embeddings.{k}": f"{prefix}embeddings.{k}" for k in EMBEDDING_KEYS},
        per_member=per_member,
        towers=(
            Tower("hydra.layers", f"{prefix}encoder.layer", int(config["num_hidden_layers"]),
                  int(config["num_attention_heads"]), d, vit_layer_keys(config), config.get("intermediate_size")),
        ),
        ignored=(r"^(deit\.)?pooler\.dense\.", r"embeddings\.mask_token$"),  # DeiTModel's pooler: not used to classify
    )


def deit_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> Member:
    """Map a saved DeiT state dict to canonical form (checks key counts and shapes)."""
    prefix = "deit." if any(k.startswith("deit.") for k in state) else ""
    return read_member(state, deit_layout(config, deit_heads(state), prefix), config, source)


def fuse_deit(
    members: list[Member], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """State dict of ``HydraEnsembleDeiTForImageClassification`` (``kept_heads[m][l]``; pass one member M
    times for one checkpoint). Without a classifier in the checkpoints the classifier keys are absent."""
    return fuse_members(members, {"hydra.layers": kept_heads}, mlp_fusion, shared)


def unfuse_deit(state: dict[str, torch.Tensor], hydra_config) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_deit``: one stock DeiT state dict (saved-file names) per member; removed heads zero."""
    heads = "distilled" if hydra_config.distilled else "plain"
    layout = deit_layout(hydra_config.base_config, heads)
    return unfuse_members(state, layout, {"hydra.layers": hydra_config.kept_heads}, hydra_config.num_members)


READER = Reader(deit_member_from_state_dict, fuse_deit, unfuse_deit)


def build_deit(
    folders: list[Path],
    masks: Any,
    *,
    mlp_fusion: str = "average",
    shared: str = "error",
    num_labels: int | None = None,
    id2label: dict[int, str] | None = None,
    seed: int = 0,
) -> Any:
    """DeiT checkpoint folders (one base, or one per member) + masks -> ``HydraEnsembleDeiTForImageClassification``.

    A distilled base (``DeiTForImageClassificationWithTeacher``) keeps both heads per member; a bare
    ``DeiTModel`` gets new per-member classifiers (``num_labels`` / ``id2label``, seeded by ``seed``).
    """
    raws, loaded = read_members(
        folders, DeiTConfig, deit_member_from_state_dict, lambda c: {k: c.get(k) for k in VIT_SHAPE_KEYS}
    )
    base = loaded[0].config
    masks.check_compatible(base["num_hidden_layers"], base["num_attention_heads"], model=repr(str(folders[0])))
    state = fuse_deit(loaded * masks.num_members if len(loaded) == 1 else loaded, masks.kept_heads, mlp_fusion, shared)
    distilled = "cls_classifier.weight" in state
    labels = label_arguments(
        state, "cls_classifier.weight" if distilled else "classifier.weight", raws[0], num_labels, id2label
    )
    config = HydraEnsembleDeiTConfig(
        base_config=base, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion, member_metadata=masks.member_metadata,
        distilled=distilled, **labels,
    )
    torch.manual_seed(seed)  # the per-member classifiers of a bare encoder are initialised from this seed
    model = HydraEnsembleDeiTForImageClassification(config)
    return load_fused(model, state, {"classifier.weight", "classifier.bias"}, folders[0], seed)
