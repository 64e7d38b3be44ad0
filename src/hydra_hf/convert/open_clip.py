"""open_clip ``CLIP`` checkpoints (ViT towers with ``nn.MultiheadAttention``) -> canonical CLIP members.

A checkpoint folder, as open_clip's ``push_to_hf_hub`` writes it, holds ``open_clip_config.json``
(``{"model_cfg": {...}, "preprocess_cfg": {...}}``; ``model_cfg`` is ``open_clip.get_model_config(name)``)
and ``open_clip_model.safetensors`` (or ``open_clip_pytorch_model.bin``) with the state dict of
``open_clip.create_model(...)``. It maps to the equivalent HF ``CLIPConfig`` and HF CLIP names, so the
fused model is the same class as for HF CLIP checkpoints:

    visual.conv1 / class_embedding / positional_embedding -> vision embeddings;  visual.ln_pre -> pre_layrnorm
    *.resblocks.{i}.attn.in_proj_weight rows [0:d) / [d:2d) / [2d:3d) -> q / k / v (packed, as in
        nn.MultiheadAttention);  attn.out_proj -> o;  ln_1 / ln_2 -> norm1 / norm2;  mlp.c_fc / c_proj -> fc1 / fc2
    visual.ln_post -> post_layernorm;  visual.proj (d, P) -> visual_projection.weight (P, d)
    token_embedding / positional_embedding -> text embeddings;  ln_final -> final_layer_norm
    text_projection (d, P) -> text_projection.weight (P, d);  logit_scale -> logit_scale

Text pooling: open_clip's default ``pool_type="argmax"`` (the end-of-text token has the largest id) is
transformers' legacy CLIP pooling, selected by ``eos_token_id=2`` in the text config; ``"eos"`` maps
to ``eos_token_id=eos_id``. Variants with other computations (custom text/timm towers, attentional
pooling, layer scale, QK-norm, ``final_ln_after_pool``, no causal mask, SigLIP's ``logit_bias``, ...)
are refused with a ``ValueError`` naming them.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import CLIPConfig, CLIPImageProcessor, CLIPProcessor, CLIPTokenizer
from transformers.image_utils import PILImageResampling

from ..masks import HeadMasks
from ..modeling.modeling_hydra_clip import HydraEnsembleCLIPModel
from .build import base_config_dict, check_same_architecture
from .fuse import describe_keys
from .hf_clip import MEMBER_KEYS, SHARED_KEYS, TOWERS, CLIPMember, clip_model, fuse_clip, tower_shape, unfuse_clip
from .hf_vit import check_layer_shapes
from .io import checkpoint_dir, read_state_dict
from .reader import Reader

logger = logging.getLogger(__name__)

CONFIG_NAME = "open_clip_config.json"
WEIGHT_NAMES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
OPEN_CLIP_LAYER_NORM_EPS = 1e-5  # open_clip's LayerNorm default
DEFAULT_HEAD_WIDTH = 64  # open_clip CLIPVisionCfg.head_width
DEFAULT_TEXT_HEADS = 8  # open_clip CLIPTextCfg.heads
_LAYER_KEYS = {"o": "attn.out_proj", "norm1": "ln_1", "norm2": "ln_2", "fc1": "mlp.c_fc", "fc2": "mlp.c_proj"}
# open_clip config options -> the values the fused (stock HF CLIP) computation supports
_VISION_SUPPORTED = {
    "timm_model_name": (None,), "attentional_pool": (False,), "no_ln_pre": (False,), "final_ln_after_pool": (False,),
    "pool_type": ("tok",), "pos_embed_type": ("learnable",), "ls_init_value": (None,), "qk_norm": (False,),
    "scaled_cosine_attn": (False,), "scale_heads": (False,), "scale_attn_inner": (False,), "scale_attn": (False,),
    "scale_fc": (False,), "act_kwargs": (None,), "norm_kwargs": (None,), "block_type": (None, "default"),
    "output_tokens": (False,), "patch_dropout": (0, 0.0),
}
_TEXT_SUPPORTED = {
    "hf_model_name": (None,), "embed_cls": (False,), "no_causal_mask": (False,), "final_ln_after_pool": (False,),
    "pool_type": ("argmax", "eos"), "proj_bias": (False,), "proj_type": ("linear",), "ls_init_value": (None,),
    "qk_norm": (False,), "scaled_cosine_attn": (False,), "scale_heads": (False,), "scale_attn_inner": (False,),
    "scale_attn": (False,), "scale_fc": (False,), "act_kwargs": (None,), "norm_kwargs": (None,),
    "block_type": (None, "default"), "output_tokens": (False,),
}


def is_open_clip_folder(folder: str | Path) -> bool:
    return (Path(folder) / CONFIG_NAME).is_file()


def read_open_clip_folder(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The state dict and ``open_clip_config.json`` of an open_clip checkpoint folder."""
    folder = checkpoint_dir(folder)
    config_file = folder / CONFIG_NAME
    if not config_file.is_file():
        raise ValueError(f"{str(folder)!r} has no {CONFIG_NAME}; it is not an open_clip checkpoint folder")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(config_file)!r} is not valid JSON ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_cfg"), dict):
        raise ValueError(
            f"{str(config_file)!r} has no 'model_cfg'; write {{\"model_cfg\": open_clip.get_model_config(name), "
            "\"preprocess_cfg\": {...}}"
        )
    for name in WEIGHT_NAMES + ("model.safetensors",):
        if (folder / name).is_file():
            return read_state_dict(folder / name), config
    raise ValueError(f"{str(folder)!r} holds no open_clip weights (looked for {', '.join(WEIGHT_NAMES)})")


