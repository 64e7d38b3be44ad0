"""Hugging Face SigLIP checkpoints (``SiglipModel``) <-> canonical members, as a ``members.Layout``.

Two towers like CLIP (``vision_model.encoder.layers``, ``text_model.encoder.layers``). Shared: the
embeddings. Per member: the final LayerNorms, the vision tower's attention-pooling head (not pruned:
probe, ``nn.MultiheadAttention`` in/out projections, LayerNorm, MLP), the text tower's ``head`` and
``logit_scale`` / ``logit_bias``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import SiglipConfig

from ..modeling.configuration_hydra_siglip import HydraEnsembleSiglipConfig
from ..modeling.modeling_hydra_siglip import HydraEnsembleSiglipModel
from .build import load_fused, read_members
from .members import Layout, Member, Tower, fuse_members, read_member, unfuse_members
from .reader import Reader

TOWER_PREFIXES = {"vision": "vision_model", "text": "text_model"}
LAYER_PATHS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.out_proj",
               "norm1": "layer_norm1", "norm2": "layer_norm2", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
SHARED_KEYS = (
    "vision_model.embeddings.patch_embedding.weight", "vision_model.embeddings.patch_embedding.bias",
    "vision_model.embeddings.position_embedding.weight", "text_model.embeddings.token_embedding.weight",
    "text_model.embeddings.position_embedding.weight",
)
# fused name -> stock name of the parts every member keeps
MEMBER_KEYS = {
    "vision_model.post_layernorm.weight": "vision_model.post_layernorm.weight",
    "vision_model.post_layernorm.bias": "vision_model.post_layernorm.bias",
    "vision_model.head.probe": "vision_model.head.probe",
    "vision_model.head.in_proj_weight": "vision_model.head.attention.in_proj_weight",
    "vision_model.head.in_proj_bias": "vision_model.head.attention.in_proj_bias",
    "vision_model.head.out_proj.weight": "vision_model.head.attention.out_proj.weight",
    "vision_model.head.out_proj.bias": "vision_model.head.attention.out_proj.bias",
    "vision_model.head.layernorm.weight": "vision_model.head.layernorm.weight",
    "vision_model.head.layernorm.bias": "vision_model.head.layernorm.bias",
    "vision_model.head.mlp.fc1_weight": "vision_model.head.mlp.fc1.weight",
    "vision_model.head.mlp.fc1_bias": "vision_model.head.mlp.fc1.bias",
    "vision_model.head.mlp.fc2_weight": "vision_model.head.mlp.fc2.weight",
    "vision_model.head.mlp.fc2_bias": "vision_model.head.mlp.fc2.bias",
    "text_model.final_layer_norm.weight": "text_model.final_layer_norm.weight",
    "text_model.final_layer_norm.bias": "text_model.final_layer_norm.bias",
    "text_model.head.weight": "text_model.head.weight",
    "text_model.head.bias": "text_model.head.bias",
    "logit_scale": "logit_scale",
    "logit_bias": "logit_bias",
}


def siglip_layout(config: dict[str, Any]) -> Layout:
    """The layout of a ``SiglipModel`` checkpoint (a ``SiglipConfig`` dict with both tower configs)."""
    keys = {f"{short}.{p}": f"{path}.{p}" for short, path in LAYER_PATHS.items() for p in ("weight", "bias")}
    towers = []
    for tower, prefix in TOWER_PREFIXES.items():
        sub = config[f"{tower}_config"]
        towers.append(
            Tower(
                f"{prefix}.layers",
                f"{prefix}.encoder.layers",
                int(sub["num_hidden_layers"]),
                int(sub["num_attention_heads"]),
                int(sub["hidden_size"]),
                keys,
                sub.get("intermediate_size"),
            )
        )
    return Layout(
        family="SigLIP",
        shared={k: k for k in SHARED_KEYS},
        per_member=dict(MEMBER_KEYS),
        towers=tuple(towers),
        ignored=(r"position_ids$",),  # buffers some checkpoints carry
    )


def siglip_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> Member:
    """Map a saved ``SiglipModel`` state dict to canonical form (checks key counts and shapes)."""
    if not any(k.startswith("vision_model.") for k in state) or not any(k.startswith("text_model.") for k in state):
        raise ValueError(
            f"{source} is not a SiglipModel checkpoint (it needs both 'vision_model.*' and 'text_model.*' tensors); "
            "pass a SiglipModel folder (zero-shot image classification)"
        )
    return read_member(state, siglip_layout(config), config, source)


def fuse_siglip(
    members: list[Member], kept_heads: dict[str, list[list[list[int]]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """State dict of ``HydraEnsembleSiglipModel``; ``kept_heads[tower][m][l]`` for ``tower`` in vision, text
    (both required: pass all heads for a tower that is not pruned)."""
    return fuse_members(
        members, {f"{TOWER_PREFIXES[t]}.layers": kept_heads[t] for t in TOWER_PREFIXES}, mlp_fusion, shared
    )


def unfuse_siglip(state: dict[str, torch.Tensor], hydra_config) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_siglip``: one stock ``SiglipModel`` state dict per member; removed heads zero."""
    kept = {f"{TOWER_PREFIXES[t]}.layers": hydra_config.kept_heads_of(t) for t in TOWER_PREFIXES}
    return unfuse_members(state, siglip_layout(hydra_config.base_config), kept, hydra_config.num_members)


READER = Reader(siglip_member_from_state_dict, fuse_siglip, unfuse_siglip)


def build_siglip(
    folders: list[Path],
    masks: Any,
    *,
    mlp_fusion: str = "average",
    shared: str = "error",
    num_labels: int | None = None,
    id2label: dict[int, str] | None = None,
    seed: int = 0,
) -> Any:
    """SigLIP checkpoint folders (one base, or one per member) + two-tower masks -> ``HydraEnsembleSiglipModel``.

    A tower the masks file does not list keeps every head. ``num_labels``/``id2label``/``seed`` are not used
    (zero-shot).
    """
    def shape(c: dict) -> dict:
        return {t: (c[f"{t}_config"]["num_hidden_layers"], c[f"{t}_config"]["num_attention_heads"])
                for t in TOWER_PREFIXES}

    _, loaded = read_members(folders, SiglipConfig, siglip_member_from_state_dict, shape)
    base = loaded[0].config
    shapes = shape(base)
    kept = masks.kept_heads_by_tower(shapes, model=repr(str(folders[0])))  # a tower not in the masks keeps all heads
    M = masks.num_members
    state = fuse_siglip(loaded * M if len(loaded) == 1 else loaded, kept, mlp_fusion, shared)
    config = HydraEnsembleSiglipConfig(
        base_config=base, vision_kept_heads=kept["vision"], text_kept_heads=kept["text"], mlp_fusion=mlp_fusion,
        member_metadata=masks.member_metadata,
    )
    return load_fused(HydraEnsembleSiglipModel(config), state, set(), folders[0], seed)
