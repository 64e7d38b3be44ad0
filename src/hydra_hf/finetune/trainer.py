"""Fine-tuning Hydra members with Accelerate, then fusing them (the paper's Appendix D.2).

Two ways to train, over the same training loop (``_Trainer``):

- :func:`finetune_members` (recommended, the paper's path): member m is the base model with the heads
  it does not keep removed from the weights — a one-member Hydra model built with
  ``convert_checkpoint(HeadMasks([kept_heads[m]]), base=...)`` — so no compute is spent on removed
  heads. Every member is trained on its own (seed ``config.seed + m``: its own data order, dropout and,
  for a bare encoder, classifier initialisation) with the embeddings frozen, so that all members still
  share them. Each trained member is exported as a stock ``BertForSequenceClassification`` folder
  (removed heads zeroed; a usable stand-alone pruned model: the "single pruned model" baseline), and
  the members are fused with the converter into one Hydra Ensemble folder.
- :func:`finetune_fused`: the fused model is trained directly, loss = mean over members of each
  member's cross-entropy. With ``mlp_fusion="per_member"`` and frozen embeddings the members share no
  trainable weight, so this is M members trained in lock-step on the same batches in one pass (see
  ``docs/finetune.md`` for where it differs from separate training).

Distributed data parallel (``accelerate launch --multi_gpu --num_processes N``; on CPU N gloo ranks):
``batch_size`` is the *global* batch; Accelerate splits every batch across the processes
(``split_batches=True``), the per-epoch order is a seeded permutation that does not depend on the
number of processes, and the last incomplete batch of an epoch is dropped, so N processes take the
same optimizer steps as one (up to dropout masks, which are drawn per process, and float summation
order). Evaluation goes through ``gather_for_metrics``, so every rank takes the same early-stopping
decision. Only the main process writes files, except Accelerate's per-process RNG states.

Checkpointing: after every epoch (and every ``save_every_steps`` optimizer steps) the member's
model, optimizer, scheduler and every process's RNG states (Python, NumPy, torch: the dropout
masks) are saved with ``accelerator.save_state`` together with ``trainer_state.json`` (epoch, batches
into the epoch, step, the epoch's partial loss sums, best metric, patience counter). ``resume=True``
continues from there -- the same epoch permutation with its consumed batches skipped, the RNG states
of that exact step -- and ends with the weights and loss history of an uninterrupted run. The data
loader draws from its own generator, never from the global one, so that iterating it does not shift
the dropout stream between a run and its resumption. A checkpoint without its RNG or trainer state
is an error unless ``resume_partial=True`` (see :func:`finetune_members`).

Work folder layout (``work_dir``, by default ``<output_dir>.work`` beside the output; it holds the
``.hydra_hf_output.json`` marker of ``hydra-hf finetune``, and ``overwrite`` empties only such a folder)::

    finetune_config.json          the FinetuneConfig of the run (a resumed run must match it)
    log.jsonl                     one JSON line per epoch and member
    member_<m>/checkpoint/        latest accelerate state + trainer_state.json (removed when done)
    member_<m>/best.safetensors   best weights so far (by validation accuracy)
    member_<m>/model/             the fine-tuned member as a stock checkpoint folder (+ masks.json)
    fused/...                     the same for finetune_fused
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import HydraInputError, HydraOutputError, HydraUnsafeError, one_line
from ..export import copy_preprocessor, save_hydra_model
from ..masks import HeadMasks
from ..modeling.hydra_layers import HydraLayerNorm, HydraSelfAttention
from ..outputs import (
    check_output,
    prepare_owned_folder,
    remove_stale_temporaries,
    write_output_file,
    write_output_folder,
)

logger = logging.getLogger(__package__)  # "hydra_hf.finetune", as log lines named it before the split

OPTIMIZERS = ("adamw", "sgd")
SCHEDULERS = ("linear", "cosine", "constant")
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
MLP_FUSIONS = ("average", "per_member")
RECIPES = ("text", "image")
COMMAND = "finetune"  # the marker command of the work and output folders
CONFIG_FILE = "finetune_config.json"
STATE_FILE = "trainer_state.json"
RNG_FILE = "random_states_{rank}.pkl"  # accelerate's per-process RNG states in a checkpoint
# FinetuneConfig fields that may change between an interrupted run and its --resume
_RESUME_FREE = ("mixed_precision", "log_every_steps", "save_every_steps", "keep_checkpoints", "eval_batch_size")


# ------------------------------------------------------------------------------------------ config
@dataclass
class FinetuneConfig:
    """Every setting of a fine-tuning run. The defaults are the paper's text recipe for BERT
    (:func:`text_recipe`); :func:`image_recipe` gives its ViT recipe. Validated when built."""

    # optimisation
    optimizer: str = field(default="adamw", metadata={"help": f"one of {list(OPTIMIZERS)}"})
    learning_rate: float = field(default=1e-5, metadata={"help": "peak learning rate"})
    weight_decay: float = field(default=0.01, metadata={"help": "decoupled weight decay (never on biases and LayerNorms)"})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    scheduler: str = field(default="linear", metadata={"help": f"decay after warm-up, one of {list(SCHEDULERS)}"})
    warmup_ratio: float = field(default=0.1, metadata={"help": "fraction of the optimizer steps spent in linear warm-up"})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "gradient clipping norm (none: off)"})
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing of the cross-entropy"})
    # schedule
    num_epochs: int = field(default=7, metadata={"help": "maximum epochs per member"})
    max_steps: int | None = field(default=None, metadata={"help": "stop a member after this many optimizer steps (none: no cap)"})
    early_stopping_patience: int | None = field(
        default=2, metadata={"help": "stop after this many evaluations without a better validation accuracy (none: off)"}
    )
    batch_size: int = field(default=32, metadata={"help": "global batch per forward step, all processes together"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "forward steps per optimizer step"})
    eval_batch_size: int = field(default=64, metadata={"help": "global evaluation batch"})
    # model and data
    max_length: int = field(default=128, metadata={"help": "maximum tokens per text"})
    freeze_embeddings: bool = field(default=True, metadata={"help": "freeze the embeddings, so that the members share them"})
    mlp_fusion: str = field(default="average", metadata={"help": f"MLP of the fused model, one of {list(MLP_FUSIONS)}"})
    num_labels: int | None = field(default=None, metadata={"help": "classes of a bare encoder (none: from the data)"})
    text_column: str = field(default="text", metadata={"help": "text column of the data (text models)"})
    image_column: str = field(default="image", metadata={"help": "image column of the data (image models)"})
    label_column: str = field(default="label", metadata={"help": "label column of the data"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training examples"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N evaluation examples"})
    # run
    seed: int = field(default=0, metadata={"help": "member m uses seed + m"})
    mixed_precision: str = field(
        default="auto", metadata={"help": f"one of {list(MIXED_PRECISION)}; auto: bf16 (else fp16) on a GPU, none on CPU"}
    )
    save_every_steps: int | None = field(
        default=None, metadata={"help": "also checkpoint every N optimizer steps (always: every epoch)"}
    )
    keep_checkpoints: bool = field(default=False, metadata={"help": "keep each member's last training checkpoint"})
    log_every_steps: int = field(default=50, metadata={"help": "update the progress bar's loss every N steps"})

    def __post_init__(self) -> None:
        def choice(name: str, options: Sequence[str]) -> None:
            if getattr(self, name) not in options:
                raise ValueError(f"{name}={getattr(self, name)!r} is unknown; use one of {list(options)}")

        def number(name: str, *, minimum: float, integer: bool = False, optional: bool = False, strict: bool = False) -> None:
            value = getattr(self, name)
            if value is None and optional:
                return
            kinds = (int,) if integer else (int, float)
            bad_type = isinstance(value, bool) or not isinstance(value, kinds)
            if bad_type:
                raise TypeError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
            if value < minimum or (strict and value == minimum):
                raise ValueError(f"{name}={value!r} must be {'>' if strict else '>='} {minimum}")

        choice("optimizer", OPTIMIZERS)
        choice("scheduler", SCHEDULERS)
        choice("mixed_precision", MIXED_PRECISION)
        choice("mlp_fusion", MLP_FUSIONS)
        number("learning_rate", minimum=0, strict=True)
        for name in ("weight_decay", "momentum", "adam_epsilon", "label_smoothing", "warmup_ratio"):
            number(name, minimum=0)
        for name in ("adam_beta1", "adam_beta2", "label_smoothing", "warmup_ratio"):
            if getattr(self, name) >= 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be < 1")
        number("max_grad_norm", minimum=0, optional=True, strict=True)
        for name in ("num_epochs", "batch_size", "gradient_accumulation_steps", "eval_batch_size", "max_length", "log_every_steps"):
            number(name, minimum=1, integer=True)
        for name in ("max_steps", "save_every_steps", "max_train_samples", "max_eval_samples"):
            number(name, minimum=1, integer=True, optional=True)
        number("early_stopping_patience", minimum=1, integer=True, optional=True)
        number("num_labels", minimum=2, integer=True, optional=True)
        number("seed", minimum=0, integer=True)

    # ------------------------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> FinetuneConfig:
        """Build from a dict; ``"recipe": "text" | "image"`` picks the preset the other keys override."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
        data = dict(data)
        recipe = data.pop("recipe", "text")
        if recipe not in RECIPES:
            raise ValueError(f"{source}: recipe {recipe!r} is unknown; use one of {list(RECIPES)}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{source}: unknown settings {unknown}; valid ones are {sorted(names)}")
        return (text_recipe if recipe == "text" else image_recipe)(**data)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **overrides: Any) -> FinetuneConfig:
        """Read a JSON or YAML file of settings (``recipe`` plus any fields); ``overrides`` win."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"fine-tuning config file {str(path)!r} does not exist")
        text = path.read_text()
        try:
            if path.suffix.lower() in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text) or {}
            else:
                data = json.loads(text)
        except Exception as exc:  # JSON/YAML syntax errors: name the file
            raise ValueError(f"fine-tuning config file {str(path)!r} could not be parsed: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"fine-tuning config file {str(path)!r} must hold a mapping of settings")
        return cls.from_dict({**data, **overrides}, source=f"fine-tuning config file {str(path)!r}")

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def text_recipe(**overrides: Any) -> FinetuneConfig:
    """The paper's text recipe (BERT): AdamW (weight decay 0.01, none on biases and LayerNorms),
    lr 1e-5, linear warm-up over 10 % of the steps then linear decay, gradient clipping 1.0, max
    length 128, up to 7 epochs with early stopping on validation accuracy (patience 2), embeddings
    frozen so that the members share them."""
    return FinetuneConfig(**overrides)


def image_recipe(**overrides: Any) -> FinetuneConfig:
    """The paper's image recipe (ViT): SGD with momentum 0.9, warm-up then cosine decay, label
    smoothing 0.1. The learning rate (0.01), no weight decay, 10 % warm-up, gradient clipping 1.0 and
    batch 64 follow the usual ViT fine-tuning practice; override them for your data."""
    values: dict[str, Any] = dict(
        optimizer="sgd", learning_rate=0.01, momentum=0.9, weight_decay=0.0, scheduler="cosine",
        warmup_ratio=0.1, label_smoothing=0.1, max_grad_norm=1.0, batch_size=64, num_epochs=7,
    )  # fmt: skip
    values.update(overrides)
    return FinetuneConfig(**values)


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


def _arch_support(arch: str) -> _ArchSupport:
    """What fine-tuning needs, from the family registry (hydra_hf.families)."""
    from ..families import get_family

    family = get_family(arch)
    if family.task not in ("text-classification", "image-classification"):
        raise HydraInputError(
            f"fine-tuning trains text and image classifiers; {family.name} is a {family.task} model (zero-shot "
            "Hydra members need no training: prune and convert them)"
        )

    def stock_model(cfg: dict[str, Any], hydra_config: Any) -> nn.Module:
        num_labels = len(cfg["id2label"]) if cfg.get("id2label") else cfg.get("num_labels")
        # the member's own architecture: a distilled DeiT's members keep both heads (WithTeacher)
        options = {"distilled": True} if getattr(hydra_config, "distilled", False) else {}
        return family.stock_model(cfg, num_labels, **options)

    return _ArchSupport(
        name=family.name,
        modality=family.modality,
        frozen_prefixes=tuple(family.frozen_prefixes),
        unfuse=family.unfuse,
        stock_model=stock_model,
        classifier_keys=tuple(family.classifier_keys),
    )


def default_recipe(model_dir: str | os.PathLike) -> FinetuneConfig:
    """The paper's recipe for this base model: :func:`image_recipe` for ViT, else :func:`text_recipe`."""
    from ..convert import detect_arch

    return image_recipe() if detect_arch(model_dir) == "vit" else text_recipe()


