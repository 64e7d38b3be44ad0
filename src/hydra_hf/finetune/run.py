"""A fine-tuning run set up once, before any training: every input checked, the data and the
preprocessor loaded (:func:`prepare_run` -> :class:`FinetuneRun`), and the Accelerator built
(:func:`make_accelerator`)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.state import AcceleratorState
from torch import nn
from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

from ..assemble import detect_arch
from ..convert import read_config
from ..convert.gguf import checkpoint_inputs
from ..convert.io import weight_names
from ..data import ROTTEN_TOMATOES_LABELS, check_labels, data_spec_paths, resolve_dataset
from ..errors import HydraInputError, HydraUnsafeError
from ..families import get_family, resolve_checkpoint
from ..lazy import lazy_module
from ..masks import HeadMasks
from ..outputs import check_output
from ..saving import copy_preprocessor
from .config import COMMAND, FinetuneConfig

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")

logger = logging.getLogger(__package__)  # "hydra_hf.finetune", as log lines named it before the split


# -------------------------------------------------------------------------------- architectures
@dataclass(frozen=True)
class _ArchSupport:
    """What fine-tuning needs per base architecture."""

    name: str
    modality: str  # "text" (tokenizer, text column) or "image" (image processor, image column)
    frozen_prefixes: tuple[str, ...]  # parameter names of the shared embeddings in the Hydra model
    unfuse: Callable[[dict[str, torch.Tensor], Any], list[dict[str, torch.Tensor]]]
    stock_model: Callable[[dict[str, Any], Any], nn.Module]  # (config dict, Hydra config) -> stock task model
    classifier_keys: tuple[str, ...]  # stock tensor names whose presence means a trained classifier
    decoder: bool = False  # a decoder family (Llama-style, GPT-2): last-token classifier or causal LM
    # (config dict) -> a decoder's stock causal LM
    stock_causal_lm: Callable[[dict[str, Any]], nn.Module] | None = None


def _arch_support(arch: str) -> _ArchSupport:
    """What fine-tuning needs, from the family registry (hydra_hf.families)."""
    family = get_family(arch)
    if family.task not in ("text-classification", "image-classification"):
        raise HydraInputError(
            f"fine-tuning trains text and image classifiers and decoder LMs; {family.name} is a {family.task} model "
            "(zero-shot Hydra members need no training: prune and convert them)"
        )

    def stock_model(cfg: dict[str, Any], hydra_config: Any) -> nn.Module:
        num_labels = len(cfg["id2label"]) if cfg.get("id2label") else cfg.get("num_labels")
        # the member's own architecture: a distilled DeiT's members keep both heads (WithTeacher)
        options = {"distilled": True} if getattr(hydra_config, "distilled", False) else {}
        return family.stock_model(cfg, num_labels, **options)

    decoder = "AutoModelForCausalLM" in family.model_class_names
    return _ArchSupport(
        name=family.name,
        modality=family.modality,
        frozen_prefixes=tuple(family.frozen_prefixes),
        unfuse=family.unfuse,
        stock_model=stock_model,
        classifier_keys=tuple(family.classifier_keys),
        decoder=decoder,
        stock_causal_lm=(lambda cfg: family.stock_model(cfg, None)) if decoder else None,
    )


def _is_causal_lm(arch: _ArchSupport, base_config: dict[str, Any], has_classifier: bool) -> bool:
    """Whether the base is a decoder's causal LM (``*ForCausalLM``, ``GPT2LMHeadModel``): its members are
    trained on the next-token loss of the text, without class labels, unless classes are asked for (then
    they are last-token classifiers with new heads)."""
    names = [str(a) for a in base_config.get("architectures") or []]
    lm = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in names)  # LlamaForCausalLM, GPT2LMHeadModel
    return arch.decoder and not has_classifier and lm


def _decoder_padding(processor: Any, model_dir: Path) -> tuple[int, str]:
    """A decoder's tokenizer pads with its pad token, else with its end-of-sequence token (set as the pad
    token here and saved with every output, as most decoder tokenizers have none). Returns the pad id and
    a line saying which; the sequence classifiers pool the last token that is not the pad token."""
    if processor.pad_token_id is not None:
        return processor.pad_token_id, f"pads with its pad token {processor.pad_token!r} (id {processor.pad_token_id})"
    if processor.eos_token_id is None:
        raise HydraInputError(
            f"the tokenizer of {str(model_dir)!r} has neither a pad nor an end-of-sequence token; set "
            "tokenizer.pad_token and save it with the model"
        )
    processor.pad_token = processor.eos_token
    return processor.eos_token_id, (
        f"has no pad token: it pads with its end-of-sequence token {processor.eos_token!r} (id "
        f"{processor.eos_token_id}), saved as the pad token with the outputs"
    )


# ------------------------------------------------------------------------------------- the run
@dataclass
class FinetuneRun:
    """Everything a fine-tuning run checked and loaded once, before any training."""

    model_dir: Path
    masks: HeadMasks
    base_config: dict[str, Any]
    arch: _ArchSupport
    processor: Any  # the tokenizer (text) or image processor (image)
    train: Any  # datasets.Dataset with text, label
    eval: Any | None
    num_labels: int | None  # None: a causal LM
    id2label: dict[int, str] | None
    base_has_classifier: bool
    work_dir: Path
    output_dir: Path
    config: FinetuneConfig
    overwrite: bool
    inputs: list[Path]  # what the run reads (model folder, masks file, data files): never written or deleted
    causal_lm: bool = False  # a decoder's causal LM: next-token loss over the text, no class labels
    pad_token_id: int | None = None  # a decoder's padding token (its tokenizer's pad, else its eos)
    pad_token_set: bool = False  # the decoder's tokenizer had no pad token: its eos was set as one

    def save_processor(self, folder: Path) -> None:
        """Save the run's preprocessor into an output folder: the model folder's, except that a decoder's
        tokenizer without a pad token saves its end-of-sequence token as one (see :func:`_decoder_padding`)."""
        copy_preprocessor(self.model_dir, folder)
        if self.arch.decoder and self.pad_token_set:
            fresh = AutoTokenizer.from_pretrained(str(self.model_dir))  # as saved: not the state training left
            fresh.pad_token = fresh.eos_token
            fresh.save_pretrained(str(folder))
            file = folder / "tokenizer_config.json"  # as copy_preprocessor: no loading flags on the Hub
            flags = ("local_files_only", "is_local")
            data = json.loads(file.read_text()) if file.is_file() else None
            if isinstance(data, dict) and set(flags) & set(data):
                kept = {k: v for k, v in data.items() if k not in flags}
                file.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")


def prepare_run(
    model_dir: str | os.PathLike,
    masks: HeadMasks | str | os.PathLike,
    train_data: Any,
    eval_data: Any | None,
    output_dir: str | os.PathLike,
    config: FinetuneConfig,
    work_dir: str | os.PathLike | None,
    overwrite: bool,
    id2label: dict[int, str] | None,
    extra_inputs: Sequence[str | os.PathLike] = (),
) -> FinetuneRun:
    """Check every input (fail before any work, nothing written) and load data and preprocessor. A GGUF
    ``model_dir`` (a ``.gguf`` file or a folder holding one) is read through its cached plain folder
    (:func:`hydra_hf.families.resolve_checkpoint`). ``extra_inputs``: other files the caller read (a settings
    file), kept out of the output and work folders."""
    source = Path(model_dir)
    masks_file = masks.source if isinstance(masks, HeadMasks) else Path(masks)
    inputs = [*checkpoint_inputs(source), *([masks_file] if masks_file is not None else []), *map(Path, extra_inputs),
              *data_spec_paths(train_data), *data_spec_paths(eval_data)]  # data files and folders, not embedded sets
    output_dir = Path(output_dir)
    work_dir = Path(work_dir) if work_dir is not None else output_dir.with_name(output_dir.name + ".work")
    real_out, real_work = output_dir.resolve(), work_dir.resolve()
    if real_work == real_out or real_out in real_work.parents or real_work in real_out.parents:
        raise HydraInputError(
            f"work folder {str(work_dir)!r} must not be the output folder {str(output_dir)!r}, lie inside it or "
            "contain it; choose another --work-dir"
        )
    for item in inputs:  # prepare_owned_folder checks this too; here it fails before any loading, naming --work-dir
        real = item.resolve()
        if real == real_work or real_work in real.parents:
            raise HydraUnsafeError(
                f"work folder {str(work_dir)!r} is or contains the input {str(item)!r}; choose a --work-dir outside "
                "the model folder, the masks file and the data"
            )
    check_output(output_dir, command=COMMAND, overwrite=overwrite, inputs=inputs)
    model_dir = resolve_checkpoint(source)
    if model_dir != source:  # a GGUF's materialised folder: an input too
        inputs.append(model_dir)
    base_config = read_config(model_dir)
    arch = _arch_support(detect_arch(model_dir))
    masks = masks if isinstance(masks, HeadMasks) else HeadMasks.load(masks)
    sizes = AutoConfig.for_model(**base_config)  # a data-only config object: its attribute_map knows every
    masks.check_compatible(  # family's names for the sizes (DistilBERT's n_layers / n_heads)
        sizes.num_hidden_layers, sizes.num_attention_heads, model=f"the model {str(model_dir)!r}"
    )
    # the family names its heads (RoBERTa's classifier.out_proj, DeiT's cls_classifier)
    weights = weight_names(model_dir)
    has_classifier = any(key in weights for key in arch.classifier_keys)
    what, loader = ("tokenizer", AutoTokenizer) if arch.modality == "text" else ("image processor", AutoImageProcessor)
    try:
        processor = loader.from_pretrained(str(model_dir))
    except Exception as exc:  # no preprocessor files: say which folder
        raise ValueError(f"could not load a {what} from {str(model_dir)!r} ({exc}); save one with the model") from None

    pad_token_id, pad_set = None, False
    if arch.decoder:
        pad_set = processor.pad_token_id is None
        pad_token_id, how = _decoder_padding(processor, model_dir)
        logger.info("decoder %s: the tokenizer %s; it pads on the %s", model_dir, how, processor.padding_side)
    if _is_causal_lm(arch, base_config, has_classifier) and config.num_labels is None and not id2label:
        train = _load_text(train_data, config, config.max_train_samples, "training")
        evaluation = (
            _load_text(eval_data, config, config.max_eval_samples, "evaluation") if eval_data is not None else None
        )
        _check_batch(train, config)
        return FinetuneRun(
            model_dir=model_dir, masks=masks, base_config=base_config, arch=arch, processor=processor, train=train,
            eval=evaluation, num_labels=None, id2label=None, base_has_classifier=False, work_dir=work_dir,
            output_dir=output_dir, config=config, overwrite=overwrite, inputs=inputs, causal_lm=True,
            pad_token_id=pad_token_id, pad_token_set=pad_set,
        )
    num_labels = None
    if has_classifier:
        saved = base_config.get("id2label") or {}
        num_labels = len(saved) if saved else int(base_config.get("num_labels", 2))
        if config.num_labels is not None and config.num_labels != num_labels:
            raise ValueError(
                f"num_labels={config.num_labels} but the classifier of {str(model_dir)!r} has {num_labels} classes; "
                "drop num_labels or start from a bare encoder"
            )
        id2label = None  # the checkpoint's own labels are kept
    elif id2label:
        num_labels = len(id2label)
    else:
        num_labels = config.num_labels
    train = _load_data(train_data, config, num_labels, config.max_train_samples, "training", arch.modality)
    names = getattr(train.features["label"], "names", None)  # an image folder's class names
    if id2label is None and not has_classifier and names:
        id2label = dict(enumerate(names))
        num_labels = num_labels or len(names)
    if num_labels is None:
        num_labels = max(2, int(max(train["label"])) + 1)
        logger.info("bare encoder: %d classes, from the training labels", num_labels)
    if (
        id2label is None
        and not has_classifier
        and isinstance(train_data, str)
        and train_data.startswith("rotten_tomatoes")
    ):
        id2label = dict(ROTTEN_TOMATOES_LABELS) if num_labels == len(ROTTEN_TOMATOES_LABELS) else None
    evaluation = None
    if eval_data is not None:
        evaluation = _load_data(eval_data, config, num_labels, config.max_eval_samples, "evaluation", arch.modality)
    _check_batch(train, config)
    return FinetuneRun(
        model_dir=model_dir, masks=masks, base_config=base_config, arch=arch, processor=processor, train=train,
        eval=evaluation, num_labels=num_labels, id2label=id2label, base_has_classifier=has_classifier,
        work_dir=work_dir, output_dir=output_dir, config=config, overwrite=overwrite, inputs=inputs,
        pad_token_id=pad_token_id, pad_token_set=pad_set,
    )


def _check_batch(train: Any, config: FinetuneConfig) -> None:
    if len(train) < config.batch_size:
        raise ValueError(
            f"the training data has {len(train)} examples, fewer than batch_size={config.batch_size}; "
            "use more data or a smaller batch"
        )


def _load_text(data: Any, config: FinetuneConfig, max_samples: int | None, what: str):
    """A causal LM's data (a spec or a ``datasets.Dataset``) -> a dataset with one ``text`` column (any
    labels are ignored: the targets are the text's next tokens)."""
    if isinstance(data, (str, os.PathLike)):
        data = resolve_dataset(str(data), text_column=config.text_column, label_column=None, max_samples=max_samples)
        return data.select_columns(["text"])
    if not isinstance(data, datasets.Dataset):
        raise TypeError(f"{what} data must be a dataset spec (str) or a datasets.Dataset, got {type(data).__name__}")
    if config.text_column not in data.column_names:
        raise ValueError(
            f"the {what} data has no column {config.text_column!r}; its columns are {data.column_names} "
            "(choose it with text_column / --text-column)"
        )
    data = data.select_columns([config.text_column])
    if config.text_column != "text":
        data = data.rename_column(config.text_column, "text")
    return data.select(range(min(max_samples, len(data)))) if max_samples else data


