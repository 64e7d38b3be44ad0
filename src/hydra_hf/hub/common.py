"""What the hub modules share: the push error, the file names a repository may hold, folder listings."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import HydraInputError

# Files of a model folder that belong in the repository (besides *.safetensors and shipped *.py).
PREPROCESSOR_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
    "special_tokens_map.json", "added_tokens.json", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model", "preprocessor_config.json", "processor_config.json", "image_processor_config.json",
    "chat_template.jinja",
)  # fmt: skip
# JSON files among them that could name loader code of their own (an ``auto_map``): never shipped.
PREPROCESSOR_CONFIGS = ("tokenizer_config.json", "preprocessor_config.json", "processor_config.json",
                        "image_processor_config.json")
WEIGHT_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".h5", ".msgpack", ".npz")


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
