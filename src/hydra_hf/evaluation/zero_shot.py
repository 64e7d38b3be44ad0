"""Zero-shot (two-tower) models as ``hydra-hf evaluate`` reads them: CLIP and SigLIP folders (Hydra or
stock) and open_clip folders, each with the prompt tokenizer and image preprocessing it was trained
with; prompt-template sets; the class names of the data; and the :class:`ZeroShotPredictor` of each.

The predictions are :class:`hydra_hf.evaluation.ZeroShotPredictor`'s (CLIP's prompt ensemble, one
softmax over the classes per member); the metrics and the report are the classifier path's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from open_clip import zero_shot_metadata
from PIL import Image
from torch import nn
from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

from ..convert.io import check_remote_code, from_pretrained, read_config
from ..data import image_folder_classes, parse_spec, zero_shot_prompts
from ..errors import HydraInputError
from ..families import Family, detect_family, family_of_config
from ..onnx.runtime import is_onnx_export
from ..pruning.loading import DEFAULT_PROMPT_TEMPLATE, load_open_clip_folder, read_class_names
from ..pruning.members import zero_shot_labels
from .predictors import ZeroShotPredictor

logger = logging.getLogger(__name__)

ZERO_SHOT_TASK = "zero-shot-image-classification"


def _open_clip_templates(name: str) -> list[str]:
    """open_clip's template functions (``lambda c: f"a photo of a {c}."``) as ``"{}"`` templates."""
    return [template("{}") for template in getattr(zero_shot_metadata, name)]


# name -> the templates it stands for (``--templates NAME``); a file or one template string also works
TEMPLATE_SETS: dict[str, Callable[[], list[str]]] = {
    "openai": lambda: _open_clip_templates("OPENAI_IMAGENET_TEMPLATES"),  # CLIP's 80 ImageNet prompts
    "simple": lambda: _open_clip_templates("SIMPLE_IMAGENET_TEMPLATES"),  # open_clip's 7 "simple" ones
    "default": lambda: [DEFAULT_PROMPT_TEMPLATE],  # what `hydra-hf prune` scores with
}


def read_templates(spec: str | os.PathLike | Sequence[str] | None) -> list[str]:
    """The prompt templates ``spec`` names.

    Args:
        spec: a name of :data:`TEMPLATE_SETS` (``openai``, ``simple``, ``default``), a file (one
            template per line, or a JSON list), one template holding ``{}``, a list of templates, or
            None (``default``: ``"a photo of a {}."``).

    Raises:
        ValueError: an unknown name, an empty file, or a template without exactly one ``{}``.
    """
    if spec is None:
        spec = "default"
    if isinstance(spec, (list, tuple)):
        templates = list(spec)
    elif str(spec) in TEMPLATE_SETS:
        templates = TEMPLATE_SETS[str(spec)]()
    elif os.path.isfile(spec):
        text = Path(spec).read_text()
        templates = json.loads(text) if text.lstrip().startswith("[") else [t.strip() for t in text.splitlines()]
        templates = [t for t in templates if not isinstance(t, str) or t.strip()]
    elif "{}" in str(spec):
        templates = [str(spec)]
    else:
        raise ValueError(f"--templates {str(spec)!r} is not a template set ({', '.join(TEMPLATE_SETS)}), a file or a "
                         "template with '{}' for the class name (e.g. 'a photo of a {}.')")
    zero_shot_prompts(["x"], templates)  # ValueError for an empty list or a template without exactly one {}
    return templates


def zero_shot_class_names(class_names: str | os.PathLike | None, id_data: str, *, model: str = "a CLIP model") -> list[str]:
    """The classes of a zero-shot model's prompts, in label order: ``class_names`` (comma-separated or
    a file, one per line: :func:`~hydra_hf.pruning.loading.read_class_names`), else the sub-folders of
    ``id_data`` when it is an image folder (the label order :func:`hydra_hf.data.load_local` gives).

    Raises:
        ValueError: no ``class_names`` and ``id_data`` is not an image folder.
    """
    if class_names:
        return read_class_names(class_names)
    names = image_folder_classes(parse_spec(id_data)[0])
    if names is None:
        raise ValueError(
            f"{model} classifies zero-shot: give --class-names (comma-separated or a file, one per line, in label "
            "order), or an image folder (one sub-folder per class) as --id-data"
        )
    return names


def zero_shot_data(dataset: datasets.Dataset, class_names: Sequence[str], source: str, model: str) -> datasets.Dataset:
    """``dataset`` (standard columns, :func:`hydra_hf.data.resolve_dataset`) checked for a zero-shot
    model: it must hold images, and its labels (if any) are matched to ``class_names`` (image-folder
    classes by name, integers as indices: :func:`~hydra_hf.pruning.members.zero_shot_labels`)."""
    if "image" not in dataset.column_names:
        raise ValueError(
            f"{source} gives texts (columns {dataset.column_names}), but {model} classifies images: give an image "
            "folder (one sub-folder per class) or data with an image column (--image-column)"
        )
    if "label" in dataset.column_names:
        dataset = zero_shot_labels(dataset, list(class_names), source)
    return dataset


