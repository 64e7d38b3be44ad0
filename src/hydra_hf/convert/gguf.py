"""GGUF checkpoints as input: a ``.gguf`` file (or a folder holding exactly one) read through transformers'
own GGUF loader, de-quantised to fp32 and materialised once into a plain Hugging Face folder, cached by the
file's SHA-256.

- :func:`is_gguf` / :func:`gguf_file`: whether a path names a GGUF checkpoint, and which file;
- :func:`materialize_gguf` ``(path) -> Path``: the cached plain folder (``config.json`` without
  ``quantization_config``, ``model.safetensors`` in fp32, the GGUF's tokenizer and generation config); its
  ``config.json`` records the source under :data:`CONFIG_KEY` (file name, SHA-256, quantisation, architecture);
- :func:`checkpoint_inputs`: what an output written from a GGUF must never be, contain or lie inside (the file,
  its folder, the cache);
- :func:`gguf_source`: the checked record of a config (a folder's config is hostile input).

The cache is ``$HYDRA_HF_GGUF_CACHE`` when set, else ``$HF_HOME/hydra_hf/gguf`` (``HF_HOME`` defaults to
``~/.cache/huggingface``). An entry is ``<cache>/<sha256>/``, written atomically (a temporary sibling renamed into
place, :func:`hydra_hf.outputs.write_output_folder`) while a blocking lock beside it makes a second process wait
and then use the first one's entry. Each entry holds a manifest of its files' sizes and SHA-256; an entry that
does not match it (a truncated or edited file) is never used: it is rebuilt. The GGUF file and its folder are
inputs: nothing is written into them.

Nothing here knows the family registry: :func:`materialize_gguf` takes an ``accept`` check (the registry's
supported architectures, :func:`hydra_hf.families.resolve_checkpoint`) that runs on the file's metadata before
the minutes of de-quantisation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants as hub_constants
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..errors import HydraInputError, HydraOutputError
from ..outputs import MARKER, is_owned, read_json, write_output_folder  # MARKER: .hydra_hf_output.json

try:
    import fcntl
except ImportError:  # Windows: concurrent materialisations of one file are refused by the output lock instead
    fcntl = None

logger = logging.getLogger(__name__)

SUFFIX = ".gguf"
CACHE_ENV = "HYDRA_HF_GGUF_CACHE"
CONFIG_KEY = "gguf_source"  # config.json: {"file", "sha256", "quantization", "architecture"}
COMMAND = "materialize-gguf"  # the marker of a cache entry (hydra_hf.outputs)
MANIFEST = "gguf_manifest.json"
MANIFEST_FORMAT = "hydra-gguf-materialized"
INSTALL = "pip install 'hydra_hf[gguf]' (the gguf package transformers reads GGUF files with)"
LOADING_FLAGS = ("local_files_only", "is_local")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WORD = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_HASHES: dict[tuple[str, int, int, int], str] = {}  # (real path, size, mtime_ns, inode) -> sha256: one read per file
_CHECKED: set[tuple[str, int]] = set()  # cache entries whose files matched their manifest in this process


# ------------------------------------------------------------------------------------------- finding
def _gguf_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a GGUF checkpoint: a ``.gguf`` file, or a folder without ``config.json`` that holds
    ``.gguf`` files (exactly one is usable: :func:`gguf_file` names the others)."""
    p = Path(path)
    if p.is_file():
        return p.suffix.lower() == SUFFIX
    return p.is_dir() and not (p / "config.json").exists() and bool(_gguf_files(p))


def gguf_file(path: str | os.PathLike) -> Path:
    """The GGUF file ``path`` names: itself, or the one ``.gguf`` file of a folder.

    Raises:
        HydraInputError: no GGUF there, or a folder with several (naming them).
    """
    p = Path(path)
    if p.is_file() and p.suffix.lower() == SUFFIX:
        return p
    if p.is_dir():
        found = _gguf_files(p)
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(f.name for f in found[:4]) + (" ..." if len(found) > 4 else "")
            raise HydraInputError(
                f"{str(p)!r} holds {len(found)} GGUF files ({names}); pass the one to use as the file path"
            )
    raise HydraInputError(f"{str(p)!r} is not a .gguf file nor a folder holding one")


