"""Hugging Face ViT checkpoints (``ViTForImageClassification``, ``ViTModel``) <-> canonical members.

Weights are read from saved files, whose names are the ones transformers has always written
(``vit.encoder.layer.{i}.attention.attention.query``...); transformers 5 renames the modules in memory
(``vit.layers.{i}.attention.q_proj``...) and maps the names on load and save. Both layouts are read
here, so a live ``model.state_dict()`` works too. The timm reader (``timm_vit.py``) produces the same
``ViTMember``, so one fused model class serves both sources.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import ViTConfig

from ..masks import HeadMasks
from ..modeling.configuration_hydra_vit import HydraEnsembleViTConfig
from ..modeling.modeling_hydra_vit import HydraEnsembleForImageClassification
from .build import check_same_architecture, full_config, label_arguments, load_fused
from .fuse import describe_keys, fuse_layer, shared_tensor, unfuse_member_layers
from .io import read_config, read_state_dict, strip_prefix
from .reader import Reader

# canonical name -> module path inside layer i, in the saved-file layout and in transformers 5's modules
FILE_LAYER_MAP = {
    "q": "attention.attention.query",
    "k": "attention.attention.key",
    "v": "attention.attention.value",
    "o": "attention.output.dense",
    "norm1": "layernorm_before",
    "fc1": "intermediate.dense",
    "fc2": "output.dense",
    "norm2": "layernorm_after",
}
MODULE_LAYER_MAP = {
    "q": "attention.q_proj",
    "k": "attention.k_proj",
    "v": "attention.v_proj",
    "o": "attention.o_proj",
    "norm1": "layernorm_before",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
    "norm2": "layernorm_after",
}
LAYOUTS = {"checkpoint": ("encoder.layer", FILE_LAYER_MAP), "module": ("layers", MODULE_LAYER_MAP)}
EMBEDDING_KEYS = (
    "cls_token",
    "position_embeddings",
    "patch_embeddings.projection.weight",
    "patch_embeddings.projection.bias",
)
IGNORED_KEYS = ("pooler.dense.weight", "pooler.dense.bias", "embeddings.mask_token")  # not used for classification


@dataclass
class ViTMember:
    """One ViT image classifier in canonical form (HF ``ViTEmbeddings`` names for the embeddings)."""

    config: dict[str, Any]  # a ViTConfig dict
    embeddings: dict[str, torch.Tensor]  # EMBEDDING_KEYS
    layers: list[dict[str, torch.Tensor]]  # canonical layer dicts (see fuse.py)
    final_norm: dict[str, torch.Tensor]  # {"weight", "bias"}
    classifier: dict[str, torch.Tensor] | None  # {"weight", "bias"} or None (a bare ViTModel)


def check_layer_shapes(layers: list[dict[str, torch.Tensor]], d: int, inner: int | None, source: str) -> None:
    """``ValueError`` unless the canonical layers have the shapes ``hidden_size=d`` implies."""
    expected = {"q.weight": (d, d), "k.weight": (d, d), "v.weight": (d, d), "o.weight": (d, d), "norm1.weight": (d,),
                "norm2.weight": (d,)}
    if inner is not None:
        expected.update({"fc1.weight": (inner, d), "fc2.weight": (d, inner)})
    wrong = [
        f"layer {i} {k} {tuple(layer[k].shape)} (expected {shape})"
        for i, layer in enumerate(layers)
        for k, shape in expected.items()
        if k in layer and tuple(layer[k].shape) != shape
    ]
    if wrong:
        raise ValueError(f"{source}: tensors do not have the shapes its config implies: {wrong[:3]}")


def vit_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> ViTMember:
    """Map an HF ViT state dict (``ViTForImageClassification`` or ``ViTModel``; saved-file or in-memory
    names) to canonical form. Checks key counts and shapes; unknown tensors raise ``ValueError``."""
    classifier = None
    if "classifier.weight" in state:
        classifier = {"weight": state["classifier.weight"], "bias": state.get("classifier.bias")}
        if classifier["bias"] is None:
            classifier["bias"] = torch.zeros(
                state["classifier.weight"].shape[0], dtype=state["classifier.weight"].dtype
            )
    body = strip_prefix({k: v for k, v in state.items() if not k.startswith("classifier.")}, ("vit.",))
    d, L = int(config["hidden_size"]), int(config["num_hidden_layers"])
    if any(k.startswith("encoder.layer.") for k in body):
        prefix, layer_map = LAYOUTS["checkpoint"]
    elif any(k.startswith("layers.") for k in body):
        prefix, layer_map = LAYOUTS["module"]
    else:
        raise ValueError(
            f"{source} is not an HF ViT checkpoint: no 'vit.encoder.layer.*' tensors "
            f"(found e.g. {describe_keys(sorted(state))}); "
            "pass a ViTForImageClassification/ViTModel folder, or --arch timm-vit for a timm checkpoint"
        )
    used: set[str] = set()
    missing = []

    def take(key: str, required: bool = True) -> torch.Tensor | None:
        if key in body:
            used.add(key)
            return body[key]
        if required:
            missing.append(key)
        return None

    embeddings = {k: take(f"embeddings.{k}") for k in EMBEDDING_KEYS}
    layers = []
    for i in range(L):
        layer = {}
        for short, long in layer_map.items():
            w = take(f"{prefix}.{i}.{long}.weight")
            b = take(
                f"{prefix}.{i}.{long}.bias",
                required=not (short in ("q", "k", "v") and config.get("qkv_bias") is False),
            )
            if w is not None:
                layer[f"{short}.weight"] = w
            if b is not None:
                layer[f"{short}.bias"] = b
        layers.append(layer)
    final_norm = {"weight": take("layernorm.weight"), "bias": take("layernorm.bias")}
    if missing:
        raise ValueError(f"{source} is not a complete ViT checkpoint: missing {describe_keys(missing)}")
    unknown = sorted(k for k in body if k not in used and k not in IGNORED_KEYS)
    if unknown:
        raise ValueError(
            f"{source} has tensors this ViT layout does not know: {describe_keys(unknown)} (more layers than "
            f"num_hidden_layers={L}, or a different architecture); pass a stock ViT checkpoint"
        )
    check_layer_shapes(layers, d, config.get("intermediate_size"), source)
    if tuple(embeddings["cls_token"].shape) != (1, 1, d):
        raise ValueError(
            f"{source}: embeddings.cls_token has shape {tuple(embeddings['cls_token'].shape)}, expected (1, 1, {d})"
        )
    return ViTMember(config=config, embeddings=embeddings, layers=layers, final_norm=final_norm, classifier=classifier)


def fuse_vit(
    members: list[ViTMember], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """Fused state dict of ``HydraEnsembleViTModel`` (keys without the ``hydra.`` prefix) plus, when every
    member has one, ``classifier.{weight,bias}`` of shape ``(M, C, d)`` / ``(M, C)``.

    ``kept_heads[m][l]``: heads member m keeps in layer l. With one checkpoint for all members pass the
    same ``ViTMember`` M times.
    """
    config = members[0].config
    dk = config["hidden_size"] // config["num_attention_heads"]
    out: dict[str, torch.Tensor] = {}
    for k in EMBEDDING_KEYS:
        out[f"embeddings.{k}"] = shared_tensor(f"embeddings.{k}", [m.embeddings[k] for m in members], shared)
    for i in range(config["num_hidden_layers"]):
        fused = fuse_layer([m.layers[i] for m in members], [kh[i] for kh in kept_heads], dk, mlp_fusion)
        out.update({f"layers.{i}.{k}": v for k, v in fused.items()})
    out["layernorm.weight"] = torch.stack([m.final_norm["weight"] for m in members])
    out["layernorm.bias"] = torch.stack([m.final_norm["bias"] for m in members])
    if all(m.classifier is not None for m in members):
        out["classifier.weight"] = torch.stack([m.classifier["weight"] for m in members])
        out["classifier.bias"] = torch.stack([m.classifier["bias"] for m in members])
    return out


def unfuse_vit(
    state: dict[str, torch.Tensor], hydra_config, names: str = "checkpoint"
) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_vit``: one stock ``ViTForImageClassification`` state dict per member.

    Args:
        state: a ``HydraEnsembleForImageClassification`` state dict.
        hydra_config: its ``HydraEnsembleViTConfig``.
        names: ``"checkpoint"`` for the saved-file names (write them with safetensors beside the base's
            ``config.json`` and load with ``from_pretrained``, in transformers 4 and 5), or ``"module"`` for
            the installed transformers 5 module names (``ViTForImageClassification.load_state_dict``).

    Removed heads are zero in Q/K/V and W_O; under ``mlp_fusion="average"`` every member gets the
    averaged MLP. A stock ViT loading member m's dict reproduces the fused model's ``member_logits[:, m]``.
    """
    if names not in LAYOUTS:
        raise ValueError(f"names={names!r} is unknown; use one of {list(LAYOUTS)}")
    prefix, layer_map = LAYOUTS[names]
    state = strip_prefix(state, ("hydra.",))
    base = hydra_config.base_config
    H, dk = base["num_attention_heads"], base["hidden_size"] // base["num_attention_heads"]
    members = []
    for m in range(hydra_config.num_members):
        sd = {f"vit.embeddings.{k}": state[f"embeddings.{k}"].clone() for k in EMBEDDING_KEYS}
        for i, canon in enumerate(unfuse_member_layers(state, "layers.", hydra_config.kept_heads, H, dk, m)):
            for short, long in layer_map.items():
                for p in ("weight", "bias"):
                    if p == "bias" and short in ("q", "k", "v") and base.get("qkv_bias") is False:
                        continue  # the stock model has no Q/K/V biases (the fused ones are zero)
                    sd[f"vit.{prefix}.{i}.{long}.{p}"] = canon[f"{short}.{p}"]
        sd["vit.layernorm.weight"] = state["layernorm.weight"][m].clone()
        sd["vit.layernorm.bias"] = state["layernorm.bias"][m].clone()
        if "classifier.weight" in state:
            sd["classifier.weight"] = state["classifier.weight"][m].clone()
            sd["classifier.bias"] = state["classifier.bias"][m].clone()
        members.append(sd)
    return members