# ------------------------------------------------------------------------------------- the run
@dataclass
class _Run:
    """Everything a fine-tuning run checked and loaded once, before any training."""

    model_dir: Path
    masks: HeadMasks
    base_config: dict[str, Any]
    arch: _ArchSupport
    processor: Any  # the tokenizer (text) or image processor (image)
    train: Any  # datasets.Dataset with text, label
    eval: Any | None
    num_labels: int
    id2label: dict[int, str] | None
    base_has_classifier: bool
    work_dir: Path
    output_dir: Path
    config: FinetuneConfig
    overwrite: bool
    inputs: list[Path]  # what the run reads (model folder, masks file, data files): never written or deleted


def _prepare_run(
    model_dir: str | os.PathLike,
    masks: HeadMasks | str | os.PathLike,
    train_data: Any,
    eval_data: Any | None,
    output_dir: str | os.PathLike,
    config: FinetuneConfig,
    work_dir: str | os.PathLike | None,
    overwrite: bool,
    id2label: dict[int, str] | None,
) -> _Run:
    """Check every input (fail before any work, nothing written) and load data and preprocessor."""
    from transformers import AutoImageProcessor, AutoTokenizer

    from ..convert import detect_arch, read_config
    from ..convert.io import weight_names
    from ..data import parse_spec

    model_dir = Path(model_dir)
    inputs = [model_dir] if isinstance(masks, HeadMasks) else [model_dir, Path(masks)]
    for data in (train_data, eval_data):  # data files and folders (not embedded data set names)
        if isinstance(data, (str, os.PathLike)) and os.path.exists(path := parse_spec(str(data))[0]):
            inputs.append(Path(path))
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
    base_config = read_config(model_dir)
    arch = _arch_support(detect_arch(model_dir))
    masks = masks if isinstance(masks, HeadMasks) else HeadMasks.load(masks)
    from transformers import AutoConfig

    sizes = AutoConfig.for_model(**base_config)  # a data-only config object: its attribute_map knows every
    masks.check_compatible(  # family's names for the sizes (DistilBERT's n_layers / n_heads)
        sizes.num_hidden_layers, sizes.num_attention_heads, model=f"the model {str(model_dir)!r}"
    )
    weights = weight_names(model_dir)  # the family names its heads (RoBERTa's classifier.out_proj, DeiT's cls_classifier)
    has_classifier = any(key in weights for key in arch.classifier_keys)
    what, loader = ("tokenizer", AutoTokenizer) if arch.modality == "text" else ("image processor", AutoImageProcessor)
    try:
        processor = loader.from_pretrained(str(model_dir))
    except Exception as exc:  # no preprocessor files: say which folder
        raise ValueError(f"could not load a {what} from {str(model_dir)!r} ({exc}); save one with the model") from None

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
    if id2label is None and not has_classifier and isinstance(train_data, str) and train_data.startswith("rotten_tomatoes"):
        from ..data import ROTTEN_TOMATOES_LABELS

        id2label = dict(ROTTEN_TOMATOES_LABELS) if num_labels == len(ROTTEN_TOMATOES_LABELS) else None
    evaluation = None
    if eval_data is not None:
        evaluation = _load_data(eval_data, config, num_labels, config.max_eval_samples, "evaluation", arch.modality)
    if len(train) < config.batch_size:
        raise ValueError(
            f"the training data has {len(train)} examples, fewer than batch_size={config.batch_size}; "
            "use more data or a smaller batch"
        )
    return _Run(
        model_dir=model_dir, masks=masks, base_config=base_config, arch=arch, processor=processor, train=train,
        eval=evaluation, num_labels=num_labels, id2label=id2label, base_has_classifier=has_classifier,
        work_dir=work_dir, output_dir=output_dir, config=config, overwrite=overwrite, inputs=inputs,
    )  # fmt: skip


