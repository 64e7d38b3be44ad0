"""timm ``VisionTransformer`` checkpoints (``vit_*``: fused ``qkv``, pre-LN, CLS-token pooling).

A timm checkpoint folder, as ``timm.models.push_to_hf_hub`` / ``save_for_hf`` writes it, holds
``model.safetensors`` (or ``pytorch_model.bin``) and a ``config.json`` with ``architecture``
(``"vit_base_patch16_224"``), ``num_classes``, optionally ``model_args`` (``{"num_heads": 12, ...}``) and
``pretrained_cfg`` (``input_size``, ``mean``, ``std``, ``interpolation``). The checkpoint is mapped to
the equivalent HF ``ViTConfig`` and HF ``ViTEmbeddings`` names, so the fused model is the same class as
for HF ViT checkpoints:

    cls_token -> embeddings.cls_token          pos_embed -> embeddings.position_embeddings
    patch_embed.proj -> embeddings.patch_embeddings.projection
    blocks.{i}.attn.qkv rows [0:d) / [d:2d) / [2d:3d) -> q / k / v    blocks.{i}.attn.proj -> o
    blocks.{i}.norm1 / norm2 -> norm1 / norm2  blocks.{i}.mlp.fc1 / fc2 -> fc1 / fc2
    norm -> final LayerNorm                    head -> classifier

timm ViT variants with other computations (layer scale, QK-norm, register tokens, average pooling,
``fc_norm``, a pre-norm, no class token, position embeddings without the class token) are refused
with a ``ValueError`` naming the tensors or options: the fused ViT model does not compute them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import ViTConfig, ViTImageProcessor
from transformers.image_utils import PILImageResampling

from ..masks import HeadMasks
from ..modeling.modeling_hydra_vit import HydraEnsembleForImageClassification
from .build import check_same_architecture, full_config
from .fuse import describe_keys
from .hf_vit import ViTMember, check_layer_shapes, fuse_vit, unfuse_vit, vit_classifier
from .io import read_config, read_state_dict
from .reader import Reader

# timm's ViT sizes by name, for checkpoints whose config.json has no model_args (timm's defaults)
_HEADS_BY_SIZE = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "huge": 16, "giant": 16, "gigantic": 16}
_LAYER_KEYS = {
    "norm1": "norm1", "o": "attn.proj", "norm2": "norm2", "fc1": "mlp.fc1", "fc2": "mlp.fc2",
}
TIMM_LAYER_NORM_EPS = 1e-6  # timm's VisionTransformer: partial(nn.LayerNorm, eps=1e-6)
_UNSUPPORTED_ARGS = {
    "class_token": (True,), "global_pool": ("token",), "no_embed_class": (False,), "pre_norm": (False,),
    "fc_norm": (None, False), "reg_tokens": (0,), "init_values": (None,), "qk_norm": (False,),
    "dynamic_img_size": (False,), "act_layer": (None, "gelu"), "norm_layer": (None, "layernorm"),
    "block_fn": (None,), "mlp_layer": (None,), "embed_layer": (None,),
}


def is_timm_vit_config(config: dict[str, Any]) -> bool:
    """Whether a ``config.json`` is timm's, for a ``vit_*`` architecture."""
    arch = config.get("architecture")
    return "model_type" not in config and isinstance(arch, str) and arch.startswith("vit_")


def timm_num_heads(timm_config: dict[str, Any], source: str = "checkpoint") -> int:
    """Heads per layer: ``model_args.num_heads``, else timm's default for the architecture (timm, if
    installed, builds it on the meta device), else the ViT size in the name (tiny 3 ... large 16)."""
    args = timm_config.get("model_args") or {}
    if "num_heads" in args:
        return int(args["num_heads"])
    arch = timm_config.get("architecture", "")
    try:
        import timm  # heavy: imported only for timm models

        with torch.device("meta"):
            model = timm.create_model(arch, pretrained=False)
        return int(model.blocks[0].attn.num_heads)
    except Exception:  # timm missing or the name unknown to it: fall back to the size in the name
        pass
    match = re.match(r"vit_([a-z]+)_", arch)
    if match and match.group(1) in _HEADS_BY_SIZE:
        return _HEADS_BY_SIZE[match.group(1)]
    raise ValueError(
        f"{source}: cannot tell the number of attention heads of timm architecture {arch!r}; add "
        '"model_args": {"num_heads": H} to its config.json'
    )


