"""Loading a model folder for evaluation: which kind it is (:func:`folder_kind`: classifier, zero-shot or
causal LM), classifiers (stock or Hydra, or their ONNX export on ONNX Runtime) with their preprocessor,
causal LMs with their tokenizer, and the data loader of a classifier's inputs. Zero-shot folders load
through :func:`hydra_hf.evaluation.zero_shot.load_zero_shot_model` (open_clip)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn
from transformers import (
    CONFIG_MAPPING,
    AutoConfig,
    AutoImageProcessor,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from .. import distributed
from ..convert.gguf import is_gguf
from ..convert.io import check_remote_code, checkpoint_dir, from_pretrained, read_config
from ..data import make_image_loader, make_text_loader, pad_with_eos
from ..errors import HydraInputError
from ..families import Family, detect_family, families, family_of_config, is_causal_lm_folder, resolve_checkpoint
from ..onnx.runtime import OnnxHydraModel, is_onnx_export, load_preprocessor


def _modality(config: Any) -> str:
    """``"image"`` or ``"text"``: a Hydra config's family says; a stock config's model_type finds its family."""
    if getattr(config, "base_model_type", None):
        modality = family_of_config(config).modality
    else:
        found = [f for f in families() if config.model_type in getattr(f, "model_types", ())]
        modality = found[0].modality if found else ("image" if hasattr(config, "image_size") else "text")
    if modality not in ("text", "image"):
        raise ValueError(
            f"{config.model_type!r} is a {modality} (zero-shot) model; evaluate it with ZeroShotPredictor"
        )
    return modality


def load_classifier(path: str | os.PathLike, *, trust_remote_code: bool = False) -> tuple[nn.Module, Any, str]:
    """Load a classifier folder (stock or Hydra) with its preprocessor.

    Hydra folders are loaded with hydra_hf's own registered classes: their shipped code is never run.
    A folder that ships other code (an ``auto_map`` in its config or tokenizer / preprocessor config)
    is refused unless ``trust_remote_code`` is set -- loading it would execute that code.

    An ONNX export folder (``hydra-hf export --format onnx``), or one ``.onnx`` file in it, is run by
    ONNX Runtime (:class:`hydra_hf.onnx.OnnxHydraModel`; needs ``pip install hydra-hf[onnx]``). A GGUF
    checkpoint is read through its cached plain folder (:func:`hydra_hf.families.resolve_checkpoint`).

    Returns ``(model, preprocessor, modality)`` with modality ``"text"`` or ``"image"``.
    """
    if is_onnx_export(path):
        return _load_onnx_classifier(path)

    folder = checkpoint_dir(resolve_checkpoint(path), what="model")
    check_remote_code(folder, trust_remote_code)
    trust = bool(trust_remote_code)
    config = from_pretrained(AutoConfig, folder, trust_remote_code=trust)
    if _modality(config) == "image":
        model = from_pretrained(AutoModelForImageClassification, folder, trust_remote_code=trust)
        return model.eval(), from_pretrained(AutoImageProcessor, folder, trust_remote_code=trust), "image"
    model = from_pretrained(AutoModelForSequenceClassification, folder, trust_remote_code=trust)
    tokenizer = fit_tokenizer_to_model(from_pretrained(AutoTokenizer, folder, trust_remote_code=trust), model.config)
    pad_with_eos(tokenizer, model.config)
    return model.eval(), tokenizer, "text"


def _load_onnx_classifier(path: str | os.PathLike) -> tuple[nn.Module, Any, str]:
    model = OnnxHydraModel.from_pretrained(path)
    modality = _modality(model.config)
    preprocessor = load_preprocessor(model.file.parent, modality)
    if modality == "text":
        preprocessor = fit_tokenizer_to_model(preprocessor, model.config)
    return model, preprocessor, modality


# position embeddings of these text models start after the padding index (RoBERTa's "offset" of pad + 1)
_PADDING_OFFSET_TYPES = ("roberta", "xlm-roberta", "camembert", "xlm-roberta-xl", "longformer")


def _position_key(data: Mapping[str, Any]) -> str:
    """The key under which a config dict of ``data["model_type"]`` holds its position limit: the name the
    config class's ``attribute_map`` gives ``max_position_embeddings`` (GPT-2: ``n_positions``)."""
    model_type = data.get("model_type")
    config_class = CONFIG_MAPPING[model_type] if isinstance(model_type, str) and model_type in CONFIG_MAPPING else None
    return getattr(config_class, "attribute_map", {}).get("max_position_embeddings", "max_position_embeddings")


def max_text_positions(config: Any) -> int | None:
    """How many tokens a text model (stock or Hydra) takes at most: its ``max_position_embeddings`` (under
    the name its config class gives it, e.g. GPT-2's ``n_positions``), less RoBERTa's padding offset; None
    when its config has no such limit."""
    base = getattr(config, "base_config", None)
    data = dict(base) if isinstance(base, Mapping) else (config.to_dict() if hasattr(config, "to_dict") else {})
    data = data.get("text_config") or data
    positions = data.get(_position_key(data), data.get("max_position_embeddings"))
    if isinstance(positions, bool) or not isinstance(positions, int) or positions <= 0:
        return None
    if data.get("model_type") in _PADDING_OFFSET_TYPES:
        positions -= int(data.get("pad_token_id") or 1) + 1
    return positions if positions > 0 else None