def cache_root() -> Path:
    """The folder of the materialised GGUF checkpoints: ``$HYDRA_HF_GGUF_CACHE``, else
    ``$HF_HOME/hydra_hf/gguf``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(os.environ.get("HF_HOME") or hub_constants.HF_HOME).expanduser() / "hydra_hf" / "gguf"


def checkpoint_inputs(path: str | os.PathLike) -> list[Path]:
    """What an output written from checkpoint ``path`` must never be, contain or lie inside: ``path`` itself,
    and for a GGUF its folder and the cache of materialised checkpoints too."""
    p = Path(path)
    if not is_gguf(p):
        return [p]
    file = gguf_file(p)
    return [p, file, file.parent, cache_root()]


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file (hex), read once per process while the file is unchanged."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with open(p, "rb") as handle:
            while chunk := handle.read(1 << 22):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


# ------------------------------------------------------------------------------------------- metadata
def _reader(file: Path) -> Any:
    """The ``gguf`` package's reader of ``file`` (its metadata and tensor table; the tensors stay on disk)."""
    try:
        import gguf  # optional: the [gguf] extra installs it
    except ImportError:
        raise HydraInputError(f"reading the GGUF file {str(file)!r} needs the gguf package: {INSTALL}") from None
    try:
        return gguf.GGUFReader(str(file))
    except (ValueError, OSError, IndexError, KeyError) as exc:  # a wrong magic number, a truncated file
        detail = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise HydraInputError(
            f"{str(file)!r} is not a readable GGUF file ({detail}); pass a GGUF checkpoint (llama.cpp's format)"
        ) from None


def _field(reader: Any, name: str) -> Any:
    field = reader.fields.get(name)
    return None if field is None else field.contents()


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """``{"file", "architecture", "name", "quantization"}`` of a GGUF file, from its metadata
    (``general.architecture``, ``general.name``, ``general.file_type``; without a file type, the commonest type
    of its matrices)."""
    import gguf  # optional: the [gguf] extra installs it (_reader has said so when it is missing)

    file = gguf_file(path)
    reader = _reader(file)
    architecture = _field(reader, "general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise HydraInputError(f"the GGUF file {str(file)!r} names no architecture (general.architecture)")
    file_type = _field(reader, "general.file_type")
    try:
        quantization = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):  # no file type recorded, or one this gguf release does not know
        kinds = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) > 1)
        quantization = kinds.most_common(1)[0][0] if kinds else "unknown"
    name = _field(reader, "general.name")
    return {"file": file.name, "architecture": architecture, "name": name if isinstance(name, str) else None,
            "quantization": quantization}


def gguf_source(config: Any) -> dict[str, str] | None:
    """The GGUF record (:data:`CONFIG_KEY`) of a config (a dict or a config object), checked: ``None`` when it
    has none or it is malformed (a folder's config is hostile input: a card prints these values)."""
    record = config.get(CONFIG_KEY) if isinstance(config, dict) else getattr(config, CONFIG_KEY, None)
    if not isinstance(record, dict):
        return None
    file, sha, quantization, arch = (record.get(k) for k in ("file", "sha256", "quantization", "architecture"))
    if not (isinstance(file, str) and 0 < len(file) <= 255 and file.lower().endswith(SUFFIX)
            and re.fullmatch(r"[^\x00-\x1f/\\`|<>\[\]]+", file)):
        return None
    if not (isinstance(sha, str) and _SHA256.match(sha)):
        return None
    if not all(isinstance(v, str) and _WORD.match(v) for v in (quantization, arch)):
        return None
    return {"file": file, "sha256": sha, "quantization": quantization, "architecture": arch}