def _check_options(cfg: dict[str, Any], supported: dict[str, tuple], tower: str, source: str) -> None:
    bad = {k: v for k, v in cfg.items() if k in supported and v not in supported[k]}
    if bad:
        raise ValueError(
            f"{source}: open_clip {tower} options {bad} are not supported (the fused model computes a stock CLIP "
            "ViT tower); use a standard ViT-B/32-style open_clip model"
        )


def _num_blocks(state: dict[str, torch.Tensor], prefix: str) -> int:
    ids = {int(k[len(prefix):].split(".")[0]) for k in state if k.startswith(prefix)}
    return max(ids) + 1 if ids else 0


def open_clip_clip_config(
    state: dict[str, torch.Tensor], model_cfg: dict[str, Any], source: str = "checkpoint"
) -> dict[str, Any]:
    """The HF ``CLIPConfig`` dict equivalent to an open_clip CLIP (shapes read from the tensors)."""
    if "custom_text" in model_cfg and model_cfg["custom_text"]:
        raise ValueError(f"{source}: open_clip models with a custom text tower (custom_text) are not supported")
    vcfg, tcfg = dict(model_cfg.get("vision_cfg") or {}), dict(model_cfg.get("text_cfg") or {})
    _check_options(vcfg, _VISION_SUPPORTED, "vision_cfg", source)
    _check_options(tcfg, _TEXT_SUPPORTED, "text_cfg", source)
    for key in ("visual.conv1.weight", "visual.positional_embedding", "visual.proj", "token_embedding.weight",
                "positional_embedding", "text_projection", "logit_scale"):
        if key not in state:
            raise ValueError(
                f"{source} is not an open_clip CLIP checkpoint with ViT towers: missing {key!r} "
                f"(found e.g. {describe_keys(sorted(state))})"
            )
    act = "quick_gelu" if model_cfg.get("quick_gelu") else "gelu"
    conv = state["visual.conv1.weight"]  # (d, C, p, p)
    d_v, patch = conv.shape[0], conv.shape[-1]
    image_size = vcfg.get("image_size", 224)
    if isinstance(image_size, (list, tuple)):
        if len(set(image_size)) != 1:
            raise ValueError(f"{source}: non-square image_size {image_size} is not supported")
        image_size = image_size[0]
    positions = state["visual.positional_embedding"].shape[0]
    if positions != (image_size // patch) ** 2 + 1:
        raise ValueError(
            f"{source}: visual.positional_embedding has {positions} rows but image_size={image_size}, patch={patch} "
            f"imply {(image_size // patch) ** 2 + 1}; fix vision_cfg.image_size in {CONFIG_NAME}"
        )
    head_width = int(vcfg.get("head_width", DEFAULT_HEAD_WIDTH))
    if d_v % head_width:
        raise ValueError(f"{source}: vision width {d_v} is not a multiple of head_width={head_width}")
    vocab, d_t = state["token_embedding.weight"].shape
    pool = tcfg.get("pool_type", "argmax")
    if pool == "argmax":
        eos = 2  # transformers' legacy CLIP pooling: argmax of input_ids, exactly open_clip's "argmax"
    else:
        eos = int(tcfg.get("eos_id", 2))
        if eos == 2:
            raise ValueError(f"{source}: text pool_type='eos' with eos_id=2 cannot be expressed in a CLIP config")
    text_heads = int(tcfg.get("heads", DEFAULT_TEXT_HEADS))
    if d_t % text_heads:
        raise ValueError(f"{source}: text width {d_t} is not a multiple of heads={text_heads}")
    vision_config = {
        "hidden_size": d_v,
        "intermediate_size": state["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
        "num_hidden_layers": _num_blocks(state, "visual.transformer.resblocks."),
        "num_attention_heads": d_v // head_width,
        "num_channels": conv.shape[1],
        "image_size": image_size,
        "patch_size": patch,
        "hidden_act": act,
        "layer_norm_eps": OPEN_CLIP_LAYER_NORM_EPS,
        "attention_dropout": 0.0,
        "projection_dim": state["visual.proj"].shape[1],
    }
    text_config = {
        "vocab_size": vocab,
        "hidden_size": d_t,
        "intermediate_size": state["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
        "num_hidden_layers": _num_blocks(state, "transformer.resblocks."),
        "num_attention_heads": text_heads,
        "max_position_embeddings": state["positional_embedding"].shape[0],
        "hidden_act": act,
        "layer_norm_eps": OPEN_CLIP_LAYER_NORM_EPS,
        "attention_dropout": 0.0,
        "projection_dim": state["text_projection"].shape[1],
        "eos_token_id": eos,
        "bos_token_id": vocab - 2,
        "pad_token_id": int(tcfg.get("pad_id", 0)),
    }

    config = CLIPConfig(
        text_config=text_config, vision_config=vision_config, projection_dim=state["visual.proj"].shape[1],
        logit_scale_init_value=float(state["logit_scale"]),
    )
    return config.to_dict()


def _split_packed(layer: dict[str, torch.Tensor], weight: torch.Tensor, bias: torch.Tensor | None, d: int) -> None:
    """``nn.MultiheadAttention``'s packed ``in_proj`` rows are ``[Q; K; V]``."""
    for j, name in enumerate(("q", "k", "v")):
        layer[f"{name}.weight"] = weight[j * d : (j + 1) * d]
        if bias is not None:
            layer[f"{name}.bias"] = bias[j * d : (j + 1) * d]


def open_clip_member_from_state_dict(
    state: dict[str, torch.Tensor], model_cfg: dict[str, Any], source: str = "checkpoint"
) -> CLIPMember:
    """Map the state dict of an open_clip ``CLIP`` (``open_clip.create_model(...).state_dict()``) to
    the canonical ``CLIPMember`` with HF CLIP names. Checks key counts and shapes; tensors a stock CLIP
    does not have raise ``ValueError``."""
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}  # DDP checkpoints
    config = open_clip_clip_config(state, model_cfg, source)
    used = {"attn_mask"}  # a buffer some versions saved: the causal mask, rebuilt by the fused model
    missing: list[str] = []

    def take(key: str) -> torch.Tensor | None:
        if key in state:
            used.add(key)
            return state[key]
        missing.append(key)
        return None

    shared_src = {
        "vision_model.embeddings.class_embedding": "visual.class_embedding",
        "vision_model.embeddings.patch_embedding.weight": "visual.conv1.weight",
        "vision_model.embeddings.position_embedding.weight": "visual.positional_embedding",
        "vision_model.pre_layrnorm.weight": "visual.ln_pre.weight",
        "vision_model.pre_layrnorm.bias": "visual.ln_pre.bias",
        "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
        "text_model.embeddings.position_embedding.weight": "positional_embedding",
        "logit_scale": "logit_scale",
    }
    assert set(shared_src) == set(SHARED_KEYS)
    shared = {hf: take(oc) for hf, oc in shared_src.items()}
    proj_v, proj_t = take("visual.proj"), take("text_projection")
    per_member = {
        "vision_model.post_layernorm.weight": take("visual.ln_post.weight"),
        "vision_model.post_layernorm.bias": take("visual.ln_post.bias"),
        "text_model.final_layer_norm.weight": take("ln_final.weight"),
        "text_model.final_layer_norm.bias": take("ln_final.bias"),
        "visual_projection.weight": None if proj_v is None else proj_v.T.contiguous(),  # (P, d)
        "text_projection.weight": None if proj_t is None else proj_t.T.contiguous(),  # (P, d)
    }
    assert set(per_member) == set(MEMBER_KEYS)
    towers = {}
    for tower, prefix in (("vision", "visual.transformer.resblocks."), ("text", "transformer.resblocks.")):
        sub = config[f"{tower}_config"]
        d = sub["hidden_size"]
        layers = []
        for i in range(sub["num_hidden_layers"]):
            pre = f"{prefix}{i}."
            layer: dict[str, torch.Tensor] = {}
            w = take(pre + "attn.in_proj_weight")
            b = take(pre + "attn.in_proj_bias")
            if w is not None:
                if tuple(w.shape) != (3 * d, d):
                    raise ValueError(
                        f"{source}: {pre}attn.in_proj_weight has shape {tuple(w.shape)}, expected ({3 * d}, {d})"
                    )
                _split_packed(layer, w, b, d)
            for short, long in _LAYER_KEYS.items():
                for p in ("weight", "bias"):
                    t = take(f"{pre}{long}.{p}")
                    if t is not None:
                        layer[f"{short}.{p}"] = t
            layers.append(layer)
        towers[tower] = layers
    if missing:
        raise ValueError(f"{source} is not a complete open_clip CLIP checkpoint: missing {describe_keys(missing)}")
    unknown = sorted(k for k in state if k not in used)
    if unknown:
        raise ValueError(
            f"{source}: unknown open_clip layout: tensors {describe_keys(unknown)} are not part of a stock CLIP "
            "(layer scale, attentional pooler, logit_bias, a custom tower, ...); these variants are not supported"
        )
    for tower in ("vision", "text"):
        sub = config[f"{tower}_config"]
        check_layer_shapes(towers[tower], sub["hidden_size"], sub["intermediate_size"], f"{source} ({tower} tower)")
    return CLIPMember(config=config, shared=shared, towers=towers, per_member=per_member)


# open_clip checkpoints read into CLIP's canonical member: fused and split back as a CLIP
READER = Reader(open_clip_member_from_state_dict, fuse_clip, unfuse_clip)


def clip_tokenizer_from_open_clip(context_length: int = 77):
    """An HF ``CLIPTokenizer`` built offline from the BPE vocabulary that open_clip ships
    (``bpe_simple_vocab_16e6.txt.gz``): the same 49,408 tokens and merges as open_clip's
    ``SimpleTokenizer``. ``None`` (with a warning) when open_clip is not installed."""
    try:
        from open_clip.tokenizer import bytes_to_unicode, default_bpe  # heavy: imported only for open_clip models
    except ImportError:
        logger.warning("open_clip is not installed: no tokenizer is written (pip install open_clip_torch)")
        return None

    lines = gzip.open(default_bpe()).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]  # as open_clip's SimpleTokenizer
    byte_tokens = list(bytes_to_unicode().values())
    vocab = byte_tokens + [t + "</w>" for t in byte_tokens] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={t: i for i, t in enumerate(vocab)}, merges=merges, model_max_length=context_length)