def _load_data(
    data: Any, config: FinetuneConfig, num_labels: int | None, max_samples: int | None, what: str, modality: str
):
    """A dataset spec (string) or a ``datasets.Dataset`` -> a dataset with ``text`` (or ``image``)
    and ``label``."""
    column, standard = (config.text_column, "text") if modality == "text" else (config.image_column, "image")
    if isinstance(data, (str, os.PathLike)):
        return resolve_dataset(
            str(data), text_column=config.text_column, label_column=config.label_column, num_labels=num_labels,
            image_column=config.image_column if modality == "image" else None, require_labels=True,
            max_samples=max_samples,
        )
    if not isinstance(data, datasets.Dataset):
        raise TypeError(f"{what} data must be a dataset spec (str) or a datasets.Dataset, got {type(data).__name__}")
    for name in (column, config.label_column):
        if name not in data.column_names:
            raise ValueError(
                f"the {what} data has no column {name!r}; its columns are {data.column_names} "
                f"(choose them with {modality}_column / label_column)"
            )
    data = data.select_columns([column, config.label_column])
    renames = {c: s for c, s in ((column, standard), (config.label_column, "label")) if c != s}
    if renames:
        data = data.rename_columns(renames)
    data = check_labels(data, num_labels=num_labels, source=f"the {what} data")
    return data.select(range(min(max_samples, len(data)))) if max_samples else data


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX; Linux ``/proc/cpuinfo``),
    where ``mixed_precision="bf16"`` trains faster than fp32; False where it cannot tell."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def make_accelerator(config: FinetuneConfig) -> tuple[Accelerator, FinetuneConfig]:
    """The Accelerator of a run (mixed precision from ``config``, ``batch_size`` as the global batch
    split over the processes) and ``config``; a batch the processes cannot split is an error."""
    if not isinstance(config, FinetuneConfig):
        raise TypeError(f"config must be a FinetuneConfig, got {type(config).__name__}")

    mixed = config.mixed_precision
    if mixed == "auto":
        if os.environ.get("ACCELERATE_MIXED_PRECISION"):
            mixed = None  # `accelerate launch --mixed_precision` / `accelerate config` decide
        elif torch.cuda.is_available():
            mixed = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            mixed = "no"
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    if world_env == 1 and mixed is not None:
        # one process that fine-tunes twice with different precisions (a notebook, the demo after a
        # test): accelerate keeps the first run's precision in a process-wide state and refuses a
        # change; nothing else of that state outlives a run here, so start it afresh
        if AcceleratorState._shared_state and AcceleratorState().mixed_precision != mixed:
            AcceleratorState._reset_state()
    # `accelerate launch --multi_gpu` on a machine without GPUs: data parallel over CPU processes (gloo)
    no_gpu = not torch.cuda.is_available() and not (hasattr(torch, "xpu") and torch.xpu.is_available())
    accelerator = Accelerator(
        cpu=no_gpu and world_env > 1,
        mixed_precision=mixed,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        # batch_size is the global batch: each process gets batch_size / num_processes rows of every
        # batch, so N processes take the same steps as one
        dataloader_config=DataLoaderConfiguration(split_batches=True, even_batches=True),
        step_scheduler_with_optimizer=True,
    )
    world = accelerator.num_processes
    if world != world_env:
        raise ValueError(
            f"launched as {world_env} processes but Accelerate set up {world} ({accelerator.distributed_type}); "
            "check the `accelerate launch` options (e.g. --multi_gpu) for this machine"
        )
    if config.batch_size % world:
        raise ValueError(
            f"batch_size={config.batch_size} is the global batch and must be a multiple of the {world} processes; "
            f"use e.g. {world * max(1, config.batch_size // world)}"
        )
    return accelerator, config
