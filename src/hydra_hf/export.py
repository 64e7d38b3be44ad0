"""Saving a Hydra Ensemble as a self-contained model folder: config (with ``auto_map``), safetensors
weights, the shipped modeling code (flat, sibling imports only) and the base's preprocessor files.

The folder loads anywhere with ``AutoModel*.from_pretrained(folder, trust_remote_code=True)``, without
hydra_hf installed. Writing is atomic: everything goes to a temporary sibling folder that is renamed
into place at the end, so a failure never leaves a half-written output folder.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

MODELING_DIR = Path(__file__).resolve().parent / "modeling"

# Per base architecture: the shipped files (copied flat) and the config's auto_map.
SHIPPED: dict[str, dict] = {
    "bert": {
        "files": ["configuration_hydra.py", "hydra_layers.py", "modeling_hydra_bert.py"],
        "auto_map": {
            "AutoConfig": "configuration_hydra.HydraEnsembleConfig",
            "AutoModel": "modeling_hydra_bert.HydraEnsembleModel",
            "AutoModelForSequenceClassification": "modeling_hydra_bert.HydraEnsembleForSequenceClassification",
        },
    },
    "vit": {  # HF ViT and timm vit_* checkpoints
        "files": ["configuration_hydra.py", "hydra_layers.py", "modeling_hydra_vit.py"],
        "auto_map": {
            "AutoConfig": "configuration_hydra.HydraEnsembleViTConfig",
            "AutoModel": "modeling_hydra_vit.HydraEnsembleViTModel",
            "AutoModelForImageClassification": "modeling_hydra_vit.HydraEnsembleForImageClassification",
        },
    },
    "clip": {  # HF CLIP and open_clip checkpoints; the CLIP towers reuse the ViT file's pre-LN layer
        "files": ["configuration_hydra.py", "hydra_layers.py", "modeling_hydra_vit.py", "modeling_hydra_clip.py"],
        "auto_map": {
            "AutoConfig": "configuration_hydra.HydraEnsembleCLIPConfig",
            "AutoModel": "modeling_hydra_clip.HydraEnsembleCLIPModel",
            # what pipeline("zero-shot-image-classification") loads
            "AutoModelForZeroShotImageClassification": "modeling_hydra_clip.HydraEnsembleCLIPModel",
        },
    },
}


def check_output_dir(output_dir: str | os.PathLike, overwrite: bool) -> Path:
    """Fail early (before any work) if ``output_dir`` exists, is not empty and ``overwrite`` is off."""
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output {str(out)!r} is a file; choose a folder path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(
            f"output folder {str(out)!r} exists and is not empty; choose another folder or pass --overwrite"
        )
    return out


def atomic_folder(output_dir: str | os.PathLike, write: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Call ``write(tmp)`` on a fresh temporary sibling folder, then move it to ``output_dir``.

    On any error the temporary folder is removed and ``output_dir`` is left as it was.
    """
    out = check_output_dir(output_dir, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# Shipped with every architecture: the pipelines that add uncertainty to their results.
PIPELINE_FILE = "pipeline_hydra.py"

# auto_map class -> the custom pipeline (config.custom_pipelines entry) that uses it.
PIPELINE_TASKS: dict[str, tuple[str, str, str]] = {
    # auto class: (task name, pipeline class in PIPELINE_FILE, input type)
    "AutoModelForSequenceClassification": ("hydra-text-classification", "HydraTextClassificationPipeline", "text"),
    "AutoModelForImageClassification": ("hydra-image-classification", "HydraImageClassificationPipeline", "image"),
    "AutoModelForZeroShotImageClassification": (
        "hydra-zero-shot-image-classification", "HydraZeroShotImageClassificationPipeline", "multimodal"),
}


def custom_pipelines_for(auto_map: dict[str, str]) -> dict[str, dict]:
    """``config.custom_pipelines`` for a folder with this ``auto_map``: one uncertainty pipeline per
    task head the folder ships, so ``pipeline(model=folder, trust_remote_code=True)`` finds it."""
    module = PIPELINE_FILE.removesuffix(".py")
    return {
        task: {"impl": f"{module}.{cls}", "pt": [auto_class], "type": kind}
        for auto_class, (task, cls, kind) in PIPELINE_TASKS.items()
        if auto_class in auto_map
    }


def copy_modeling_code(folder: Path, arch: str) -> None:
    """Copy the shipped modeling files of ``arch`` and the uncertainty pipelines flat into ``folder``."""
    if arch not in SHIPPED:
        raise ValueError(f"no shipped modeling code for base architecture {arch!r}; known: {sorted(SHIPPED)}")
    for name in [*SHIPPED[arch]["files"], PIPELINE_FILE]:
        shutil.copyfile(MODELING_DIR / name, folder / name)


def copy_preprocessor(source: str | os.PathLike, folder: Path) -> list[str]:
    """Save the tokenizer / image processor / processor of ``source`` into ``folder``.

    Returns what was copied; logs a warning (and copies nothing) when ``source`` has none.
    """
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    copied = []
    for kind, loader in (("processor", AutoProcessor), ("tokenizer", AutoTokenizer), ("image processor", AutoImageProcessor)):
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
    import json

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
) -> Path:
    """Write ``model`` as a Hub-ready folder (atomically). ``extra(tmp)`` may add more files."""
    arch = model.config.base_model_type
    if arch not in SHIPPED:
        raise ValueError(f"no shipped modeling code for base architecture {arch!r}; known: {sorted(SHIPPED)}")

    def write(tmp: Path) -> None:
        model.config.auto_map = dict(SHIPPED[arch]["auto_map"])
        model.config.custom_pipelines = custom_pipelines_for(model.config.auto_map)
        model.save_pretrained(str(tmp), safe_serialization=True)
        copy_modeling_code(tmp, arch)
        if preprocessor_from is not None:
            copy_preprocessor(preprocessor_from, tmp)
        if extra is not None:
            extra(tmp)

    out = atomic_folder(output_dir, write, overwrite=overwrite)
    logger.info("wrote %s", out)
    return out
