"""Zero-shot (two-tower) models as ``hydra-hf evaluate`` reads them: CLIP and SigLIP folders (Hydra or
stock) and open_clip folders, each with the prompt tokenizer and image preprocessing it was trained
with, and the :class:`ZeroShotPredictor` of each. Which folders are zero-shot:
:func:`hydra_hf.evaluation.loading.zero_shot_family`; the prompt templates, the class names and the
data checks: :mod:`hydra_hf.data`.

The predictions are :class:`hydra_hf.evaluation.ZeroShotPredictor`'s (CLIP's prompt ensemble, one
softmax over the classes per member); the metrics and the report are the classifier path's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn
from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

from ..convert.io import check_remote_code, from_pretrained
from ..errors import HydraInputError
from ..pruning.loading import load_open_clip_folder
from .loading import zero_shot_family
from .predictors import ZeroShotPredictor

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------- loading
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
    # Hydra*, CLIPModel, SiglipModel
    model = from_pretrained(AutoModel, folder, trust_remote_code=trust_remote_code).eval()
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
