"""Loading the models that ``hydra-hf prune`` prunes beyond HF folders, and zero-shot class prompts.

- :func:`load_open_clip`: an open_clip ``CLIP`` by model name (or local model config) plus local
  weights (nothing is downloaded), with its image preprocessing and tokenizer;
- :func:`load_timm_vit`: a timm ``VisionTransformer`` by architecture name plus local weights, with
  its evaluation transform;
- :func:`read_class_names` / :func:`class_prompts`: the class names of a zero-shot CLIP classifier
  and the prompts its text tower reads (``"a photo of a {}."``).

Weights are read with :func:`hydra_hf.convert.io.read_state_dict` (safetensors, or ``.bin`` / ``.pt``
with ``weights_only=True``) and loaded strictly: a missing or unexpected tensor is a ``ValueError``
naming it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..convert.io import read_state_dict
from ..convert.open_clip import CONFIG_NAME, WEIGHT_NAMES
from ..data import DEFAULT_PROMPT_TEMPLATE, zero_shot_prompts
from ..lazy import lazy_module

logger = logging.getLogger(__name__)

# heavy and optional (open_clip with timm: ~1.5 s; the zero-shot and timm paths only): imported on first use, so
# that `import hydra_hf` stays light (lazy.py)
open_clip = lazy_module("open_clip")
timm = lazy_module("timm")

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # open_clip's default image normalisation
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


# ------------------------------------------------------------------------------- class prompts
def class_prompts(class_names: list[str], template: str = DEFAULT_PROMPT_TEMPLATE) -> list[str]:
    """``template.format(name)`` for every class (the text the CLIP text tower reads)."""
    if template.count("{}") != 1:
        raise ValueError(
            f"the prompt template {template!r} must contain '{{}}' exactly once (e.g. {DEFAULT_PROMPT_TEMPLATE!r})"
        )
    return zero_shot_prompts(class_names, [template])  # its other braces checked there


# ------------------------------------------------------------------------------------- weights
def _weights(checkpoint: str | os.PathLike, what: str) -> dict[str, torch.Tensor]:
    path = Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(
            f"--checkpoint {str(path)!r} does not exist; give the local weights of the {what} model "
            "(a .safetensors / .bin / .pt file, or its checkpoint folder): nothing is downloaded"
        )
    if path.is_dir():
        for name in WEIGHT_NAMES:  # an open_clip Hub-style folder
            if (path / name).is_file():
                path = path / name
                break
    state = read_state_dict(path)
    return {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}  # DDP checkpoints


def _load_strict(model: nn.Module, state: dict[str, torch.Tensor], source: str, ignore: tuple[str, ...] = ()) -> None:
    """Load every tensor of ``model`` from ``state``; name what is missing or left over."""
    state = {k: v for k, v in state.items() if k not in ignore}
    own = model.state_dict()
    missing = sorted(k for k in own if k not in state)
    unexpected = sorted(k for k in state if k not in own)
    wrong = sorted(k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:4]}" + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else ""))
        if unexpected:
            parts.append(
                f"unexpected {unexpected[:4]}" + (f" (+{len(unexpected) - 4} more)" if len(unexpected) > 4 else "")
            )
        if wrong:
            parts.append(f"shape mismatch {[(k, tuple(state[k].shape), tuple(own[k].shape)) for k in wrong[:3]]}")
        raise ValueError(f"{source} does not fit the model: {'; '.join(parts)}; give the weights of this very model")
    model.load_state_dict(state, strict=True)


# ------------------------------------------------------------------------------------ open_clip
def _open_clip_config(model: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``(model_cfg, preprocess_cfg)`` of a local config (folder / JSON file), or ``(None, {})`` for a name."""
    path = Path(model)
    if path.is_dir():
        path = path / "open_clip_config.json"
        if not path.is_file():
            raise ValueError(
                f"--open-clip {model!r} is a folder without open_clip_config.json; give a model name or a config"
            )
    elif not (path.suffix == ".json" and path.is_file()):
        return None, {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(path)!r} is not valid JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("model_cfg"), dict):  # open_clip_config.json
        return dict(data["model_cfg"]), dict(data.get("preprocess_cfg") or {})
    if isinstance(data, dict) and {"embed_dim", "vision_cfg", "text_cfg"} <= set(data):  # model_configs/NAME.json
        return dict(data), {}
    raise ValueError(
        f"{str(path)!r} is neither an open_clip_config.json ({{\"model_cfg\": ...}}) nor an open_clip model config "
        "(embed_dim, vision_cfg, text_cfg)"
    )


