"""Hugging Face DINOv2 checkpoints (``Dinov2ForImageClassification``, ``Dinov2Model`` and the
``dinov2_with_registers`` variants) <-> canonical members, as a ``members.Layout`` (saved-file names).

Per layer: ``norm1``/``norm2``, the attention (``attention.attention.query``...), the MLP (``mlp.fc1``/``fc2``,
or the SwiGLU ``mlp.weights_in`` = ``[gate; up]`` and ``mlp.weights_out``) and the layer scales
``layer_scale1/2.lambda1`` (kept per member). The with-registers variant adds ``register_tokens``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Dinov2Config, Dinov2WithRegistersConfig

from ..modeling.configuration_hydra_dinov2 import HydraEnsembleDinov2Config
from ..modeling.modeling_hydra_dinov2 import HydraEnsembleDinov2ForImageClassification
from .build import label_arguments, load_fused, read_members
from .io import read_config
from .members import Layout, Member, Tower, fuse_members, read_member, unfuse_members
from .reader import Reader

PREFIXES = {"dinov2": "dinov2.", "dinov2_with_registers": "dinov2_with_registers."}


def dinov2_layout(config: dict[str, Any], has_classifier: bool = True, prefix: str = "dinov2.") -> Layout:
    """The layout of a DINOv2 checkpoint; ``prefix`` is ``"dinov2."`` / ``"dinov2_with_registers."`` for
    task models, ``""`` for the bare models."""
    d = int(config["hidden_size"])
    registers = config.get("model_type") == "dinov2_with_registers"
    embeddings = ["cls_token", "mask_token", "position_embeddings", "patch_embeddings.projection.weight",
                  "patch_embeddings.projection.bias"] + (["register_tokens"] if registers else [])
    per_member = {
        "hydra.layernorm.weight": f"{prefix}layernorm.weight",
        "hydra.layernorm.bias": f"{prefix}layernorm.bias",
    }
    if has_classifier:
        per_member.update({"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"})
    swiglu = bool(config.get("use_swiglu_ffn"))
    paths = {"q": "attention.attention.query", "k": "attention.attention.key", "v": "attention.attention.value",
             "o": "attention.output.dense", "norm1": "norm1", "norm2": "norm2",
             "fc1": "mlp.weights_in" if swiglu else "mlp.fc1", "fc2": "mlp.weights_out" if swiglu else "mlp.fc2"}
    keys = {}
    for short, path in paths.items():
        keys[f"{short}.weight"] = f"{path}.weight"
        if not (short in ("q", "k", "v") and config.get("qkv_bias") is False):
            keys[f"{short}.bias"] = f"{path}.bias"
    keys.update({"member.lambda_1": "layer_scale1.lambda1", "member.lambda_2": "layer_scale2.lambda1"})
    inner = None if swiglu else int(d * float(config.get("mlp_ratio", 4)))
    return Layout(
        family="DINOv2",
        shared={f"hydra.embeddings.{k}": f"{prefix}embeddings.{k}" for k in embeddings},
        per_member=per_member,
        towers=(Tower("hydra.layers", f"{prefix}encoder.layer", int(config["num_hidden_layers"]),
                      int(config["num_attention_heads"]), d, keys, inner),),
        optional=frozenset({"hydra.embeddings.mask_token"}),  # only used for masked pre-training
    )


def dinov2_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> Member:
    """Map a saved DINOv2 (or DINOv2-with-registers) state dict to canonical form (checks key counts and shapes)."""
    own = PREFIXES.get(config.get("model_type", "dinov2"), "dinov2.")
    prefix = own if any(k.startswith(own) for k in state) else ""
    return read_member(state, dinov2_layout(config, "classifier.weight" in state, prefix), config, source)


def fuse_dinov2(
    members: list[Member], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """State dict of ``HydraEnsembleDinov2ForImageClassification`` (``kept_heads[m][l]``)."""
    return fuse_members(members, {"hydra.layers": kept_heads}, mlp_fusion, shared)


def unfuse_dinov2(state: dict[str, torch.Tensor], hydra_config) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_dinov2``: one stock DINOv2 state dict (saved-file names) per member; removed heads zero."""
    config = {**hydra_config.base_config, "model_type": hydra_config.base_model_type}
    prefix = PREFIXES[hydra_config.base_model_type]
    layout = dinov2_layout(config, prefix=prefix)
    return unfuse_members(state, layout, {"hydra.layers": hydra_config.kept_heads}, hydra_config.num_members)


READER = Reader(dinov2_member_from_state_dict, fuse_dinov2, unfuse_dinov2)


# config keys that must agree between member checkpoints
DINOV2_SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "mlp_ratio",
    "image_size",
    "patch_size",
    "use_swiglu_ffn",
    "num_register_tokens",
)


def build_dinov2(
    folders: list[Path],
    masks: Any,
    *,
    mlp_fusion: str = "average",
    shared: str = "error",
    num_labels: int | None = None,
    id2label: dict[int, str] | None = None,
    seed: int = 0,
) -> Any:
    """DINOv2 (or DINOv2-with-registers) checkpoint folders + masks ->
    ``HydraEnsembleDinov2ForImageClassification`` (a bare encoder gets new per-member classifiers)."""
    model_type = read_config(folders[0]).get("model_type", "dinov2")
    config_cls = Dinov2WithRegistersConfig if model_type == "dinov2_with_registers" else Dinov2Config
    shape = lambda c: {k: c.get(k) for k in ("model_type", *DINOV2_SHAPE_KEYS)}  # noqa: E731
    raws, loaded = read_members(folders, config_cls, dinov2_member_from_state_dict, shape)
    base = loaded[0].config
    masks.check_compatible(base["num_hidden_layers"], base["num_attention_heads"], model=repr(str(folders[0])))
    state = fuse_dinov2(
        loaded * masks.num_members if len(loaded) == 1 else loaded, masks.kept_heads, mlp_fusion, shared
    )
    labels = label_arguments(state, "classifier.weight", raws[0], num_labels, id2label)
    config = HydraEnsembleDinov2Config(
        base_model_type=model_type, base_config=base, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion,
        member_metadata=masks.member_metadata, **labels,
    )
    torch.manual_seed(seed)
    model = HydraEnsembleDinov2ForImageClassification(config)
    allowed = {"classifier.weight", "classifier.bias", "hydra.embeddings.mask_token"}  # the mask token: unused here
    return load_fused(model, state, allowed, folders[0], seed)