def open_clip_processor(config: dict[str, Any], open_clip_config: dict[str, Any]):
    """A ``CLIPProcessor`` (image processor + tokenizer) matching open_clip's preprocessing, or just the
    ``CLIPImageProcessor`` when no tokenizer can be built (a vocabulary other than open_clip's default
    BPE, or open_clip not installed)."""
    pre = open_clip_config.get("preprocess_cfg") or {}
    size = config["vision_config"]["image_size"]
    resample = {
        "bilinear": PILImageResampling.BILINEAR,
        "bicubic": PILImageResampling.BICUBIC,
        "nearest": PILImageResampling.NEAREST,
    }.get(pre.get("interpolation", "bicubic"), PILImageResampling.BICUBIC)
    squash = pre.get("resize_mode") == "squash"
    image_processor = CLIPImageProcessor(
        size={"height": size, "width": size} if squash else {"shortest_edge": size},
        crop_size={"height": size, "width": size},
        do_center_crop=not squash,
        resample=resample,
        image_mean=list(pre.get("mean", (0.48145466, 0.4578275, 0.40821073))),
        image_std=list(pre.get("std", (0.26862954, 0.26130258, 0.27577711))),
    )
    text_cfg = open_clip_config["model_cfg"].get("text_cfg") or {}
    if config["text_config"]["vocab_size"] != 49408 or text_cfg.get("hf_tokenizer_name"):
        logger.warning(
            "the open_clip text tower does not use open_clip's default BPE vocabulary: no tokenizer is written"
        )
        return image_processor
    tokenizer = clip_tokenizer_from_open_clip(config["text_config"]["max_position_embeddings"])
    if tokenizer is None:
        return image_processor
    return CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)


def build_open_clip(
    folders: list[Path], masks: HeadMasks, *, mlp_fusion: str = "average", shared: str = "error"
) -> tuple[HydraEnsembleCLIPModel, Callable[[Path], None]]:
    """open_clip folders (one base, or one per member) + two-tower masks -> ``HydraEnsembleCLIPModel`` and a
    writer of the matching ``CLIPProcessor`` into an output folder."""
    read = [read_open_clip_folder(f) for f in folders]
    loaded = [
        open_clip_member_from_state_dict(s, c["model_cfg"], source=repr(str(f))) for f, (s, c) in zip(folders, read)
    ]
    check_same_architecture(folders, [{t: tower_shape(m.config, t) for t in TOWERS} for m in loaded])
    base_cfg = base_config_dict(loaded[0].config)
    processor = open_clip_processor(base_cfg, read[0][1])
    model = clip_model(folders, loaded, base_cfg, masks, mlp_fusion=mlp_fusion, shared=shared)
    return model, lambda folder: processor.save_pretrained(str(folder))
