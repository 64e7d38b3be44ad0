"""Saving a Hydra Ensemble as a self-contained model folder: config (with ``auto_map``), safetensors
weights, the shipped modeling code (flat, sibling imports only) and the base's preprocessor files.

The folder loads anywhere with ``AutoModel*.from_pretrained(folder, trust_remote_code=True)``, without
hydra_hf installed. Writing is atomic: everything goes to a temporary sibling folder that is renamed
into place at the end, so a failure never leaves a half-written output folder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, PreTrainedModel

from .families import families, family_of_config, get_family
from .modeling.configuration_hydra import (
    HYDRA_PIPELINES,
    PIPELINE_MODULE,
    custom_pipelines_for,
)
from .outputs import check_output, write_output_folder

logger = logging.getLogger(__name__)

MODELING_DIR = Path(__file__).resolve().parent / "modeling"

# Per family: the shipped files (copied flat) and the config's auto_map. A view of the family registry
# (hydra_hf.families), which is the source: family name -> {"files": [...], "auto_map": {...}}.
SHIPPED: dict[str, dict] = {
    family.name: {"files": list(family.shipped_files), "auto_map": family.auto_map} for family in families()
}


def check_output_dir(
    output_dir: str | os.PathLike, overwrite: bool, *, command: str = "convert", inputs: Iterable = ()
) -> Path:
    """Fail early (before any work) unless ``output_dir`` may be written (see :mod:`hydra_hf.outputs`)."""
    return check_output(output_dir, command=command, overwrite=overwrite, inputs=inputs)


def atomic_folder(
    output_dir: str | os.PathLike,
    write: Callable[[Path], None],
    overwrite: bool = False,
    *,
    command: str = "convert",
    inputs: Iterable = (),
) -> Path:
    """Call ``write(tmp)`` on a fresh temporary sibling folder, then move it to ``output_dir``, under an
    exclusive lock; on any error ``output_dir`` is left as it was (see :mod:`hydra_hf.outputs`)."""
    return write_output_folder(output_dir, write, command=command, overwrite=overwrite, inputs=inputs)


# Shipped with every architecture: the pipelines that add uncertainty to their results.
PIPELINE_FILE = f"{PIPELINE_MODULE}.py"
# auto_map class -> (task name, pipeline class in PIPELINE_FILE, input type); the config's custom_pipelines
PIPELINE_TASKS = HYDRA_PIPELINES
# Shipped with every architecture: the Inference Endpoints custom handler (`hydra-hf serve` runs it too).
HANDLER_FILE = "handler.py"


def copy_modeling_code(folder: Path, arch: str, *, overwrite: bool = True) -> None:
    """Copy the shipped modeling files of family ``arch`` (with the uncertainty pipelines) flat into
    ``folder``; with ``overwrite=False`` only those missing there."""
    for name in dict.fromkeys([*get_family(arch).shipped_files, PIPELINE_FILE]):
        if overwrite or not (folder / name).exists():
            shutil.copyfile(MODELING_DIR / name, folder / name)


def copy_preprocessor(source: str | os.PathLike, folder: Path) -> list[str]:
    """Save the tokenizer / image processor / processor of ``source`` into ``folder``.

    Returns what was copied; logs a warning (and copies nothing) when ``source`` has none.
    """
    copied = []
    for kind, loader in (
        ("processor", AutoProcessor),
        ("tokenizer", AutoTokenizer),
        ("image processor", AutoImageProcessor),
    ):
        try:
            obj = loader.from_pretrained(str(source))
        except Exception as exc:  # no such files in the source folder
            logger.debug("no %s in %s: %s", kind, source, exc)
            continue
        if kind == "processor" and not hasattr(obj, "tokenizer") and not hasattr(obj, "image_processor"):
            continue  # AutoProcessor fell back to a bare tokenizer/image processor: saved below
        obj.save_pretrained(str(folder))
        _drop_loading_flags(folder)
        copied.append(kind)
        if kind == "processor":
            break
    if not copied:
        logger.warning("%s has no tokenizer or image processor files: the output folder will have none", source)
    return copied


def _drop_loading_flags(folder: Path) -> None:
    """transformers saves how the source was loaded (``local_files_only``, ``is_local``) into the
    preprocessor configs; on the Hub those flags would stop users from downloading anything."""
    for name in ("tokenizer_config.json", "preprocessor_config.json", "processor_config.json"):
        file = folder / name
        if file.is_file():
            data = json.loads(file.read_text())
            if isinstance(data, dict) and ({"local_files_only", "is_local"} & set(data)):
                for key in ("local_files_only", "is_local"):
                    data.pop(key, None)
                file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_hydra_model(
    model: PreTrainedModel,
    output_dir: str | os.PathLike,
    *,
    preprocessor_from: str | os.PathLike | None = None,
    overwrite: bool = False,
    extra: Callable[[Path], None] | None = None,
    command: str = "convert",
    inputs: Iterable = (),
) -> Path:
    """Write ``model`` as a Hub-ready folder (atomically). ``extra(tmp)`` may add more files."""
    family = family_of_config(model.config)  # HydraInputError for an unknown base_model_type

    def write(tmp: Path) -> None:
        model.config.auto_map = dict(family.auto_map)
        model.config.custom_pipelines = (
            custom_pipelines_for(model.config.auto_map) if family.uncertainty_pipelines else {}
        )
        # save_pretrained writes the code the model runs (its module and the sibling files it imports, as
        # for any remote-code model); the copy only fills in a file it may lack (a class never registered
        # for an auto class, e.g. one imported from a folder by hand)
        model.save_pretrained(str(tmp))
        copy_modeling_code(tmp, family.name, overwrite=False)
        if preprocessor_from is not None:
            copy_preprocessor(preprocessor_from, tmp)
        if extra is not None:
            extra(tmp)

    out = atomic_folder(output_dir, write, overwrite=overwrite, command=command, inputs=inputs)
    logger.info("wrote %s", out)
    return out