def timm_vit_config(
    state: dict[str, torch.Tensor], timm_config: dict[str, Any], source: str = "checkpoint"
) -> dict[str, Any]:
    """The HF ``ViTConfig`` dict equivalent to a timm ViT checkpoint (shapes read from the tensors)."""
    args = dict(timm_config.get("model_args") or {})
    if "global_pool" in timm_config:
        args.setdefault("global_pool", timm_config["global_pool"])
    bad = {k: v for k, v in args.items() if k in _UNSUPPORTED_ARGS and v not in _UNSUPPORTED_ARGS[k]}
    if bad:
        raise ValueError(
            f"{source}: timm ViT options {bad} are not supported (the fused ViT is a stock pre-LN ViT with "
            "CLS-token pooling); use a standard vit_* checkpoint"
        )
    for key in ("cls_token", "pos_embed", "patch_embed.proj.weight", "norm.weight", "blocks.0.attn.qkv.weight"):
        if key not in state:
            raise ValueError(
                f"{source} is not a timm VisionTransformer checkpoint with a class token: missing {key!r} "
                f"(found e.g. {describe_keys(sorted(state))})"
            )
    d = state["cls_token"].shape[-1]
    proj = state["patch_embed.proj.weight"]  # (d, C, p, p)
    patch = proj.shape[-1]
    num_layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    positions = state["pos_embed"].shape[1]  # patches + 1 (class token)
    grid = int(round((positions - 1) ** 0.5))
    if grid * grid != positions - 1:
        raise ValueError(
            f"{source}: pos_embed has {positions} positions, not a square grid plus the class token; "
            "timm ViTs without the class token in pos_embed (no_embed_class) or with register tokens are not supported"
        )
    input_size = (timm_config.get("pretrained_cfg") or {}).get("input_size")
    if input_size and tuple(input_size[1:]) != (grid * patch, grid * patch):
        raise ValueError(
            f"{source}: pretrained_cfg.input_size {tuple(input_size)} disagrees with pos_embed ({grid}x{grid} patches "
            f"of {patch}px = {grid * patch}px)"
        )
    num_heads = timm_num_heads(timm_config, source)
    if d % num_heads:
        raise ValueError(f"{source}: embed dim {d} is not a multiple of num_heads={num_heads}")
    return {
        "model_type": "vit",
        "hidden_size": d,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "intermediate_size": state["blocks.0.mlp.fc1.weight"].shape[0],
        "hidden_act": "gelu",  # timm's nn.GELU (exact)
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "layer_norm_eps": TIMM_LAYER_NORM_EPS,
        "image_size": grid * patch,
        "patch_size": patch,
        "num_channels": proj.shape[1],
        "qkv_bias": "blocks.0.attn.qkv.bias" in state,
        "encoder_stride": patch,
    }