READER = Reader(vit_member_from_state_dict, fuse_vit, unfuse_vit)

# config keys that must agree between the member checkpoints of a ViT
VIT_SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "image_size",
    "patch_size",
)


def vit_classifier(
    folders: list[Path], loaded: list[ViTMember], base_cfg: dict[str, Any], raw: dict[str, Any], masks: HeadMasks, *,
    mlp_fusion: str, shared: str, num_labels: int | None, id2label: dict[int, str] | None, seed: int,
    names: Any = None,
) -> HydraEnsembleForImageClassification:
    """Canonical ViT members (HF or timm) + masks -> ``HydraEnsembleForImageClassification``, loaded and
    checked; ``raw`` / ``names``: where the labels come from (:func:`~.build.label_arguments`)."""
    masks.check_compatible(base_cfg["num_hidden_layers"], base_cfg["num_attention_heads"], model=repr(str(folders[0])))
    member_weights = loaded * masks.num_members if len(loaded) == 1 else loaded
    state = fuse_vit(member_weights, masks.kept_heads, mlp_fusion, shared)
    labels = label_arguments(state, "classifier.weight", raw, num_labels, id2label, names=names)
    config = HydraEnsembleViTConfig(
        base_config=base_cfg, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion,
        member_metadata=masks.member_metadata, **labels,
    )
    torch.manual_seed(seed)  # the per-member classifiers of a bare encoder are initialised from this seed
    model = HydraEnsembleForImageClassification(config)
    state = {k if k.startswith("classifier.") else f"hydra.{k}": v for k, v in state.items()}
    return load_fused(model, state, {"classifier.weight", "classifier.bias"}, folders[0], seed)


def build_vit(
    folders: list[Path], masks: HeadMasks, *, mlp_fusion: str = "average", shared: str = "error",
    num_labels: int | None = None, id2label: dict[int, str] | None = None, seed: int = 0,
) -> HydraEnsembleForImageClassification:
    """HF ViT checkpoint folders (one base, or one per member) + masks -> ``HydraEnsembleForImageClassification``."""
    raw = [read_config(f) for f in folders]
    configs = [full_config(ViTConfig, c) for c in raw]
    check_same_architecture(folders, configs, VIT_SHAPE_KEYS)
    loaded = [vit_member_from_state_dict(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, configs)]
    return vit_classifier(folders, loaded, configs[0], raw[0], masks, mlp_fusion=mlp_fusion, shared=shared,
                          num_labels=num_labels, id2label=id2label, seed=seed)