# ------------------------------------------------------------------------------------- loading
def zero_shot_family(path: str | os.PathLike) -> Family | None:
    """The zero-shot family (``clip``, ``siglip``, ``open_clip``) of the model folder ``path``, Hydra
    or stock; None for any other folder or path (a classifier, a missing folder).

    Raises:
        HydraInputError: ``path`` is an ONNX export of a zero-shot model (evaluated from its PyTorch folder).
    """
    folder = Path(path)
    if is_onnx_export(folder):
        config = read_config(folder if folder.is_dir() else folder.parent)
        family = _family_or_none(lambda: family_of_config(config))
        if family is not None and family.task == ZERO_SHOT_TASK:
            raise HydraInputError(
                f"{str(path)!r} is an ONNX export of a zero-shot {family.name} model; hydra-hf evaluate runs zero-shot "
                "models from their PyTorch folder: give the Hydra folder it was exported from"
            )
        return None
    if not folder.is_dir():
        return None
    config = read_config(folder) if (folder / "config.json").is_file() else None
    if config is not None and config.get("base_model_type"):
        family = _family_or_none(lambda: family_of_config(config))
    else:
        family = _family_or_none(lambda: detect_family(folder, check=False))
    return family if family is not None and family.task == ZERO_SHOT_TASK else None


def _family_or_none(find: Callable[[], Family]) -> Family | None:
    try:
        return find()
    except HydraInputError:
        return None


@dataclass
class ZeroShotModel:
    """A loaded zero-shot model and what it reads with.

    Attributes:
        model: the model in eval mode (a Hydra CLIP / SigLIP, a transformers ``CLIPModel`` /
            ``SiglipModel`` or an open_clip ``CLIP``).
        family: its family's name (``clip``, ``siglip``, ``open_clip``).
        tokenize: class prompts -> text-tower inputs, as its family tokenizes them (SigLIP pads to 64, or to its
            text tower's positions when fewer).
        image_processor: its transformers image processor (None for an open_clip folder).
        transform: one PIL image -> ``(3, H, W)`` pixel values.
    """

    model: nn.Module
    family: str
    tokenize: Callable[[list[str]], Any]
    image_processor: Any | None
    transform: Callable[[Any], torch.Tensor]

    def predictor(self, class_names: Sequence[str], templates: Sequence[str]) -> ZeroShotPredictor:
        """The zero-shot classifier of ``class_names`` with the prompt ensemble of ``templates``."""
        return ZeroShotPredictor(self.model, class_names, templates, tokenizer=self.tokenize)


def load_zero_shot_model(path: str | os.PathLike, *, trust_remote_code: bool = False) -> ZeroShotModel:
    """Load a zero-shot model folder: a Hydra CLIP / SigLIP folder (hydra_hf's own classes, its shipped
    code never run), a stock CLIP / SigLIP folder, or an open_clip folder (``open_clip_config.json``).

    A folder that ships other code is refused unless ``trust_remote_code`` (loading would run it).

    Raises:
        ValueError: ``path`` is not a zero-shot model folder, or lacks its tokenizer / image processor.
    """
    family = zero_shot_family(path)
    if family is None:
        raise ValueError(f"{str(path)!r} is not a CLIP, SigLIP or open_clip model folder")
    folder = Path(path)
    if family.name == "open_clip":
        model, preprocess, tokenizer = load_open_clip_folder(folder)
        return ZeroShotModel(model, family.name, tokenizer, None, preprocess)
    check_remote_code(folder, trust_remote_code)
    model = from_pretrained(AutoModel, folder, trust_remote_code=trust_remote_code).eval()  # Hydra*, CLIPModel, SiglipModel
    try:
        tokenizer = from_pretrained(AutoTokenizer, folder, trust_remote_code=trust_remote_code)
        processor = from_pretrained(AutoImageProcessor, folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        if isinstance(exc, HydraInputError):
            raise
        raise ValueError(
            f"{str(path)!r} needs its tokenizer and image processor for zero-shot prompts (save them with "
            f"CLIPProcessor / SiglipProcessor.save_pretrained into the folder): {str(exc).splitlines()[0][:160]}"
        ) from None
    kwargs = family.prompt_tokenizer_kwargs_for(model.config)

    def tokenize(prompts: list[str]) -> Any:  # as transformers' zero-shot pipeline tokenizes them
        return tokenizer(prompts, return_tensors="pt", **kwargs)

    def transform(image: Any) -> torch.Tensor:  # (3, H, W)
        return processor(image, return_tensors="pt")["pixel_values"][0]

    return ZeroShotModel(model, family.name, tokenize, processor, transform)


def check_same_images(reference: ZeroShotModel, other: ZeroShotModel, name: str, atol: float = 0.05) -> None:
    """Refuse ``other`` (named ``name``) when it reads images of another size than ``reference``
    (every model of one evaluation reads the images ``reference``'s processor makes); a warning when
    the same image gives pixel values more than ``atol`` apart (another normalisation; two resizing
    implementations of one preprocessing, e.g. open_clip's and its CLIPProcessor's, differ by ~0.02)."""
    probe = Image.fromarray(
        (torch.rand(37, 53, 3, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8).numpy()
    )
    a, b = reference.transform(probe), other.transform(probe)  # (3, H, W) each
    if a.shape != b.shape:
        raise ValueError(
            f"--baseline {name} reads images of shape {tuple(b.shape)} but --model {tuple(a.shape)}; every model of "
            "one zero-shot evaluation reads the same preprocessed images: evaluate it in a run of its own"
        )
    diff = float((a.float() - b.float()).abs().max())
    if diff > atol:
        logger.warning("%s preprocesses images differently from --model (pixel values differ by up to %.3g); it is "
                       "evaluated on --model's preprocessing", name, diff)