def fit_tokenizer_to_model(tokenizer: Any, config: Any) -> Any:
    """Cap ``tokenizer.model_max_length`` at the model's positions, so a longer ``--max-length`` truncates
    texts to what the model takes instead of crashing in its position embeddings."""
    limit = max_text_positions(config)
    current = getattr(tokenizer, "model_max_length", None)
    if limit is not None and (not isinstance(current, int) or current > limit):
        tokenizer.model_max_length = limit
    return tokenizer


def make_loader(dataset, preprocessor: Any, modality: str, batch_size: int = 32, max_length: int = 128,
                *, shard: bool = False):
    """A loader of model inputs for ``dataset`` (text: tokenizer; image: image processor).

    With ``shard`` and several launched processes (``accelerate launch``), the loader covers this
    process's contiguous shard only, and :func:`predict` gathers the shards' predictions in order.
    """
    sharded = shard and distributed.process_info().distributed
    part = distributed.batch_shard(len(dataset), batch_size, distributed.ProcessInfo())  # one process: all batches
    if sharded:
        dataset, part = distributed.shard(dataset, batch_size)
    if modality == "image":
        loader = make_image_loader(
            dataset, lambda im: preprocessor(im, return_tensors="pt")["pixel_values"][0], batch_size=batch_size
        )
    else:
        loader = make_text_loader(dataset, preprocessor, batch_size=batch_size, max_length=max_length)
    loader.hydra_sharded = sharded
    loader.hydra_batches = part  # which batches of the whole data set this loader yields
    return loader


def check_deep_ensemble_model(path: str | os.PathLike, name: str) -> None:
    """Refuse, before anything is loaded, a model Deep Ensembles (D) cannot train heads for: it trains new
    linear heads on the features of ONE stock classifier (every classifier family), not of a Hydra Ensemble,
    an ONNX export or a DeiT with a distillation head (two classification layers)."""
    fix = "give the single fine-tuned classifier, e.g. --baseline Single=DIR --deep-ensemble Single"
    if is_onnx_export(path):
        raise ValueError(
            f"--deep-ensemble {name}: {str(path)!r} is an ONNX export, whose features cannot be read; {fix}"
        )
    config = read_config(path)
    if str(config.get("model_type", "")).startswith("hydra_ensemble"):
        raise ValueError(f"--deep-ensemble {name}: {str(path)!r} is a Hydra Ensemble (already M members); {fix}")
    teacher = [a for a in config.get("architectures") or [] if a.endswith("WithTeacher")]
    if teacher:
        raise ValueError(f"--deep-ensemble {name}: {str(path)!r} is a {teacher[0]} (two classification heads); "
                         "give a DeiTForImageClassification or another single-head classifier")


def load_causal_lm(path: str | os.PathLike, *, trust_remote_code: bool = False) -> tuple[nn.Module, Any]:
    """A causal LM folder (Hydra, loaded with hydra_hf's registered classes, or stock) and its tokenizer,
    in eval mode. A folder that ships other code is refused unless ``trust_remote_code``. A GGUF checkpoint
    (a ``.gguf`` file or a folder holding one) is read through its cached plain folder
    (:func:`hydra_hf.families.resolve_checkpoint`): the stock model transformers' GGUF loader gives, in fp32.

    Returns ``(model, tokenizer)``."""
    folder = checkpoint_dir(resolve_checkpoint(path), what="model")
    if not is_causal_lm_folder(folder):
        names = read_config(folder).get("architectures") or []
        raise HydraInputError(
            f"{str(folder)!r} is not a causal LM (architectures {names}); give a ...ForCausalLM folder "
            "(a Hydra one from hydra-hf convert, or a stock one)"
        )
    model = from_pretrained(AutoModelForCausalLM, folder, trust_remote_code=trust_remote_code).eval()
    try:
        tokenizer = from_pretrained(AutoTokenizer, folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise HydraInputError(
            f"{str(folder)!r} has no tokenizer to read the texts with; save it next to the model "
            f"(tokenizer.save_pretrained): {' '.join(str(exc).split()) or type(exc).__name__}"
        ) from None
    check_tokenizer_fits(tokenizer, model, folder)
    return model, tokenizer


def check_tokenizer_fits(tokenizer: Any, model: nn.Module, folder: str | os.PathLike) -> None:
    """Refuse a tokenizer whose token ids reach past the model's token embeddings (a tokenizer of another
    model: its ids would index out of the embedding table)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    top = max(vocab.values(), default=-1)
    if isinstance(rows, int) and top >= rows:
        raise HydraInputError(
            f"the tokenizer in {str(os.fspath(folder))!r} has token ids up to {top} but the model has "
            f"{rows} token embeddings; save the tokenizer the model was trained with next to it"
        )


ZERO_SHOT_TASK = "zero-shot-image-classification"


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
                f"{str(path)!r} is an ONNX export of a zero-shot {family.name} model; hydra-hf evaluate runs "
                "zero-shot models from their PyTorch folder: give the Hydra folder it was exported from"
            )
        return None
    if not folder.is_dir() or is_gguf(folder):  # a GGUF checkpoint is a causal LM
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


def folder_kind(path: str | os.PathLike) -> str:
    """``"causal_lm"``, ``"zero_shot"`` (a CLIP / SigLIP / open_clip folder) or ``"classifier"`` (any other
    model folder, or an ONNX export of a classifier): the path ``hydra-hf evaluate`` takes for ``path``."""
    if is_causal_lm_folder(path):
        return "causal_lm"
    return "zero_shot" if zero_shot_family(path) is not None else "classifier"