# ------------------------------------------------------------------------------------------- the cache
def _manifest_files(folder: Path) -> dict[str, dict[str, Any]]:
    """``{name: {"size", "sha256"}}`` of every file of a materialised folder but the manifest and the files of
    hydra_hf's output writer (its marker ``.hydra_hf_output.json``, its temporary folder's sentinel)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".hydra_hf_"):
            out[p.relative_to(folder).as_posix()] = {"size": p.stat().st_size, "sha256": file_sha256(p)}
    return out


def _entry_problem(entry: Path, sha256: str) -> str | None:
    """Why the cache entry ``entry`` may not be used (None: it is complete and every file matches its manifest)."""
    if entry.is_symlink() or not entry.is_dir():
        return "not a folder"
    file = entry / MANIFEST
    if not file.is_file():
        return f"no {MANIFEST}"
    key = (str(entry.resolve()), file.stat().st_mtime_ns)
    if key in _CHECKED:
        return None
    try:
        manifest = read_json(file, what="GGUF cache manifest", fix="it is rebuilt")
    except ValueError as exc:
        return str(exc)
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return "not a manifest of this cache"
    if manifest.get("gguf_sha256") != sha256:
        return "the manifest names another GGUF file"
    files = manifest.get("files")
    if not isinstance(files, dict) or "config.json" not in files:
        return "the manifest lists no files"
    found = _manifest_files(entry)
    if set(found) != set(files):
        odd = sorted(set(found) ^ set(files))
        return f"its files differ from the manifest's ({', '.join(odd[:3])})"
    for name, info in files.items():
        if found[name] != info:
            return f"{name} does not match the manifest (size or SHA-256)"
    _CHECKED.add(key)
    return None


@contextlib.contextmanager
def _waiting_lock(root: Path, sha256: str) -> Iterator[None]:
    """Hold a blocking lock on ``root/.<sha256>.materialize.lock``: a second process materialising the same
    file waits here, then finds the first one's entry."""
    if fcntl is None:
        yield
        return
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / f".{sha256}.materialize.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            logger.info("another process is materialising this GGUF file: waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_folder(file: Path, record: dict[str, str]) -> Callable[[Path], None]:
    """Writes the plain folder of ``file`` into a temporary folder (see :func:`materialize_gguf`)."""

    def write(tmp: Path) -> None:
        folder, name = str(file.parent), file.name
        try:
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        except ImportError:
            raise HydraInputError(f"reading the GGUF file {str(file)!r} needs the gguf package: {INSTALL}") from None
        except (ValueError, KeyError, OSError) as exc:  # transformers: "GGUF model with architecture X is not ..."
            raise HydraInputError(
                f"transformers cannot read the GGUF file {str(file)!r} ({' '.join(str(exc).split())[:200]}); "
                "pass a GGUF of an architecture transformers' GGUF loader supports"
            ) from None
        settings = loaded.config.to_dict()
        settings.pop("quantization_config", None)  # the weights are plain fp32 now
        config = type(loaded.config).from_dict(settings)
        setattr(config, CONFIG_KEY, record)
        with torch.device("meta"):  # no random initialisation: every tensor is assigned below
            plain = type(loaded)(config)
        plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
        plain.tie_weights()
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        file_config = tmp / "tokenizer_config.json"  # transformers' loading flags, not the tokenizer's settings
        settings = json.loads(file_config.read_text()) if file_config.is_file() else None
        if isinstance(settings, dict) and set(LOADING_FLAGS) & set(settings):
            kept = {k: v for k, v in settings.items() if k not in LOADING_FLAGS}
            file_config.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
        manifest = {"format": MANIFEST_FORMAT, "version": 1, "gguf_sha256": record["sha256"],
                    "files": _manifest_files(tmp)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")

    return write


def materialize_gguf(
    path: str | os.PathLike, *, accept: Callable[[dict[str, Any]], None] | None = None
) -> Path:
    """The plain Hugging Face folder of a GGUF checkpoint, from the cache (written there the first time).

    The GGUF is read by transformers' own loader (``from_pretrained(folder, gguf_file=NAME, dtype=float32)``:
    de-quantised to fp32; its tokenizer likewise) and saved as an ordinary ``save_pretrained`` folder: the
    GGUF's config without ``quantization_config``, ``model.safetensors``, the tokenizer and generation config.
    ``config.json`` records the source under :data:`CONFIG_KEY`: ``{"file": NAME, "sha256": HEX,
    "quantization": "Q4_1", "architecture": "llama"}``. Concurrent calls for one file are safe (one
    writes, the others wait and read its entry); a cache entry whose files do not match its manifest is
    rebuilt, never used.

    Args:
        path: a ``.gguf`` file, or a folder holding exactly one (:func:`gguf_file`); never written into.
        accept: called with :func:`read_gguf_metadata`'s record before the weights are read; raises to refuse
            the file (e.g. an architecture hydra_hf builds no Hydra of).

    Returns:
        the cached folder (read it, never write into it).

    Raises:
        HydraInputError: not a GGUF file, an unreadable one, one transformers cannot read, or ``accept``'s refusal.
    """
    file = gguf_file(path)
    sha256 = file_sha256(file)
    root = cache_root()
    entry = root / sha256
    if _entry_problem(entry, sha256) is None:
        return _accepted(entry, accept)
    with _waiting_lock(root, sha256):
        problem = _entry_problem(entry, sha256)  # another process may have written it meanwhile
        if problem is None:
            return _accepted(entry, accept)
        metadata = read_gguf_metadata(file)
        if accept is not None:
            accept(metadata)
        if entry.exists() or entry.is_symlink():
            if not is_owned(entry, COMMAND) or entry.is_symlink():
                raise HydraOutputError(
                    f"the GGUF cache entry {str(entry)!r} is incomplete ({problem}) and was not written by hydra_hf "
                    f"(no {MARKER}); remove it (or set {CACHE_ENV} to another folder) and run again"
                )
            logger.warning("the GGUF cache entry %s cannot be used (%s): materialising it again", entry, problem)
        record = {"file": file.name, "sha256": sha256, "quantization": metadata["quantization"],
                  "architecture": metadata["architecture"]}
        logger.info("materialising %s (%s, %s) into %s: de-quantised to fp32 once, then read from the cache",
                    file.name, metadata["architecture"], metadata["quantization"], entry)
        write_output_folder(entry, _write_folder(file, record), command=COMMAND, overwrite=True,
                            inputs=[file, file.parent])
    problem = _entry_problem(entry, sha256)
    if problem is not None:  # only a concurrent writer outside this lock (another machine) gets here
        raise HydraOutputError(f"the GGUF cache entry {str(entry)!r} changed while it was written ({problem})")
    return entry


def _accepted(entry: Path, accept: Callable[[dict[str, Any]], None] | None) -> Path:
    """A complete cache entry, once ``accept`` agrees with the architecture it records."""
    if accept is not None:
        record = gguf_source(read_json(entry / "config.json", what="model config", fix="it is rebuilt"))
        if record is not None:
            accept(record)
    return entry
