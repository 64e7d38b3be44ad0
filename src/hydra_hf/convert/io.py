"""Reading checkpoints from disk: configs and weight files (safetensors first)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "open_clip_model.safetensors")


def checkpoint_dir(path: str | Path, *, what: str = "checkpoint") -> Path:
    """Return ``path`` as a folder that exists, or raise ``ValueError`` naming it."""
    folder = Path(path)
    if not folder.exists():
        raise ValueError(f"{what} folder {str(folder)!r} does not exist; pass a local model folder (save_pretrained output)")
    if not folder.is_dir():
        raise ValueError(f"{what} {str(folder)!r} is a file, not a model folder; pass the folder that holds config.json")
    return folder


def read_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a model folder as a dict."""
    folder = checkpoint_dir(path)
    file = folder / "config.json"
    if not file.is_file():
        raise ValueError(f"{str(folder)!r} has no config.json; it is not a Hugging Face model folder")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(file)!r} is not valid JSON ({exc})") from None


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All weights of a model folder (or of one weights file), on CPU.

    Reads ``model.safetensors``, a sharded ``model.safetensors.index.json``, or, failing those,
    ``pytorch_model.bin`` with ``torch.load(weights_only=True)`` (no arbitrary code runs).
    """
    path = Path(path)
    if path.is_file():
        files = [path]
    else:
        folder = checkpoint_dir(path)
        if (folder / "model.safetensors").is_file():
            files = [folder / "model.safetensors"]
        elif (folder / "model.safetensors.index.json").is_file():
            index = json.loads((folder / "model.safetensors.index.json").read_text())
            files = [folder / name for name in sorted(set(index["weight_map"].values()))]
        elif (folder / "pytorch_model.bin").is_file():
            files = [folder / "pytorch_model.bin"]
        else:
            raise ValueError(
                f"{str(folder)!r} holds no weights (looked for {', '.join(WEIGHT_FILES[:3])}); "
                "save the model with save_pretrained first"
            )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            state.update(load_file(str(file), device="cpu"))
        elif file.suffix in (".bin", ".pt", ".pth"):
            logger.info("reading %s with torch.load(weights_only=True)", file)
            loaded = torch.load(str(file), map_location="cpu", weights_only=True)
            if isinstance(loaded, dict) and "state_dict" in loaded and isinstance(loaded["state_dict"], dict):
                loaded = loaded["state_dict"]
            if not isinstance(loaded, dict):
                raise ValueError(f"{str(file)!r} does not hold a state dict (got {type(loaded).__name__})")
            state.update(loaded)
        else:
            raise ValueError(f"unknown weights file type {str(file)!r}; use .safetensors (or .bin)")
    return state


def strip_prefix(state: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Drop the first of ``prefixes`` that starts any key (e.g. ``"bert."`` of a task model)."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state):
            return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}
    return dict(state)