def _load_data(
    data: Any, config: FinetuneConfig, num_labels: int | None, max_samples: int | None, what: str, modality: str
):
    """A dataset spec (string) or a ``datasets.Dataset`` -> a dataset with ``text`` (or ``image``)
    and ``label``."""
    import datasets

    from ..data import check_labels, resolve_dataset

    column, standard = (config.text_column, "text") if modality == "text" else (config.image_column, "image")
    if isinstance(data, (str, os.PathLike)):
        return resolve_dataset(
            str(data), text_column=config.text_column, label_column=config.label_column, num_labels=num_labels,
            image_column=config.image_column if modality == "image" else None, require_labels=True,
            max_samples=max_samples,
        )  # fmt: skip
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


def _make_accelerator(config: FinetuneConfig):
    from accelerate import Accelerator, DataLoaderConfiguration

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
        from accelerate.state import AcceleratorState

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


def _prepare_work_dir(run: _Run, *, keep: bool) -> None:
    """Main process, before any training: claim the work folder (see :func:`outputs.prepare_owned_folder`)
    and remove what killed runs left in it and beside the output.

    ``keep`` (``--resume``, or launches sharing the folder with ``members``) continues a folder an earlier
    ``hydra-hf finetune`` created; ``run.overwrite`` empties such a folder. A non-empty folder without
    our marker (an unrelated folder, the base model, ...) is never used, let alone deleted.
    """
    prepare_owned_folder(
        run.work_dir, command=COMMAND, overwrite=run.overwrite, inputs=[*run.inputs, run.output_dir], keep=keep
    )
    remove_stale_temporaries(run.output_dir)
    for folder in sorted(run.work_dir.glob("member_*")) + [run.work_dir / "fused"]:
        if folder.is_dir() and not folder.is_symlink():
            remove_stale_temporaries(folder / "model")


def _check_work_dir(run: _Run, names: list[str], resume: bool, is_main: bool) -> None:
    """The work folder may be shared by several launches (``members=``) and by ``--resume``; starting
    a member that already has state there without ``resume`` is an error, as is a changed config."""
    saved_file = run.work_dir / CONFIG_FILE
    if saved_file.is_file():
        try:
            saved = json.loads(saved_file.read_text())
            if not isinstance(saved, dict):
                raise ValueError("not a mapping")
        except ValueError as exc:
            raise HydraInputError(
                f"{str(saved_file)!r} is damaged ({exc}); start over with --overwrite or use another --work-dir"
            ) from None
        now = run.config.to_dict()
        diff = {k: (saved.get(k), v) for k, v in now.items() if k not in _RESUME_FREE and saved.get(k) != v}
        if diff:
            raise HydraInputError(
                f"the work folder {str(run.work_dir)!r} holds a run with other settings {diff} (saved, now); "
                "use the same settings, another --work-dir, or --overwrite"
            )
    if not resume:
        started = [n for n in names if (run.work_dir / n).exists()]
        if started:
            raise HydraOutputError(
                f"the work folder {str(run.work_dir)!r} already holds {started}; pass --resume to continue that run, "
                "or --overwrite / another --work-dir to start over"
            )
    if is_main and not saved_file.is_file():
        write_output_file(saved_file, json.dumps(run.config.to_dict(), indent=2, sort_keys=True) + "\n")


def _check_resume_flags(resume: bool, resume_partial: bool, overwrite: bool) -> bool:
    """``resume`` as meant by the flags (``resume_partial`` implies it); contradictions are errors."""
    resume = bool(resume or resume_partial)
    if resume and overwrite:
        raise HydraInputError("--resume continues the run in the work folder and --overwrite starts it afresh; pass one")
    return resume


def _start(accelerator, run: _Run, names: list[str], *, resume: bool, shared: bool) -> None:
    """Claim and check the work folder on every process (the main process writes)."""
    if accelerator.is_main_process:
        _prepare_work_dir(run, keep=resume or (shared and not run.overwrite))
    accelerator.wait_for_everyone()
    _check_work_dir(run, names, resume, accelerator.is_main_process)
    accelerator.wait_for_everyone()


# ------------------------------------------------------------------------------------ training
class TrainingInterrupted(RuntimeError):
    """Raised by a ``step_callback`` to stop training (the last checkpoint stays for ``resume``)."""


