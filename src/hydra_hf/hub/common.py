"""What the hub modules share: the push error, the file names a repository may hold, folder listings, and
the readers of a Hydra folder's config (:func:`read_config`, :func:`towers`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import HydraInputError, HydraTypeError, one_line
from ..families import families
from ..onnx.runtime import EXPORT_METADATA
from ..outputs import read_json, resolve_inside

# Files of a model folder that belong in the repository (besides *.safetensors and shipped *.py): the
# tokenizer / processor files and a causal LM's generation defaults.
PREPROCESSOR_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
    "special_tokens_map.json", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model", "preprocessor_config.json", "processor_config.json", "image_processor_config.json",
    "chat_template.jinja", "generation_config.json",
)
# JSON files among them that could name loader code of their own (an ``auto_map``): never shipped.
PREPROCESSOR_CONFIGS = ("tokenizer_config.json", "preprocessor_config.json", "processor_config.json",
                        "image_processor_config.json", "generation_config.json")
WEIGHT_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".h5", ".msgpack", ".npz")
# config.json keys that its Hydra config class does not take as arguments
CONFIG_KEYS_NOT_FOR_THE_CLASS = ("auto_map", "custom_pipelines", "architectures", "transformers_version")


class HubError(HydraInputError):
    """A push, staging or validation failure to show the user as one line (the CLI exits 2)."""


def is_hidden(relative: str | os.PathLike) -> bool:
    """True for ``.name`` files and anything inside a ``.folder`` (markers, locks, temporaries)."""
    return any(part.startswith(".") for part in Path(relative).parts)


def visible_files(folder: str | os.PathLike) -> dict[str, int]:
    """``{relative posix path: bytes}`` of the files under ``folder`` that are not hidden: what a
    staged repository uploads (the ``.hydra_hf_output.json`` marker and other dot-files never are)."""
    root = Path(folder)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not name.startswith(".") and path.is_file() and not path.is_symlink():
                out[path.relative_to(root).as_posix()] = path.stat().st_size
    return dict(sorted(out.items()))


def folder_digest(folder: str | os.PathLike) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` (to show it was left untouched)."""
    root = Path(folder)
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def read_hub_json(path: str | os.PathLike, what: str, fix: str) -> Any:
    """A JSON file that push stages or reads: strict (no ``NaN`` / ``Infinity``, no key twice in one
    object, integers of sane length), bounded, one-line errors naming the file and ``fix``. The Hub and
    the libraries that read the repository parse it with other JSON readers, which must all see the same."""
    try:
        return read_json(path, what=what, fix=fix, unique_keys=True)
    except HydraInputError as exc:
        raise HubError(str(exc)) from None


# --------------------------------------------------------------------------------------- config
def hydra_config_classes() -> dict[str, type]:
    """model_type -> config class of every family in the registry."""
    return {family.config_class().model_type: family.config_class() for family in families()}


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of a Hydra folder, checked by its Hydra config class; one-line errors."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"model folder {str(folder)!r} does not exist; pass a folder written by hydra-hf convert"
        )
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no config.json; pass a folder written by hydra-hf convert")
    if (folder / EXPORT_METADATA).exists():
        raise HubError(
            f"{str(folder)!r} is an ONNX export ({EXPORT_METADATA}): push publishes the PyTorch Hydra folder "
            "with its remote code; push the folder you exported from (hydra-hf export's input)"
        )
    file = resolve_inside(folder, "config.json", what="config.json")
    config = read_hub_json(file, "config.json", "restore the config.json that hydra-hf convert wrote")
    if not isinstance(config, dict):
        raise HubError(f"{file} holds a {type(config).__name__}, expected a Hydra Ensemble config (a JSON object)")
    cls = hydra_config_classes().get(config.get("model_type")) if isinstance(config.get("model_type"), str) else None
    if cls is None:
        raise HubError(
            f"{file} is not a Hydra Ensemble config (model_type={config.get('model_type')!r}); "
            "convert the checkpoint first with hydra-hf convert"
        )
    try:  # the config class validates kept heads, members, base config and fusion
        cls(**{k: v for k, v in config.items() if k not in CONFIG_KEYS_NOT_FOR_THE_CLASS})
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise HubError(f"{file} is not a valid {cls.__name__}: {one_line(exc)}") from exc
    if not towers(config):
        raise HubError(f"{file} records no kept heads; write the folder with hydra-hf convert")
    auto_map = config.get("auto_map")
    if not auto_map:
        raise HubError(
            f"{file} has no auto_map, so trust_remote_code cannot find the model; re-save it with hydra-hf convert"
        )
    if not isinstance(auto_map, dict) or not all(isinstance(v, str) for v in auto_map.values()):
        raise HydraTypeError(f"{file}: auto_map must map auto classes to 'module.Class' strings, got {auto_map!r}")
    pipelines = config.get("custom_pipelines")
    if pipelines is not None and (
        not isinstance(pipelines, dict)
        or not all(isinstance(p, dict) and isinstance(p.get("impl"), str) for p in pipelines.values())
    ):
        raise HydraTypeError(
            f"{file}: custom_pipelines must map task names to {{'impl': 'module.Class', ...}}, got {pipelines!r}"
        )
    return config


def towers(config: Mapping[str, Any]) -> dict[str, tuple[list[list[list[int]]], int]]:
    """``{tower: (kept_heads, heads per layer)}``: ``""`` for one-tower models (BERT, ViT), else
    ``"vision"`` / ``"text"`` (CLIP: ``<tower>_kept_heads`` with ``base_config["<tower>_config"]``)."""
    base = config.get("base_config") or {}
    found = {}
    if config.get("kept_heads"):
        found[""] = (config["kept_heads"], base.get("num_attention_heads"))
    for tower in ("vision", "text"):
        if config.get(f"{tower}_kept_heads"):
            found[tower] = (
                config[f"{tower}_kept_heads"],
                (base.get(f"{tower}_config") or {}).get("num_attention_heads"),
            )
    out = {}
    for tower, (kept, num_heads) in found.items():
        if not num_heads:  # not recorded: the largest kept index + 1
            num_heads = 1 + max((h for member in kept for layer in member for h in layer), default=0)
        out[tower] = (kept, int(num_heads))
    return out
