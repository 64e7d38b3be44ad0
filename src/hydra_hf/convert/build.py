"""The build helpers every family uses: read and check the configs and weights of checkpoint folders,
work out the labels, build the Hydra model and load every tensor it has (checked: none missing but the
newly initialised classifiers, none left over, shapes named on mismatch).

One public set, below the family registry: the per-source builders (``hf_deit.build_deit``, ``hf_clip.build_clip``
...) and the family modules build with these; nothing here knows a family.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel

from .io import read_config, read_state_dict
from .members import Member, check_fused_shapes

logger = logging.getLogger(__name__)

# config.json keys of a base that describe the checkpoint, not the architecture
NOT_ARCHITECTURE = {
    "architectures", "id2label", "label2id", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
    "problem_type", "auto_map", "num_labels", "finetuning_task", "gradient_checkpointing", "use_cache",
    "gguf_source",  # the GGUF file a materialised checkpoint came from (hydra_hf.convert.gguf.CONFIG_KEY)
}
# config keys that must agree between the member checkpoints of a text encoder
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def base_config_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The architecture part of a base ``config.json`` (labels and bookkeeping dropped)."""
    return {k: v for k, v in config.items() if k not in NOT_ARCHITECTURE}


def full_config(cls: type[PretrainedConfig], raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a config.json) with the defaults of its transformers config class filled in, labels and
    bookkeeping dropped (nested tower configs kept whole; :func:`architecture_config` cleans them too)."""
    return base_config_dict(cls.from_dict(base_config_dict(raw)).to_dict())


def check_same_architecture(
    folders: list[Path], configs: list[dict[str, Any]], keys: tuple[str, ...] | None = None
) -> None:
    """``ValueError`` naming the folder and the differing values unless every member's config agrees with
    the first one's on ``keys`` (default: every key)."""
    for f, c in zip(folders[1:], configs[1:]):
        names = keys or sorted(set(configs[0]) | set(c))
        diff = {k: (configs[0].get(k), c.get(k)) for k in names if configs[0].get(k) != c.get(k)}
        if diff:
            raise ValueError(f"member {str(f)!r} does not have the first member's architecture: {diff}")


def architecture_config(cls: type[PretrainedConfig], raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a config.json) with the defaults of its transformers config class filled in, labels and
    bookkeeping dropped (nested tower configs included)."""
    full = cls.from_dict({k: v for k, v in raw.items() if k not in NOT_ARCHITECTURE}).to_dict()
    out = {k: v for k, v in full.items() if k not in NOT_ARCHITECTURE}
    for key, value in out.items():
        if key.endswith("_config") and isinstance(value, dict):
            out[key] = {k: v for k, v in value.items() if k not in NOT_ARCHITECTURE}
    return out


def read_members(
    folders: list[Path], config_cls: type[PretrainedConfig], reader: Callable[[dict, dict, str], Member],
    shape_of: Callable[[dict[str, Any]], Any],
) -> tuple[list[dict[str, Any]], list[Member]]:
    """Every folder's architecture config and canonical member; ``ValueError`` naming the folder when a
    member's shape (``shape_of(config)``) differs from the first one's."""
    raws = [read_config(f) for f in folders]
    configs = [architecture_config(config_cls, r) for r in raws]
    for f, c in zip(folders[1:], configs[1:]):
        if shape_of(c) != shape_of(configs[0]):
            raise ValueError(
                f"member {str(f)!r} does not have the first member's architecture: {shape_of(c)} vs "
                f"{shape_of(configs[0])}; use members fine-tuned from one base model"
            )
    members = [reader(read_state_dict(f), c, repr(str(f))) for f, c in zip(folders, configs)]
    return raws, members


def label_arguments(
    state: dict[str, torch.Tensor], head_key: str, raw: dict[str, Any], num_labels: int | None,
    id2label: dict[int, str] | None, *, names: Any = None,
) -> dict[str, Any]:
    """Label arguments of the Hydra config: the checkpoint's classifier (``state[head_key]`` is
    ``(M, C, in)``) and label names when it has them, else ``id2label`` / ``num_labels`` (default 2).

    ``names``: the checkpoint's label names, a dict or a list (default ``raw["id2label"]``); they are kept
    when there is one per class, with ``label2id`` (their inverse: data labelled with the class names maps
    through it). ``raw["problem_type"]`` goes with a trained classifier.
    """
    if head_key in state:
        n = state[head_key].shape[1]
        names = raw.get("id2label") if names is None else names
        out: dict[str, Any] = {"num_labels": n}
        if isinstance(names, dict) and len(names) == n:
            out = _labels({int(k): v for k, v in names.items()})
        elif isinstance(names, (list, tuple)) and len(names) == n:
            out = _labels(dict(enumerate(names)))
        if raw.get("problem_type"):
            out["problem_type"] = raw["problem_type"]
        return out
    if id2label:
        return _labels({int(k): v for k, v in id2label.items()})
    return {"num_labels": num_labels or 2}


def _labels(id2label: dict[int, Any]) -> dict[str, Any]:
    """``id2label`` and its inverse ``label2id`` (transformers 5 derives neither from the other)."""
    return {"id2label": id2label, "label2id": {str(v): k for k, v in id2label.items()}}


def load_fused(
    model: PreTrainedModel, state: dict[str, torch.Tensor], allowed_missing: set[str], source: Path, seed: int
) -> PreTrainedModel:
    """Load the fused tensors into ``model``: shapes checked first, no tensor left over, every model
    tensor set except ``allowed_missing`` (newly initialised, with a warning). Returns the model in eval mode."""
    check_fused_shapes(model, state, repr(str(source)))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"converter produced tensors the model does not have: {result.unexpected_keys[:5]}")
    missing = set(result.missing_keys)
    if missing - allowed_missing:
        raise ValueError(f"converter left model tensors unset: {sorted(missing - allowed_missing)[:5]}")
    if missing:
        logger.warning(
            "Some weights of the Hydra model were not in %s and are newly initialized (one per member, seed %d): %s. "
            "Fine-tune the model before using it for predictions.",
            source, seed, sorted(missing),
        )
    return model.eval()