def _decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters, split into those with weight decay and biases/LayerNorms without."""
    no_decay: set[int] = set()
    for module in model.modules():
        if isinstance(module, (nn.LayerNorm, HydraLayerNorm)):
            no_decay.update(id(p) for p in module.parameters(recurse=False))
    decay, plain = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (plain if id(param) in no_decay or name.endswith("bias") else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def member_cross_entropy(member_logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean over members of each member's mean cross-entropy.

    Shape: ``member_logits (B, M, C)``, ``labels (B,)``.
    """
    B, M, C = member_logits.shape
    return F.cross_entropy(
        member_logits.float().reshape(B * M, C), labels.repeat_interleave(M), label_smoothing=label_smoothing
    )


class _ImageTransform:
    """PIL image -> ``(3, H, W)`` pixel values with a Hugging Face image processor (picklable)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, image) -> torch.Tensor:
        return self.processor(image, return_tensors="pt")["pixel_values"][0]


class _EpochOrder(torch.utils.data.Sampler):
    """Example order of epoch ``epoch``: a permutation seeded by ``(seed, epoch)``, cut to whole
    batches. Set ``epoch`` before iterating."""

    def __init__(self, num_examples: int, batch_size: int, seed: int) -> None:
        self.num_examples, self.seed, self.epoch = num_examples, seed, 0
        self.length = (num_examples // batch_size) * batch_size

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_examples)[: self.length]
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.length


def _drop_key_bias_gradients(model: nn.Module) -> None:
    """Zero the gradient of every key bias (a hook on each ``qkv_bias``).

    A key bias adds ``q . b_k`` to all of a query's attention scores alike, which softmax ignores: its
    gradient is exactly zero, and what backpropagation returns is float noise. AdamW divides that noise
    by its own running magnitude and turns it into learning-rate-sized random steps, which differ with
    the summation order (one process vs several). Dropping it changes no output and makes N-process
    runs match one process on every weight.
    """
    for module in model.modules():
        if not isinstance(module, HydraSelfAttention) or module.qkv_bias.numel() == 0:
            continue
        if not module.qkv_bias.requires_grad:  # a family without biases (ModernBERT: zero buffers) or frozen
            continue
        dk = module.spec.head_dim
        keep = torch.ones(module.qkv_bias.shape, dtype=torch.bool)  # (3*K*dk,)
        start = 0
        for width in module.spec.widths:  # member-major blocks of [Q rows; K rows; V rows]
            keep[start + width * dk : start + 2 * width * dk] = False
            start += 3 * width * dk
        module.qkv_bias.register_hook(lambda grad, keep=keep: grad * keep.to(grad.device, grad.dtype))


def _best_epoch(file: Path) -> int | None:
    """The epoch recorded in a ``best*.safetensors`` file (None if unreadable)."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return int((f.metadata() or {})["best_epoch"])
    except Exception:  # noqa: BLE001 - unreadable, or written by an older version: not a usable best
        return None


def _damaged_file(folder: Path) -> Path | None:
    """The first file of an accelerate checkpoint that does not parse (safetensors header and size,
    or the zip directory and CRCs of a ``torch.save`` file); None if all do."""
    import zipfile

    from safetensors import safe_open

    for file in sorted(folder.iterdir()):
        try:
            if file.suffix == ".safetensors":
                with safe_open(str(file), framework="pt") as f:
                    list(f.keys())
            elif file.suffix in (".bin", ".pkl"):
                with zipfile.ZipFile(file) as archive:
                    if archive.testzip() is not None:
                        return file
        except Exception:  # noqa: BLE001 - any parse failure marks the file
            return file
    return None