def timm_vit_member_from_state_dict(
    state: dict[str, torch.Tensor], timm_config: dict[str, Any], source: str = "checkpoint"
) -> ViTMember:
    """Map a timm ``VisionTransformer`` state dict to the canonical ``ViTMember`` (HF ViT names).

    Splits the fused ``qkv`` rows into Q, K and V; checks key counts and shapes; any tensor the stock
    pre-LN ViT does not have (layer scale, QK-norm, ``fc_norm``, register tokens, ...) raises ``ValueError``.
    """
    config = timm_vit_config(state, timm_config, source)
    d, L = config["hidden_size"], config["num_hidden_layers"]
    used = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight", "norm.bias"}
    missing = [k for k in sorted(used) if k not in state]
    layers = []
    for i in range(L):
        pre = f"blocks.{i}."
        layer: dict[str, torch.Tensor] = {}
        qkv_w = state.get(pre + "attn.qkv.weight")
        if qkv_w is None or tuple(qkv_w.shape) != (3 * d, d):
            raise ValueError(
                f"{source}: {pre}attn.qkv.weight has shape {None if qkv_w is None else tuple(qkv_w.shape)}, "
                f"expected ({3 * d}, {d}) (fused Q, K, V rows)"
            )
        used.add(pre + "attn.qkv.weight")
        qkv_b = state.get(pre + "attn.qkv.bias")
        for j, name in enumerate(("q", "k", "v")):  # timm packs the rows as [Q; K; V]
            layer[f"{name}.weight"] = qkv_w[j * d : (j + 1) * d]
            if qkv_b is not None:
                layer[f"{name}.bias"] = qkv_b[j * d : (j + 1) * d]
        if qkv_b is not None:
            used.add(pre + "attn.qkv.bias")
        for short, long in _LAYER_KEYS.items():
            for p in ("weight", "bias"):
                key = f"{pre}{long}.{p}"
                if key in state:
                    layer[f"{short}.{p}"] = state[key]
                    used.add(key)
                else:
                    missing.append(key)
        layers.append(layer)
    if missing:
        raise ValueError(f"{source} is not a complete timm ViT checkpoint: missing {describe_keys(missing)}")
    classifier = None
    if "head.weight" in state:
        classifier = {"weight": state["head.weight"], "bias": state.get("head.bias")}
        if classifier["bias"] is None:
            classifier["bias"] = torch.zeros(state["head.weight"].shape[0], dtype=state["head.weight"].dtype)
        used |= {"head.weight", "head.bias"}
    unknown = sorted(k for k in state if k not in used)
    if unknown:
        raise ValueError(
            f"{source}: unknown timm ViT layout: tensors {describe_keys(unknown)} are not part of a stock pre-LN ViT "
            "(layer scale, QK-norm, fc_norm, register tokens, ...); these variants are not supported"
        )
    check_layer_shapes(layers, d, config["intermediate_size"], source)
    embeddings = {
        "cls_token": state["cls_token"],
        "position_embeddings": state["pos_embed"],
        "patch_embeddings.projection.weight": state["patch_embed.proj.weight"],
        "patch_embeddings.projection.bias": state.get(
            "patch_embed.proj.bias", torch.zeros(d, dtype=state["cls_token"].dtype)
        ),
    }
    final_norm = {"weight": state["norm.weight"], "bias": state["norm.bias"]}
    return ViTMember(config=config, embeddings=embeddings, layers=layers, final_norm=final_norm, classifier=classifier)


# timm checkpoints read into ViT's canonical member: fused and split back as a ViT
READER = Reader(timm_vit_member_from_state_dict, fuse_vit, unfuse_vit)


def timm_image_processor(timm_config: dict[str, Any], vit_config: dict[str, Any]):
    """An HF ``ViTImageProcessor`` with timm's ``pretrained_cfg`` preprocessing (size, mean, std,
    interpolation). timm's ``crop_pct`` center crop has no ViTImageProcessor equivalent: images are
    resized straight to the input size."""
    cfg = timm_config.get("pretrained_cfg") or {}
    size = vit_config["image_size"]
    resample = {
        "bilinear": PILImageResampling.BILINEAR,
        "bicubic": PILImageResampling.BICUBIC,
        "nearest": PILImageResampling.NEAREST,
    }.get(cfg.get("interpolation", "bicubic"), PILImageResampling.BICUBIC)
    return ViTImageProcessor(
        do_resize=True,
        size={"height": size, "width": size},
        resample=resample,
        image_mean=list(cfg.get("mean", (0.5, 0.5, 0.5))),
        image_std=list(cfg.get("std", (0.5, 0.5, 0.5))),
    )


def build_timm_vit(
    folders: list[Path], masks: HeadMasks, *, mlp_fusion: str = "average", shared: str = "error",
    num_labels: int | None = None, id2label: dict[int, str] | None = None, seed: int = 0,
) -> tuple[HydraEnsembleForImageClassification, Callable[[Path], None]]:
    """timm ViT folders (one base, or one per member) + masks -> ``HydraEnsembleForImageClassification``
    and a writer of the matching ``ViTImageProcessor`` (timm's preprocessing) into an output folder."""
    raw = [read_config(f) for f in folders]
    loaded = [
        timm_vit_member_from_state_dict(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, raw)
    ]
    check_same_architecture(folders, [m.config for m in loaded])
    base_cfg = full_config(ViTConfig, loaded[0].config)
    names = raw[0].get("label_names") or (raw[0].get("pretrained_cfg") or {}).get("label_names")
    processor = timm_image_processor(raw[0], base_cfg)
    model = vit_classifier(folders, loaded, base_cfg, {}, masks, mlp_fusion=mlp_fusion, shared=shared,
                           num_labels=num_labels, id2label=id2label, seed=seed, names=names)
    return model, lambda folder: processor.save_pretrained(str(folder))
