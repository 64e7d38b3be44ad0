"""Hugging Face CLIP checkpoints (``CLIPModel``) <-> canonical members; fusion of CLIP members.

A ``CLIPMember`` holds one CLIP model in canonical form: per tower the canonical layer dicts of
``fuse.py``, the parts all members share (embeddings, the vision ``pre_layrnorm``, ``logit_scale``)
and the per-member parts (final LayerNorms, projections), both under the fused model's names. The
open_clip reader (``open_clip.py``) produces the same ``CLIPMember``, so one fused class serves both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import CLIPConfig

from ..masks import HeadMasks
from ..modeling.configuration_hydra_clip import HydraEnsembleCLIPConfig
from ..modeling.modeling_hydra_clip import HydraEnsembleCLIPModel
from .build import check_same_architecture, full_config, load_fused
from .fuse import describe_keys, fuse_layer, shared_tensor, unfuse_member_layers
from .hf_vit import check_layer_shapes
from .io import read_config, read_state_dict
from .reader import Reader

TOWERS = ("vision", "text")
TOWER_PREFIX = {"vision": "vision_model", "text": "text_model"}
LAYER_MAP = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.out_proj",
    "norm1": "layer_norm1",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
    "norm2": "layer_norm2",
}
# parts shared by all members (one tensor in the fused model); names are the fused model's and HF CLIP's
SHARED_KEYS = (
    "vision_model.embeddings.class_embedding",
    "vision_model.embeddings.patch_embedding.weight",
    "vision_model.embeddings.position_embedding.weight",
    "vision_model.pre_layrnorm.weight",
    "vision_model.pre_layrnorm.bias",
    "text_model.embeddings.token_embedding.weight",
    "text_model.embeddings.position_embedding.weight",
    "logit_scale",
)
# parts every member keeps (stacked along M in the fused model)
MEMBER_KEYS = (
    "vision_model.post_layernorm.weight",
    "vision_model.post_layernorm.bias",
    "text_model.final_layer_norm.weight",
    "text_model.final_layer_norm.bias",
    "visual_projection.weight",
    "text_projection.weight",
)
_IGNORED = ("vision_model.embeddings.position_ids", "text_model.embeddings.position_ids")


@dataclass
class CLIPMember:
    """One CLIP model in canonical form."""

    config: dict[str, Any]  # a CLIPConfig dict (nested vision_config / text_config)
    shared: dict[str, torch.Tensor]  # SHARED_KEYS
    towers: dict[str, list[dict[str, torch.Tensor]]]  # tower -> canonical layer dicts
    per_member: dict[str, torch.Tensor]  # MEMBER_KEYS


def tower_shape(config: dict[str, Any], tower: str) -> tuple[int, int]:
    """``(num_layers, num_heads)`` of a tower of a CLIPConfig dict."""
    sub = config[f"{tower}_config"]
    return int(sub["num_hidden_layers"]), int(sub["num_attention_heads"])


def clip_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> CLIPMember:
    """Map an HF ``CLIPModel`` state dict to canonical form; checks key counts and shapes."""
    used: set[str] = set()
    missing: list[str] = []

    def take(key: str) -> torch.Tensor | None:
        if key in state:
            used.add(key)
            return state[key]
        missing.append(key)
        return None

    shared = {k: take(k) for k in SHARED_KEYS}
    per_member = {k: take(k) for k in MEMBER_KEYS}
    towers = {}
    for tower in TOWERS:
        num_layers, _ = tower_shape(config, tower)
        layers = []
        for i in range(num_layers):
            layer = {}
            for short, long in LAYER_MAP.items():
                for p in ("weight", "bias"):
                    t = take(f"{TOWER_PREFIX[tower]}.encoder.layers.{i}.{long}.{p}")
                    if t is not None:
                        layer[f"{short}.{p}"] = t
            layers.append(layer)
        towers[tower] = layers
    if missing:
        if not any(k.startswith("vision_model.") for k in state):
            raise ValueError(
                f"{source} is not an HF CLIPModel checkpoint (no 'vision_model.*' tensors; found e.g. "
                f"{describe_keys(sorted(state))}); pass a CLIPModel folder, or --arch open-clip for open_clip"
            )
        raise ValueError(f"{source} is not a complete CLIPModel checkpoint: missing {describe_keys(missing)}")
    unknown = sorted(k for k in state if k not in used and k not in _IGNORED)
    if unknown:
        raise ValueError(
            f"{source} has tensors a stock CLIPModel does not: {describe_keys(unknown)} (more layers than its config, "
            "or another architecture); pass a CLIPModel checkpoint"
        )
    for tower in TOWERS:
        sub = config[f"{tower}_config"]
        check_layer_shapes(
            towers[tower], int(sub["hidden_size"]), sub.get("intermediate_size"), f"{source} ({tower} tower)"
        )
    return CLIPMember(config=config, shared=shared, towers=towers, per_member=per_member)


def fuse_clip(
    members: list[CLIPMember], kept_heads: dict[str, list[list[list[int]]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """State dict of ``HydraEnsembleCLIPModel`` from M members.

    ``kept_heads[tower][m][l]``: heads member m keeps in layer l of ``tower`` (both towers required;
    pass all heads for a tower that is not pruned). With one checkpoint for all members pass the same
    ``CLIPMember`` M times.
    """
    config = members[0].config
    out: dict[str, torch.Tensor] = {}
    for k in SHARED_KEYS:
        out[k] = shared_tensor(k, [m.shared[k] for m in members], shared)
    for tower in TOWERS:
        sub = config[f"{tower}_config"]
        dk = sub["hidden_size"] // sub["num_attention_heads"]
        for i in range(sub["num_hidden_layers"]):
            fused = fuse_layer(
                [m.towers[tower][i] for m in members], [kh[i] for kh in kept_heads[tower]], dk, mlp_fusion
            )
            out.update({f"{TOWER_PREFIX[tower]}.layers.{i}.{k}": v for k, v in fused.items()})
    for k in MEMBER_KEYS:
        out[k] = torch.stack([m.per_member[k] for m in members])
    return out


def unfuse_clip(state: dict[str, torch.Tensor], hydra_config) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_clip``: one stock ``CLIPModel`` state dict per member (the same names in saved
    files and in memory). Removed heads are zero in Q/K/V and ``out_proj``; under
    ``mlp_fusion="average"`` every member gets the averaged MLPs. A stock CLIPModel loading member m's
    dict reproduces the fused model's ``member_logits_per_image[:, m]``."""
    base = hydra_config.base_config
    members = []
    for m in range(hydra_config.num_members):
        sd = {k: state[k].clone() for k in SHARED_KEYS}
        sd.update({k: state[k][m].clone() for k in MEMBER_KEYS})
        for tower in TOWERS:
            sub = base[f"{tower}_config"]
            H, dk = sub["num_attention_heads"], sub["hidden_size"] // sub["num_attention_heads"]
            kept = hydra_config.kept_heads_of(tower)
            layers = unfuse_member_layers(state, f"{TOWER_PREFIX[tower]}.layers.", kept, H, dk, m)
            for i, canon in enumerate(layers):
                for short, long in LAYER_MAP.items():
                    for p in ("weight", "bias"):
                        sd[f"{TOWER_PREFIX[tower]}.encoder.layers.{i}.{long}.{p}"] = canon[f"{short}.{p}"]
        members.append(sd)
    return members