def load_open_clip(
    model: str, checkpoint: str | os.PathLike
) -> tuple[nn.Module, Callable[[Any], torch.Tensor], Callable[[list[str]], torch.Tensor]]:
    """An open_clip ``CLIP`` with local weights, its image preprocessing and its tokenizer.

    Args:
        model: an open_clip model name (``open_clip.list_models()``, e.g. ``"ViT-B-32"``), or a local
            ``open_clip_config.json`` / a folder holding one / a model config JSON (``embed_dim``,
            ``vision_cfg``, ``text_cfg``).
        checkpoint: the weights (``.safetensors`` / ``.bin`` / ``.pt``, or an open_clip checkpoint folder).

    Returns:
        ``(model in eval mode, preprocess: PIL image -> (3, S, S), tokenize: list[str] -> (C, T))``.
    """

    if str(model).startswith(("hf-hub:", "local-dir:")):
        raise ValueError(
            f"--open-clip {model!r}: give a model name or a local config and the weights with --checkpoint"
        )
    model_cfg, preprocess_cfg = _open_clip_config(model)
    local = model_cfg is not None
    if model_cfg is None:
        if model not in open_clip.list_models():
            raise ValueError(
                f"--open-clip {model!r} is not an open_clip model name (e.g. ViT-B-32; see open_clip.list_models()) "
                "nor a local open_clip_config.json"
            )
        model_cfg = open_clip.get_model_config(model)
    text_cfg = dict(model_cfg.get("text_cfg") or {})
    if model_cfg.get("custom_text") or text_cfg.get("hf_model_name") or text_cfg.get("hf_tokenizer_name"):
        raise ValueError(
            f"--open-clip {model!r} has a custom or Hugging Face text tower; pruning supports open_clip CLIP models "
            "whose towers are open_clip transformers (e.g. ViT-B-32)"
        )
    state = _weights(checkpoint, "open_clip")
    if local:
        cfg = {k: v for k, v in model_cfg.items() if k != "custom_text"}
        net = open_clip.CLIP(**cfg)
        tokenizer = open_clip.SimpleTokenizer(context_length=int(text_cfg.get("context_length", 77)))
    else:
        net = open_clip.create_model(model, pretrained=None, pretrained_text=False, device="cpu")
        tokenizer = open_clip.get_tokenizer(model)
    vocab = int(text_cfg.get("vocab_size", 49408))
    if vocab < tokenizer.vocab_size:
        raise ValueError(
            f"--open-clip {model!r} has a text vocabulary of {vocab} tokens, smaller than open_clip's tokenizer "
            f"({tokenizer.vocab_size}); use a model trained with open_clip's tokenizer"
        )
    _load_strict(net, state, f"--checkpoint {str(checkpoint)!r}", ignore=("attn_mask",))
    net.eval()
    image_size = net.visual.image_size
    pre = {**open_clip.get_model_preprocess_cfg(net), **preprocess_cfg}
    preprocess = open_clip.image_transform(
        image_size,
        is_train=False,
        mean=tuple(pre.get("mean", OPENAI_MEAN)),
        std=tuple(pre.get("std", OPENAI_STD)),
        resize_mode=pre.get("resize_mode"),
        interpolation=pre.get("interpolation"),
    )
    return net, preprocess, lambda texts: tokenizer(texts)


# ------------------------------------------------------------------------------------------ timm
def load_timm_vit(
    name: str, checkpoint: str | os.PathLike
) -> tuple[nn.Module, Callable[[Any], torch.Tensor], list[str] | None]:
    """A timm ``VisionTransformer`` classifier with local weights, and its evaluation transform.

    Args:
        name: the timm architecture (``"vit_base_patch16_224"``).
        checkpoint: the weights file, or a timm checkpoint folder (``save_for_hf``: ``config.json`` +
            ``model.safetensors``) whose ``model_args`` (e.g. a non-default size) are used.

    Returns:
        ``(model in eval mode, transform: PIL image -> (3, S, S), label names or None)``.
    """

    state = _weights(checkpoint, "timm")
    model_args: dict[str, Any] = {}
    label_names, pretrained_cfg = None, None
    config_file = Path(checkpoint) / "config.json"
    if Path(checkpoint).is_dir() and config_file.is_file():
        config = json.loads(config_file.read_text())
        model_args = dict(config.get("model_args") or {})
        arch = config.get("architecture")
        if arch and arch != name:
            logger.warning("--timm %s but %s was saved from %s; building %s", name, config_file, arch, name)
        pretrained_cfg = config.get("pretrained_cfg") or None
        label_names = config.get("label_names") or (pretrained_cfg or {}).get("label_names")
    if "head.weight" in state:
        model_args["num_classes"] = state["head.weight"].shape[0]
    else:
        raise ValueError(
            f"--checkpoint {str(checkpoint)!r} has no classifier (head.weight); pruning needs a trained image "
            "classifier"
        )
    try:
        model = timm.create_model(name, pretrained=False, **model_args)
    except RuntimeError as exc:  # timm: "Unknown model (...)"
        raise ValueError(
            f"--timm {name!r}: {exc}; give a timm ViT architecture such as vit_base_patch16_224"
        ) from None
    if not isinstance(model, timm.models.vision_transformer.VisionTransformer):
        raise ValueError(
            f"--timm {name!r} builds a {type(model).__name__}; pruning supports timm VisionTransformer (vit_*) models"
        )
    _load_strict(model, state, f"--checkpoint {str(checkpoint)!r}")
    model.eval()
    data_config = timm.data.resolve_data_config({}, pretrained_cfg=pretrained_cfg, model=model)
    # the model's own image size (model_args may override the architecture's default, e.g. img_size=384)
    data_config["input_size"] = (3, *model.patch_embed.img_size)
    return model, timm.data.create_transform(**data_config), label_names


def load_open_clip_folder(folder: str | os.PathLike, device: str | torch.device = "cpu"):
    """``(model, preprocess, tokenizer)`` of an open_clip checkpoint folder (eval mode)."""
    folder = Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        raise ValueError(f"{str(folder)!r} is not an open_clip checkpoint folder (no {CONFIG_NAME}); "
                         "write one with hydra_hf.recipes.save_open_clip_folder")
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder.resolve()}", device=device)
    tokenizer = open_clip.get_tokenizer(f"local-dir:{folder.resolve()}")
    return model.eval(), preprocess, tokenizer
