"""Reading checkpoints from disk: configs and weight files (safetensors first)."""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..errors import HydraError, HydraInputError, HydraUnsafeError
from ..outputs import read_model_config, resolve_inside

logger = logging.getLogger(__name__)

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "open_clip_model.safetensors",
)


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def checkpoint_dir(path: str | Path, *, what: str = "checkpoint") -> Path:
    """Return ``path`` as a folder that exists, or raise ``ValueError`` naming it."""
    folder = Path(path)
    if not folder.exists():
        raise ValueError(
            f"{what} folder {str(folder)!r} does not exist; pass a local model folder (save_pretrained output)"
        )
    if not folder.is_dir():
        raise ValueError(
            f"{what} {str(folder)!r} is a file, not a model folder; pass the folder that holds config.json"
        )
    return folder


def read_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a model folder as a dict."""
    folder = checkpoint_dir(path)
    file = folder / "config.json"
    if not file.exists():
        raise ValueError(f"{str(folder)!r} has no config.json; it is not a Hugging Face model folder")
    return read_model_config(file)


def weight_names(folder: str | Path) -> set[str]:
    """Tensor names of a checkpoint folder, without loading the tensors when it is safetensors
    (one file or shards); other weights are read with :func:`read_state_dict`."""
    folder = checkpoint_dir(folder)
    if (folder / "model.safetensors").is_file():
        files = [resolve_inside(folder, "model.safetensors", what="weights file")]
    elif (folder / "model.safetensors.index.json").is_file():
        files = _index_files(folder, "model.safetensors.index.json")
    else:
        return set(read_state_dict(folder))
    names: set[str] = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                names.update(handle.keys())
        except (SafetensorError, OSError) as exc:
            raise HydraInputError(
                f"{str(file)!r} is not a readable safetensors file ({_first_line(exc)}); "
                "re-save the checkpoint with save_pretrained"
            ) from None
    return names


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
            files = [resolve_inside(folder, "model.safetensors", what="weights file")]
        elif (folder / "model.safetensors.index.json").is_file():
            files = _index_files(folder, "model.safetensors.index.json")
        elif (folder / "pytorch_model.bin").is_file():
            files = [resolve_inside(folder, "pytorch_model.bin", what="weights file")]
        else:
            raise ValueError(
                f"{str(folder)!r} holds no weights (looked for {', '.join(WEIGHT_FILES[:3])}); "
                "save the model with save_pretrained first"
            )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            try:
                state.update(load_file(str(file), device="cpu"))
            except (SafetensorError, OSError) as exc:
                raise HydraInputError(
                    f"{str(file)!r} is not a readable safetensors file ({_first_line(exc)}); "
                    "re-save the checkpoint with save_pretrained"
                ) from None
        elif file.suffix in (".bin", ".pt", ".pth"):
            logger.info("reading %s with torch.load(weights_only=True)", file)
            try:
                loaded = torch.load(str(file), map_location="cpu", weights_only=True)
            except Exception as exc:  # pickle.UnpicklingError, EOFError, RuntimeError of a corrupt zip, ...
                raise HydraInputError(
                    f"{str(file)!r} cannot be read safely with torch.load(weights_only=True) ({type(exc).__name__}); "
                    "it needs arbitrary code to unpickle, which hydra_hf never runs: convert it to safetensors "
                    "where you trust it (model.save_pretrained(folder, safe_serialization=True))"
                ) from None
            if isinstance(loaded, dict) and "state_dict" in loaded and isinstance(loaded["state_dict"], dict):
                loaded = loaded["state_dict"]
            if not isinstance(loaded, dict):
                raise ValueError(f"{str(file)!r} does not hold a state dict (got {type(loaded).__name__})")
            state.update(loaded)
        else:
            raise ValueError(f"unknown weights file type {str(file)!r}; use .safetensors (or .bin)")
    check_finite(state, source=repr(str(path)))
    return state


def check_finite(state: Mapping[str, Any], *, source: str) -> None:
    """Refuse weights that hold NaN or +-inf: every output computed from them is meaningless, and a
    NaN compares unequal to everything (an equality check with ``diff > atol`` lets it through).

    Raises:
        HydraInputError: naming how many floating-point tensors are not finite and the first of them.
    """
    bad = [name for name, t in state.items()
           if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise HydraInputError(
            f"the weights of {source} are not finite: {len(bad)} tensor(s) hold NaN or inf (first: {bad[0]!r}); "
            "use a checkpoint saved before training diverged, or re-save a good one"
        )


def _index_files(folder: Path, name: str) -> list[Path]:
    """The weight files a shard index names; each must be a file inside ``folder``."""
    index_file = folder / name
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except ValueError as exc:  # not JSON, not UTF-8, an integer too long to read
        raise HydraInputError(f"{str(index_file)!r} is not valid JSON ({exc}); re-save the checkpoint") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise HydraInputError(
            f"{str(index_file)!r} has no 'weight_map' of tensor name -> file name; re-save the checkpoint"
        )
    files = []
    for shard in sorted(set(weight_map.values())):
        path = resolve_inside(folder, shard, what=f"shard {shard!r} of {name}")
        if not path.is_file():
            raise HydraInputError(f"{str(index_file)!r} names the shard {shard!r}, which is not in {str(folder)!r}")
        files.append(path)
    return files


def strip_prefix(state: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Drop the first of ``prefixes`` that starts any key (e.g. ``"bert."`` of a task model)."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in state):
            return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}
    return dict(state)


CODE_CONFIGS = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")


def shipped_code(folder: str | Path) -> list[str]:
    """Where ``folder`` asks transformers to run its own Python code (``auto_map`` entries).

    A Hydra folder's own ``config.json`` is not listed: hydra_hf loads it with its registered classes.
    """
    folder = Path(folder)
    found = []
    for name in CODE_CONFIGS:
        file = folder / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text(encoding="utf-8"))  # as transformers reads it
        except (ValueError, OSError):
            continue  # reported by whoever reads it for real
        if not isinstance(data, dict) or not data.get("auto_map"):
            continue
        if name == "config.json" and str(data.get("model_type", "")).startswith("hydra_ensemble"):
            continue
        found.append(f"{name} auto_map")
    return found


TRUST_REMEDY = "pass --trust-remote-code (trust_remote_code=True) only if you trust this folder"


def check_remote_code(folder: str | Path, trust_remote_code: bool, *, remedy: str = TRUST_REMEDY) -> None:
    """Refuse a folder that ships Python code unless the user trusts it (loading would run that code).
    ``remedy`` ends the message: what the calling command offers (not every command has --trust-remote-code)."""
    found = shipped_code(folder)
    if found and not trust_remote_code:
        raise HydraUnsafeError(
            f"{str(folder)!r} ships its own Python code ({'; '.join(found)}), which loading would run; {remedy}"
        )


def from_pretrained(loader: Any, folder: str | Path, *, trust_remote_code: bool = False, remedy: str = TRUST_REMEDY,
                    **kwargs: Any) -> Any:
    """``loader.from_pretrained(folder)`` for a user-given folder: its code runs only with
    ``trust_remote_code`` (else one line ending with ``remedy``), and unreadable weights are one
    :class:`HydraInputError` line."""
    check_remote_code(folder, trust_remote_code, remedy=remedy)
    try:
        loaded = loader.from_pretrained(str(folder), trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        if "Tokenizer" not in getattr(loader, "__name__", "") or isinstance(exc, HydraError):
            raise
        # transformers' reason spans several lines: the CLI's one line would end mid-sentence
        raise HydraInputError(
            f"{str(folder)!r} has no tokenizer that loads; save the base model's tokenizer into it "
            f"(AutoTokenizer.from_pretrained(BASE).save_pretrained({str(folder)!r})); transformers: "
            f"{' '.join(str(exc).split()) or type(exc).__name__}"
        ) from exc
    except (pickle.UnpicklingError, SafetensorError, EOFError) as exc:
        raise HydraInputError(
            f"the weights in {str(folder)!r} cannot be read safely ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:160] if str(exc).strip() else 'no detail'}); hydra_hf never "
            "unpickles arbitrary code: re-save the model as safetensors where you trust it"
        ) from None
    if isinstance(loaded, torch.nn.Module):
        check_finite(loaded.state_dict(), source=repr(str(folder)))
    if hasattr(loaded, "get_vocab") and hasattr(loaded, "all_special_tokens"):
        check_vocabulary(loaded, folder)
    return loaded


def check_vocabulary(tokenizer: Any, folder: str | Path) -> None:
    """Refuse a tokenizer whose vocabulary holds nothing but its special tokens: transformers builds
    one when a folder has a tokenizer class but no vocabulary file, and it turns every word into
    ``[UNK]`` (a model evaluated with it sees no text at all)."""
    vocab = tokenizer.get_vocab()
    if len(vocab) <= len(set(tokenizer.all_special_tokens)):
        raise HydraInputError(
            f"{str(folder)!r} has no tokenizer vocabulary (no tokenizer.json / vocab file: the tokenizer built from "
            f"it knows only its {len(vocab)} special tokens, so every word would be unknown); save the base model's "
            f"tokenizer into it: AutoTokenizer.from_pretrained(BASE).save_pretrained({str(folder)!r})"
        )