READER = Reader(clip_member_from_state_dict, fuse_clip, unfuse_clip)


def clip_model(
    folders: list[Path], loaded: list[CLIPMember], base_cfg: dict[str, Any], masks: HeadMasks, *, mlp_fusion: str,
    shared: str,
) -> HydraEnsembleCLIPModel:
    """Canonical CLIP members (HF or open_clip) + masks -> ``HydraEnsembleCLIPModel``, loaded and checked
    (a tower the masks do not list keeps all heads)."""
    shapes = {t: tower_shape(base_cfg, t) for t in TOWERS}
    kept = masks.kept_heads_by_tower(shapes, model=repr(str(folders[0])))
    member_weights = loaded * masks.num_members if len(loaded) == 1 else loaded
    state = fuse_clip(member_weights, kept, mlp_fusion, shared)
    config = HydraEnsembleCLIPConfig(
        base_config=base_cfg, vision_kept_heads=kept["vision"], text_kept_heads=kept["text"], mlp_fusion=mlp_fusion,
        member_metadata=masks.member_metadata,
    )
    return load_fused(HydraEnsembleCLIPModel(config), state, set(), folders[0], 0)


def build_clip(
    folders: list[Path], masks: HeadMasks, *, mlp_fusion: str = "average", shared: str = "error"
) -> HydraEnsembleCLIPModel:
    """HF CLIP checkpoint folders (one base, or one per member) + two-tower masks -> ``HydraEnsembleCLIPModel``."""
    configs = [full_config(CLIPConfig, read_config(f)) for f in folders]
    check_same_architecture(folders, [{t: tower_shape(c, t) for t in TOWERS} for c in configs])
    loaded = [
        clip_member_from_state_dict(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, configs)
    ]
    return clip_model(folders, loaded, configs[0], masks, mlp_fusion=mlp_fusion, shared=shared)
