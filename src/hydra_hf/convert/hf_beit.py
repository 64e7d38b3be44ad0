"""Hugging Face BEiT checkpoints (``BeitForImageClassification``, ``BeitModel``) <-> canonical members, as a
``members.Layout`` (saved-file names).

Per layer: ViT's tensors without a key bias, ``lambda_1``/``lambda_2`` (layer scale, kept per member) and
the relative position bias table ``(R, H)`` (``heads.*``: sliced with the kept heads). The shared table
(``use_shared_relative_position_bias``) is kept per member, ``(M, R, H)``. Pooling: the pooler LayerNorm
(mean pooling) or the final LayerNorm, per member.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import BeitConfig

from ..modeling.configuration_hydra_beit import HydraEnsembleBeitConfig
from ..modeling.modeling_hydra_beit import HydraEnsembleBeitForImageClassification
from .build import label_arguments, load_fused, read_members
from .hf_vit import FILE_LAYER_MAP
from .members import Layout, Member, Tower, fuse_members, read_member, unfuse_members
from .reader import Reader

TABLE = "attention.attention.relative_position_bias.relative_position_bias_table"


def beit_layout(config: dict[str, Any], has_classifier: bool = True, prefix: str = "beit.") -> Layout:
    """The layout of a BEiT checkpoint; ``prefix`` is ``"beit."`` for task models, ``""`` for ``BeitModel``."""
    d = int(config["hidden_size"])
    shared = {
        "hydra.embeddings.cls_token": f"{prefix}embeddings.cls_token",
        **{f"hydra.embeddings.patch_embeddings.projection.{p}": f"{prefix}embeddings.patch_embeddings.projection.{p}"
           for p in ("weight", "bias")},
    }
    if config.get("use_absolute_position_embeddings"):
        shared["hydra.embeddings.position_embeddings"] = f"{prefix}embeddings.position_embeddings"
    per_member = {}
    if config.get("use_shared_relative_position_bias"):
        per_member["hydra.shared_relative_position_bias_table"] = (
            f"{prefix}encoder.relative_position_bias.relative_position_bias_table"
        )
    norm = ("hydra.pooler_layernorm", f"{prefix}pooler.layernorm") if config.get("use_mean_pooling", True) else (
        "hydra.layernorm", f"{prefix}layernorm")
    per_member.update({f"{norm[0]}.{p}": f"{norm[1]}.{p}" for p in ("weight", "bias")})
    if has_classifier:
        per_member.update({"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"})
    keys = {}
    for short, path in FILE_LAYER_MAP.items():
        keys[f"{short}.weight"] = f"{path}.weight"
        if short != "k":  # BEiT's key projection has no bias
            keys[f"{short}.bias"] = f"{path}.bias"
    if float(config.get("layer_scale_init_value", 0.1)) > 0:
        keys.update({"member.lambda_1": "lambda_1", "member.lambda_2": "lambda_2"})
    if config.get("use_relative_position_bias"):
        keys["heads.relative_position_bias_table"] = TABLE
    return Layout(
        family="BEiT",
        shared=shared,
        per_member=per_member,
        towers=(Tower("hydra.layers", f"{prefix}encoder.layer", int(config["num_hidden_layers"]),
                      int(config["num_attention_heads"]), d, keys, config.get("intermediate_size")),),
        ignored=(r"relative_position_index$", r"embeddings\.mask_token$"),  # a buffer of old checkpoints; MIM only
    )


def beit_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> Member:
    """Map a saved BEiT state dict to canonical form (checks key counts and shapes)."""
    prefix = "beit." if any(k.startswith("beit.") for k in state) else ""
    return read_member(state, beit_layout(config, "classifier.weight" in state, prefix), config, source)


def fuse_beit(
    members: list[Member], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """State dict of ``HydraEnsembleBeitForImageClassification`` (``kept_heads[m][l]``)."""
    return fuse_members(members, {"hydra.layers": kept_heads}, mlp_fusion, shared)


def unfuse_beit(state: dict[str, torch.Tensor], hydra_config) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_beit``: one stock BEiT state dict (saved-file names) per member; removed heads are
    zero in Q/K/V, W_O and the relative position bias columns."""
    layout = beit_layout(hydra_config.base_config)
    return unfuse_members(state, layout, {"hydra.layers": hydra_config.kept_heads}, hydra_config.num_members)


READER = Reader(beit_member_from_state_dict, fuse_beit, unfuse_beit)


# config keys that must agree between member checkpoints: the ViT ones and BEiT's options
BEIT_SHAPE_KEYS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size", "patch_size",
    "use_relative_position_bias", "use_shared_relative_position_bias", "use_mean_pooling", "layer_scale_init_value",
    "use_absolute_position_embeddings",
)


def build_beit(
    folders: list[Path],
    masks: Any,
    *,
    mlp_fusion: str = "average",
    shared: str = "error",
    num_labels: int | None = None,
    id2label: dict[int, str] | None = None,
    seed: int = 0,
) -> Any:
    """BEiT checkpoint folders (one base, or one per member) + masks -> ``HydraEnsembleBeitForImageClassification``
    (a bare ``BeitModel`` gets new per-member classifiers, seeded by ``seed``)."""
    raws, loaded = read_members(
        folders, BeitConfig, beit_member_from_state_dict, lambda c: {k: c.get(k) for k in BEIT_SHAPE_KEYS}
    )
    base = loaded[0].config
    masks.check_compatible(base["num_hidden_layers"], base["num_attention_heads"], model=repr(str(folders[0])))
    state = fuse_beit(loaded * masks.num_members if len(loaded) == 1 else loaded, masks.kept_heads, mlp_fusion, shared)
    labels = label_arguments(state, "classifier.weight", raws[0], num_labels, id2label)
    config = HydraEnsembleBeitConfig(
        base_config=base, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion, member_metadata=masks.member_metadata,
        **labels,
    )
    torch.manual_seed(seed)
    model = HydraEnsembleBeitForImageClassification(config)
    return load_fused(model, state, {"classifier.weight", "classifier.bias"}, folders[0], seed)