class _Trainer:
    """Trains one Hydra model (one member or the fused M members) with early stopping and
    checkpoint/resume. The model's member-wise outputs define the loss and the metrics."""

    def __init__(self, accelerator, run: _Run, model: nn.Module, folder: Path, seed: int, tag: str) -> None:
        self.accelerator = accelerator
        self.run = run
        self.config = run.config
        self.model = model
        self.folder = folder
        self.checkpoint = folder / "checkpoint"
        self.best_file = folder / "best.safetensors"
        self.best_next = folder / "best.next.safetensors"  # a new best, committed with the next checkpoint
        self.seed = seed
        self.tag = tag
        world = accelerator.num_processes
        batches = len(run.train) // self.config.batch_size  # the last incomplete batch is dropped
        self.batches_per_epoch = batches
        self.steps_per_epoch = math.ceil(batches / self.config.gradient_accumulation_steps)
        total = self.config.num_epochs * self.steps_per_epoch
        self.total_steps = min(total, self.config.max_steps) if self.config.max_steps else total
        self.eval_batch_size = world * math.ceil(self.config.eval_batch_size / world)
        self.state: dict[str, Any] = {
            "epoch": 0, "batches_in_epoch": 0, "global_step": 0, "best_metric": None, "best_epoch": None,
            "bad_evaluations": 0, "done": False, "history": [],
            "epoch_loss": None,  # per process [sum of batch losses, batches] of the unfinished epoch
        }  # fmt: skip
        self.loss_sum = torch.zeros(2)  # this process's [sum of batch losses, batches] in this epoch

    # ------------------------------------------------------------------------------- loaders
    def _loader(self, dataset, batch_size: int):
        from ..data import make_image_loader, make_text_loader

        if self.run.arch.modality == "image":
            processor = self.run.processor
            return make_image_loader(dataset, _ImageTransform(processor), batch_size=batch_size)
        return make_text_loader(dataset, self.run.processor, batch_size=batch_size, max_length=self.config.max_length)

    def _train_loader(self):
        """The training batches, prepared once: the order of epoch e is a permutation seeded by
        (seed, e) (``_EpochOrder``), whole batches only, so it is the same for any number of
        processes and after a resume."""
        from torch.utils.data import DataLoader

        text = self._loader(self.run.train, self.config.batch_size)  # data.py's tokenizing collator
        self.order = _EpochOrder(len(self.run.train), self.config.batch_size, self.seed)
        # Its own generator: a DataLoader without one draws its base seed from the global torch RNG
        # each time it is iterated, i.e. at the start of an epoch in a run but right after the RNG
        # restore in a resumed one, which would shift every later dropout mask by one draw.
        loader = DataLoader(
            self.run.train, batch_size=self.config.batch_size, sampler=self.order,
            drop_last=True, collate_fn=text.collate_fn, generator=torch.Generator().manual_seed(self.seed),
        )  # fmt: skip
        return self.accelerator.prepare(loader)

    # ---------------------------------------------------------------------------- optimizer
    def _optimizer(self) -> torch.optim.Optimizer:
        groups = _decay_groups(self.model, self.config.weight_decay)
        c = self.config
        if c.optimizer == "sgd":
            cls, kwargs = torch.optim.SGD, dict(lr=c.learning_rate, momentum=c.momentum)
        else:
            cls, kwargs = torch.optim.AdamW, dict(lr=c.learning_rate, betas=(c.adam_beta1, c.adam_beta2), eps=c.adam_epsilon)
        # the fused kernels make one pass over the weights instead of ~10 (3-4x faster steps on CPU)
        fused = self.accelerator.device.type in ("cpu", "cuda") and self.accelerator.mixed_precision != "fp16"
        return cls(groups, fused=fused or None, **kwargs)

    def _scheduler(self, optimizer):
        from transformers import get_scheduler

        warmup = round(self.config.warmup_ratio * self.total_steps)
        name = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}[self.config.scheduler]
        return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=self.total_steps)

    # ------------------------------------------------------------------------- checkpoints
    def _save_checkpoint(self) -> None:
        """Accelerate state + trainer state into ``checkpoint/``, replacing the previous one only once
        the new one is complete (a kill while saving keeps the previous checkpoint, or the new complete
        one: :meth:`_recover` finishes the swap). A new best (``best.next``) is committed with it."""
        acc = self.accelerator
        tmp, old = self.folder / "checkpoint.tmp", self.folder / "checkpoint.old"
        per_process = acc.gather(self.loss_sum.to(acc.device).unsqueeze(0)).cpu()  # (processes, 2)
        self.state["epoch_loss"] = per_process.tolist() if self.state["batches_in_epoch"] else None
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))
        acc.wait_for_everyone()
        if acc.is_main_process:
            # written last and atomically: a checkpoint folder holding it is complete
            write_output_file(tmp / STATE_FILE, json.dumps(self.state, indent=1) + "\n")
            shutil.rmtree(old, ignore_errors=True)
            if self.checkpoint.exists():
                os.replace(self.checkpoint, old)
            os.replace(tmp, self.checkpoint)
            shutil.rmtree(old, ignore_errors=True)
            if self.best_next.is_file():
                os.replace(self.best_next, self.best_file)
        acc.wait_for_everyone()

    def _recover(self) -> None:
        """Main process: undo what a kill during :meth:`_save_checkpoint` or :meth:`_save_best` left."""
        tmp, old = self.folder / "checkpoint.tmp", self.folder / "checkpoint.old"
        if not self.checkpoint.exists():  # killed between the two renames: the newest complete one wins
            for candidate in (tmp, old):
                if (candidate / STATE_FILE).is_file():
                    os.replace(candidate, self.checkpoint)
                    break
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        self.best_next.with_name(self.best_next.name + ".tmp").unlink(missing_ok=True)
        if self.best_next.is_file():  # the best of an epoch whose checkpoint was, or was not, written
            saved = self._read_state() if (self.checkpoint / STATE_FILE).is_file() else {}
            if saved.get("best_epoch") is not None and saved.get("best_epoch") == _best_epoch(self.best_next):
                os.replace(self.best_next, self.best_file)
            else:
                self.best_next.unlink()

    def _read_state(self) -> dict[str, Any]:
        file = self.checkpoint / STATE_FILE
        try:
            state = json.loads(file.read_text())
            if not isinstance(state, dict) or not {"epoch", "batches_in_epoch", "global_step"} <= set(state):
                raise ValueError("not a trainer state")
        except (OSError, ValueError) as exc:
            raise self._damaged(file, exc) from None
        return state

    def _damaged(self, file: Path, exc: BaseException) -> HydraInputError:
        return HydraInputError(
            f"{self.tag}: the resume checkpoint file {str(file)!r} is damaged ({type(exc).__name__}: {one_line(exc)}); "
            f"delete {str(self.checkpoint)!r} and pass --resume-partial to retrain this member from its first step, "
            "or start the run over with --overwrite"
        )

    def _resume(self, partial: bool) -> None:
        """Continue from ``checkpoint/`` exactly: weights, optimizer, scheduler, trainer state and each
        process's RNG states of that step. A checkpoint without RNG states (or a member whose progress
        has no trainer state) is an error unless ``partial``; see ``docs/finetune.md``."""
        acc = self.accelerator
        if acc.is_main_process:
            self._recover()
        acc.wait_for_everyone()
        state_file = self.checkpoint / STATE_FILE
        if not state_file.is_file():
            if not (self.checkpoint.exists() or self.best_file.is_file()):
                return  # killed before its first checkpoint: nothing was saved, start from step 0
            if not partial:
                raise HydraInputError(
                    f"{self.tag}: {str(state_file)!r} is missing, so this member's progress cannot be resumed; "
                    "pass --resume-partial to retrain it from its first step, or --overwrite to start the run over"
                )
            logger.warning("%s: %s is missing; --resume-partial: retraining this member from its first step", self.tag, state_file)
            if acc.is_main_process:
                shutil.rmtree(self.checkpoint, ignore_errors=True)
                self.best_file.unlink(missing_ok=True)
                self._trim_log(finished_epochs=0)
            acc.wait_for_everyone()
            return
        state = self._read_state()
        rng_files = [self.checkpoint / RNG_FILE.format(rank=r) for r in range(acc.num_processes)]
        missing = [f.name for f in rng_files if not f.is_file()]
        if missing and not partial:
            raise HydraInputError(
                f"{self.tag}: the checkpoint {str(self.checkpoint)!r} has no {missing[0]} (random states), so the "
                "dropout masks after it would differ from the interrupted run; pass --resume-partial to go on "
                "without them (the result then differs from an uninterrupted run), or --overwrite to start over"
            )
        rng = None
        if not missing:
            from accelerate.utils import load as accelerate_load

            try:  # accelerate's load_state skips unreadable RNG states silently: read them here first
                rng = accelerate_load(rng_files[acc.process_index])
            except Exception as exc:  # noqa: BLE001 - any failure to unpickle means a damaged file
                raise self._damaged(rng_files[acc.process_index], exc) from None
        from safetensors import SafetensorError

        self._check_checkpoint_weights()
        try:
            # strict=False: accelerate's safetensors writer keeps only one of several empty tensors (a
            # layer without heads has three), so the others are absent from the file; that nothing else
            # is missing or unexpected was checked above
            acc.load_state(str(self.checkpoint), strict=False)
        except (SafetensorError, OSError, RuntimeError, ValueError, KeyError, EOFError) as exc:
            raise self._damaged(_damaged_file(self.checkpoint) or self.checkpoint, exc) from None
        if rng is not None and not torch.equal(torch.get_rng_state(), rng["torch_manual_seed"]):
            raise self._damaged(rng_files[acc.process_index], RuntimeError("the RNG state was not restored"))
        if missing:
            logger.warning(
                "%s: --resume-partial: resuming at step %d without %s; dropout masks from here on differ from an "
                "uninterrupted run", self.tag, state["global_step"], ", ".join(missing),
            )  # fmt: skip
        self.state = state
        if acc.is_main_process:
            self._trim_log(finished_epochs=state["epoch"])
            logger.info(
                "%s: resuming after epoch %d, %d batches into the next (step %d)",
                self.tag, state["epoch"], state["batches_in_epoch"], state["global_step"],
            )  # fmt: skip

    def _check_checkpoint_weights(self) -> None:
        """The checkpoint's weights are this model's: every non-empty tensor present, nothing unknown."""
        from safetensors import safe_open

        file = self.checkpoint / "model.safetensors"
        try:
            with safe_open(str(file), framework="pt") as f:
                saved = set(f.keys())
        except Exception as exc:  # noqa: BLE001 - a missing or unparsable file: damaged
            raise self._damaged(file, exc) from None
        expected = self.accelerator.unwrap_model(self.model).state_dict()
        wrong = sorted(k for k, v in expected.items() if v.numel() and k not in saved) + sorted(saved - set(expected))
        if wrong:
            raise self._damaged(file, KeyError(f"{len(wrong)} tensors missing or unexpected, e.g. {wrong[0]!r}"))

    def _trim_log(self, finished_epochs: int) -> None:
        """Drop this model's ``log.jsonl`` lines of epochs after the checkpoint (and a line a kill cut
        short): the resumed run writes them again."""
        log = self.run.work_dir / "log.jsonl"
        if not log.is_file():
            return
        kept = []
        for line in log.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("tag") == self.tag and record.get("epoch", 0) > finished_epochs:
                continue
            kept.append(line)
        write_output_file(log, "".join(x + "\n" for x in kept))

    def _resumed_loss_sum(self) -> torch.Tensor:
        """This process's loss sums of the epoch the checkpoint interrupted (as the interrupted run had them)."""
        saved = self.state.get("epoch_loss")
        acc = self.accelerator
        if not saved or not self.state["batches_in_epoch"]:
            return torch.zeros(2)
        if len(saved) == acc.num_processes:
            return torch.tensor(saved[acc.process_index], dtype=torch.float32)
        total = torch.tensor(saved, dtype=torch.float32).sum(0)  # another number of processes: one holds it all
        return total if acc.is_main_process else torch.zeros(2)

    def _save_best(self) -> None:
        """Write the current weights as the new best; :meth:`_save_checkpoint` commits them."""
        from safetensors.torch import save_file

        if self.accelerator.is_main_process:
            state = self.accelerator.unwrap_model(self.model).state_dict()
            tmp = self.best_next.with_name(self.best_next.name + ".tmp")
            save_file(
                {k: v.detach().float().cpu().contiguous() for k, v in state.items()}, str(tmp),
                metadata={"best_epoch": str(self.state["best_epoch"])},
            )  # fmt: skip
            os.replace(tmp, self.best_next)
        self.accelerator.wait_for_everyone()

    # ---------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, loader) -> dict[str, Any]:
        """Ensemble and per-member accuracy and the ensemble NLL over the whole evaluation set."""
        self.model.eval()
        all_logits, all_labels = [], []
        for batch in loader:
            labels = batch.pop("labels")
            with self.accelerator.autocast():
                member_logits = self.model(**batch).member_logits  # (b, M, C)
            member_logits, labels = self.accelerator.gather_for_metrics((member_logits.float(), labels))
            all_logits.append(member_logits.cpu())
            all_labels.append(labels.cpu())
        self.model.train()
        member_logits, labels = torch.cat(all_logits), torch.cat(all_labels)  # (N, M, C), (N,)
        log_probs = torch.logsumexp(F.log_softmax(member_logits, -1), dim=1) - math.log(member_logits.shape[1])  # (N, C)
        member_acc = (member_logits.argmax(-1) == labels[:, None]).float().mean(0)  # (M,)
        return {
            "accuracy": float((log_probs.argmax(-1) == labels).float().mean()),
            "member_accuracy": [round(float(a), 6) for a in member_acc],
            "nll": float(F.nll_loss(log_probs, labels)),
            "examples": int(labels.numel()),
        }

    # ------------------------------------------------------------------------------- train
    def train(
        self, resume: bool, step_callback: Callable[[dict[str, Any]], None] | None, resume_partial: bool = False
    ) -> dict[str, Any]:
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        acc, c = self.accelerator, self.config
        for name, param in self.model.named_parameters():
            if c.freeze_embeddings and name.startswith(self.run.arch.frozen_prefixes):
                param.requires_grad_(False)
            elif param.numel() == 0:
                # A layer where the model keeps no head has empty Q/K/V/O projections (0 rows) that the
                # forward pass skips. They hold nothing to train, and DDP would wait for their gradients
                # forever ("Parameter indices which did not receive grad"): not trainable, at no cost.
                param.requires_grad_(False)
        _drop_key_bias_gradients(self.model)
        optimizer = self._optimizer()
        scheduler = self._scheduler(optimizer)
        self.model, optimizer, scheduler = acc.prepare(self.model, optimizer, scheduler)
        eval_loader = acc.prepare(self._loader(self.run.eval, self.eval_batch_size)) if self.run.eval is not None else None
        if resume:
            self._resume(resume_partial)
        if acc.is_main_process:
            self.folder.mkdir(parents=True, exist_ok=True)
        s = self.state
        progress = tqdm(
            total=self.total_steps, initial=s["global_step"], desc=self.tag, disable=not acc.is_local_main_process,
            dynamic_ncols=True,
        )  # fmt: skip
        train_loader = self._train_loader()
        self.model.train()
        with logging_redirect_tqdm():  # epoch log lines go above the progress bar
            while not s["done"]:
                self.order.epoch = s["epoch"]
                skip = s["batches_in_epoch"]
                loader = acc.skip_first_batches(train_loader, skip) if skip else train_loader
                # (sum of batch losses, batches) of this process in this epoch, as far as the checkpoint got
                self.loss_sum = (self._resumed_loss_sum() if skip else torch.zeros(2)).to(acc.device)
                hit_max = False
                for batch in loader:
                    labels = batch.pop("labels")
                    with acc.accumulate(self.model):
                        with acc.autocast():
                            member_logits = self.model(**batch).member_logits  # (b, M, C)
                        loss = member_cross_entropy(member_logits, labels, c.label_smoothing)
                        acc.backward(loss)
                        if acc.sync_gradients and c.max_grad_norm is not None:
                            acc.clip_grad_norm_(self.model.parameters(), c.max_grad_norm)
                        optimizer.step()
                        scheduler.step()
                        optimizer.zero_grad()
                    s["batches_in_epoch"] += 1
                    self.loss_sum += torch.stack([loss.detach().float(), torch.ones((), device=acc.device)])
                    if not acc.sync_gradients:
                        continue
                    s["global_step"] += 1
                    progress.update(1)
                    if s["global_step"] % c.log_every_steps == 0:
                        mean = float(self.loss_sum[0] / self.loss_sum[1])
                        progress.set_postfix(loss=f"{mean:.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                    hit_max = c.max_steps is not None and s["global_step"] >= c.max_steps
                    mid_epoch = s["batches_in_epoch"] < self.batches_per_epoch  # an epoch end saves anyway
                    if c.save_every_steps and s["global_step"] % c.save_every_steps == 0 and mid_epoch and not hit_max:
                        self._save_checkpoint()
                    if step_callback is not None:
                        step_callback({"tag": self.tag, "epoch": s["epoch"], "step": s["global_step"], "loss": float(loss.detach())})
                    if hit_max:
                        break
                self._end_epoch(eval_loader, hit_max)
        progress.close()
        return s

    def _end_epoch(self, eval_loader, hit_max: bool) -> None:
        acc, c, s = self.accelerator, self.config, self.state
        total = acc.gather(self.loss_sum.unsqueeze(0)).sum(0)  # over processes
        self.loss_sum = torch.zeros(2, device=acc.device)
        record: dict[str, Any] = {
            "tag": self.tag, "epoch": s["epoch"] + 1, "step": s["global_step"],
            "train_loss": round(float(total[0] / total[1]), 6) if total[1] > 0 else None,
        }  # fmt: skip
        if eval_loader is not None:
            metrics = self.evaluate(eval_loader)
            record.update({f"eval_{k}": v for k, v in metrics.items()})
            if s["best_metric"] is None or metrics["accuracy"] > s["best_metric"]:
                s["best_metric"], s["best_epoch"], s["bad_evaluations"] = metrics["accuracy"], s["epoch"] + 1, 0
                self._save_best()
            else:
                s["bad_evaluations"] += 1
        s["history"].append(record)
        s["epoch"] += 1
        s["batches_in_epoch"] = 0
        stop = c.early_stopping_patience is not None and eval_loader is not None and s["bad_evaluations"] >= c.early_stopping_patience
        s["done"] = bool(hit_max or stop or s["epoch"] >= c.num_epochs)
        if acc.is_main_process:
            line = f"{self.tag} epoch {record['epoch']}/{c.num_epochs} step {record['step']}: train loss {record['train_loss']}"
            if "eval_accuracy" in record:
                line += f", eval accuracy {record['eval_accuracy']:.4f} (best {s['best_metric']:.4f} at epoch {s['best_epoch']})"
            if stop:
                line += f"; early stop ({s['bad_evaluations']} evaluations without improvement)"
            logger.info(line)
            with open(self.run.work_dir / "log.jsonl", "a") as f:  # a resume drops lines after its checkpoint
                f.write(json.dumps(record) + "\n")
        self._save_checkpoint()

    def final_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights to export: the best evaluated ones, or the last ones without evaluation data."""
        from safetensors.torch import load_file

        if self.best_file.is_file():
            return load_file(str(self.best_file))
        return {k: v.detach().float().cpu() for k, v in self.accelerator.unwrap_model(self.model).state_dict().items()}


# --------------------------------------------------------------------------------- model building
def _build_hydra(run: _Run, masks: HeadMasks, mlp_fusion: str, seed: int) -> nn.Module:
    """A Hydra model of ``masks``' members from the base checkpoint (a bare encoder gets new
    per-member classifiers, initialised from ``seed``)."""
    from ..convert import convert_checkpoint

    model = convert_checkpoint(
        masks, base=run.model_dir, mlp_fusion=mlp_fusion, num_labels=run.num_labels, id2label=run.id2label, seed=seed
    )
    model.config.problem_type = "single_label_classification"
    return model


def _export_member(run: _Run, model: nn.Module, state: dict[str, torch.Tensor], folder: Path, member_masks: HeadMasks, info: dict) -> None:
    """Write a trained one-member Hydra model as a stock checkpoint folder (removed heads zeroed)."""
    stock_state = run.arch.unfuse(state, model.config)[0]
    cfg = {k: v for k, v in run.base_config.items() if k not in ("id2label", "label2id", "num_labels", "architectures")}
    cfg.update(id2label={int(k): v for k, v in model.config.id2label.items()}, problem_type="single_label_classification")
    stock = run.arch.stock_model(cfg, model.config)
    stock.load_state_dict(stock_state, strict=True)

    def write(tmp: Path) -> None:
        stock.save_pretrained(str(tmp), safe_serialization=True)
        copy_preprocessor(run.model_dir, tmp)
        member_masks.save(tmp / "masks.json")
        (tmp / "finetune_member.json").write_text(json.dumps(info, indent=1) + "\n")

    # the same locked, atomic, marked writer as every output (its .model.tmp-PID-* leftovers of a
    # killed run are removed on the next run)
    write_output_folder(folder, write, command=COMMAND, overwrite=True, inputs=run.inputs)


def _summary_writer(summary: dict[str, Any]) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        (tmp / "finetune_summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    return write


def finetune_members(
    model_dir: str | os.PathLike,
    masks: HeadMasks | str | os.PathLike,
    train_data: Any,
    eval_data: Any | None = None,
    output_dir: str | os.PathLike = "hydra-finetuned",
    config: FinetuneConfig | None = None,
    *,
    members: Sequence[int] | None = None,
    work_dir: str | os.PathLike | None = None,
    resume: bool = False,
    resume_partial: bool = False,
    overwrite: bool = False,
    id2label: dict[int, str] | None = None,
    step_callback: Callable[[dict[str, Any]], None] | None = None,
    fuse: bool = True,
) -> Path | None:
    """Fine-tune every member (the base with that member's heads removed) on its own, then fuse.

    Run it in one process, or under ``accelerate launch`` (data parallel: every member is trained
    by all processes in turn). Only the main process writes files.

    Args:
        model_dir: the base checkpoint folder (a classifier of a registered family, whose trained head every
            member keeps, or a bare encoder: every member then gets a new classifier, initialised with its
            own seed).
        masks: the masks file (or ``HeadMasks``) for this base model.
        train_data, eval_data: dataset specs (``rotten_tomatoes:train``, a csv/jsonl/parquet file, a
            ``save_to_disk`` folder) or ``datasets.Dataset`` objects with the configured text and
            label columns. Without ``eval_data`` there is no early stopping and the last weights are kept.
        output_dir: the fused Hydra Ensemble folder, written atomically once every member is trained.
        config: the settings (default: the paper's recipe for the base, :func:`default_recipe`).
        members: train only these members (e.g. one launch per GPU, sharing ``work_dir``); the fused
            folder is written by the launch that finds every member trained.
        work_dir: checkpoints, logs and the per-member stock folders (default ``<output_dir>.work``).
        resume: continue the members' last checkpoints in ``work_dir`` (finished members are skipped),
            exactly: the result equals an uninterrupted run's.
        resume_partial: implies ``resume``; also go on (with a warning) when a member's checkpoint has
            no RNG states (it resumes, but dropout differs from an uninterrupted run) or no trainer state
            (that member is retrained from its first step). Without it both are errors.
        overwrite: replace ``output_dir`` and empty ``work_dir``, but only folders an earlier
            ``hydra-hf finetune`` wrote (they hold its ``.hydra_hf_output.json`` marker); any other
            non-empty folder is an error and is never deleted.
        id2label: class names for a bare encoder (the checkpoint's own labels win otherwise).
        step_callback: called after every optimizer step with ``{"tag", "epoch", "step", "loss"}``;
            raising :class:`TrainingInterrupted` there stops the run (resume later).
        fuse: ``False`` trains and exports the members (``work_dir/member_<m>/model``) but never writes
            ``output_dir``: models that are used as separate models, such as the members of a Deep
            Ensemble (:func:`hydra_hf.baselines.train_deep_ensemble`).

    Returns:
        ``output_dir``, or ``None`` when other members remain to be trained or ``fuse`` is ``False``.
    """
    resume = _check_resume_flags(resume, resume_partial, overwrite)
    accelerator, config = _make_accelerator(config or default_recipe(model_dir))
    with accelerator.main_process_first():  # the main process fills the datasets cache first
        run = _prepare_run(model_dir, masks, train_data, eval_data, output_dir, config, work_dir, overwrite, id2label)
    M = run.masks.num_members
    chosen = list(range(M)) if members is None else sorted(set(members))
    bad = [m for m in chosen if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < M]
    if bad:
        raise HydraInputError(f"members {bad} are not members of the masks file (0..{M - 1})")
    _start(accelerator, run, [f"member_{m}" for m in chosen], resume=resume, shared=members is not None)

    for m in chosen:
        folder = run.work_dir / f"member_{m}"
        if (folder / "model" / "config.json").is_file():
            if accelerator.is_main_process:
                logger.info("member %d: already fine-tuned in %s", m, folder / "model")
            continue
        seed = run.config.seed + m
        member_masks = HeadMasks(
            kept_heads=[run.masks.kept_heads[m]], num_heads=run.masks.num_heads,
            member_metadata=[dict(run.masks.member_metadata[m])], metadata=dict(run.masks.metadata),
        )  # fmt: skip
        model = _build_hydra(run, member_masks, "average", seed)  # one member: a structurally pruned model
        from accelerate.utils import set_seed

        set_seed(seed)
        trainer = _Trainer(accelerator, run, model, folder, seed, tag=f"member {m}")
        state = trainer.train(resume, step_callback, resume_partial)
        if accelerator.is_main_process:
            info = {
                "member": m, "seed": seed, "epochs": state["epoch"], "steps": state["global_step"],
                "best_eval_accuracy": state["best_metric"], "best_epoch": state["best_epoch"], "history": state["history"],
            }  # fmt: skip
            _export_member(run, model, trainer.final_state_dict(), folder / "model", member_masks, info)
            if not run.config.keep_checkpoints:
                shutil.rmtree(folder / "checkpoint", ignore_errors=True)
        accelerator.wait_for_everyone()
        accelerator.free_memory()
        del trainer, model

    if not fuse:
        return None
    missing = [m for m in range(M) if not (run.work_dir / f"member_{m}" / "model" / "config.json").is_file()]
    if missing:
        if accelerator.is_main_process:
            logger.info("members %s are not fine-tuned yet; the fused model is written once they are", missing)
        return None
    if accelerator.is_main_process:
        _fuse_members(run)
    accelerator.wait_for_everyone()
    return run.output_dir


def _fuse_members(run: _Run) -> None:
    from ..convert import convert_checkpoint

    folders = [run.work_dir / f"member_{m}" / "model" for m in range(run.masks.num_members)]
    infos = [json.loads((f / "finetune_member.json").read_text()) for f in folders]
    masks = HeadMasks(
        kept_heads=run.masks.kept_heads, num_heads=run.masks.num_heads, metadata=dict(run.masks.metadata),
        member_metadata=[
            {**meta, "finetune": {k: info[k] for k in ("seed", "epochs", "steps", "best_eval_accuracy", "best_epoch")}}
            for meta, info in zip(run.masks.member_metadata, infos)
        ],
    )  # fmt: skip
    shared = "error" if run.config.freeze_embeddings else "average"
    if shared == "average":
        logger.warning("embeddings were fine-tuned per member: the fused model averages them (freeze_embeddings avoids this)")
    model = convert_checkpoint(masks, members=folders, mlp_fusion=run.config.mlp_fusion, shared=shared)
    summary = {"mode": "members", "config": run.config.to_dict(), "members": infos}
    save_hydra_model(
        model, run.output_dir, preprocessor_from=folders[0], overwrite=run.overwrite, extra=_summary_writer(summary),
        command=COMMAND, inputs=[*run.inputs, run.work_dir],
    )  # fmt: skip
    logger.info("wrote the fused model of %d fine-tuned members to %s", len(folders), run.output_dir)


def finetune_fused(
    model_dir: str | os.PathLike,
    masks: HeadMasks | str | os.PathLike,
    train_data: Any,
    eval_data: Any | None = None,
    output_dir: str | os.PathLike = "hydra-finetuned",
    config: FinetuneConfig | None = None,
    *,
    work_dir: str | os.PathLike | None = None,
    resume: bool = False,
    resume_partial: bool = False,
    overwrite: bool = False,
    id2label: dict[int, str] | None = None,
    step_callback: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Fuse first, then train the Hydra model as one (loss = mean member cross-entropy).

    All members see the same batches (seed ``config.seed``) and stop together, on the ensemble's
    validation accuracy. ``config.mlp_fusion`` is the fused MLP being trained: ``"per_member"`` keeps
    the members independent; ``"average"`` trains one MLP shared by all members. Arguments as in
    :func:`finetune_members`.

    Returns:
        ``output_dir``.
    """
    resume = _check_resume_flags(resume, resume_partial, overwrite)
    accelerator, config = _make_accelerator(config or default_recipe(model_dir))
    with accelerator.main_process_first():
        run = _prepare_run(model_dir, masks, train_data, eval_data, output_dir, config, work_dir, overwrite, id2label)
    _start(accelerator, run, ["fused"], resume=resume, shared=False)
    from accelerate.utils import set_seed

    model = _build_hydra(run, run.masks, run.config.mlp_fusion, run.config.seed)
    set_seed(run.config.seed)
    folder = run.work_dir / "fused"
    trainer = _Trainer(accelerator, run, model, folder, run.config.seed, tag="fused")
    state = trainer.train(resume, step_callback, resume_partial)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        model.load_state_dict(trainer.final_state_dict(), strict=True)
        summary = {
            "mode": "fused", "config": run.config.to_dict(), "epochs": state["epoch"], "steps": state["global_step"],
            "best_eval_accuracy": state["best_metric"], "best_epoch": state["best_epoch"], "history": state["history"],
        }  # fmt: skip
        save_hydra_model(
            model.eval(), run.output_dir, preprocessor_from=run.model_dir, overwrite=run.overwrite,
            extra=_summary_writer(summary), command=COMMAND, inputs=[*run.inputs, run.work_dir],
        )  # fmt: skip
        if not run.config.keep_checkpoints:
            shutil.rmtree(folder / "checkpoint", ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    return run.output_dir
