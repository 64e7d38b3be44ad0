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
model, optimizer, scheduler and RNG states are saved with ``accelerator.save_state`` together with
``trainer_state.json`` (epoch, step, best metric, patience counter); ``resume=True`` continues from
there and ends with the weights an uninterrupted run gives.

Work folder layout (``work_dir``, by default ``<output_dir>.work`` beside the output)::

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

from .export import atomic_folder, check_output_dir, copy_preprocessor, save_hydra_model
from .masks import HeadMasks
from .modeling.hydra_layers import HydraLayerNorm

logger = logging.getLogger(__name__)

OPTIMIZERS = ("adamw", "sgd")
SCHEDULERS = ("linear", "cosine", "constant")
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
MLP_FUSIONS = ("average", "per_member")
RECIPES = ("text", "image")
CONFIG_FILE = "finetune_config.json"
STATE_FILE = "trainer_state.json"
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
    stock_model: Callable[[dict[str, Any]], nn.Module]  # config dict -> stock task model


def _arch_support(arch: str) -> _ArchSupport:
    if arch == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        from .convert import unfuse_bert

        return _ArchSupport(
            name="bert",
            modality="text",
            frozen_prefixes=("hydra.embeddings.",),  # word, position and token-type embeddings + their LayerNorm
            unfuse=unfuse_bert,
            stock_model=lambda cfg: BertForSequenceClassification(BertConfig.from_dict(cfg)),
        )
    if arch == "vit":
        from transformers import ViTConfig, ViTForImageClassification

        from .convert.hf_vit import unfuse_vit

        return _ArchSupport(
            name="vit",
            modality="image",
            frozen_prefixes=("hydra.embeddings.",),  # patch projection, CLS token, position embeddings
            unfuse=lambda state, config: unfuse_vit(state, config, names="module"),
            stock_model=lambda cfg: ViTForImageClassification(ViTConfig.from_dict(cfg)),
        )
    raise ValueError(
        f"fine-tuning supports Hugging Face BERT-family text classifiers and ViT image classifiers, not base "
        f"architecture {arch!r}; convert a timm ViT to a Hugging Face ViT folder first, or fine-tune with the fused "
        "model's own training loop"
    )


def default_recipe(model_dir: str | os.PathLike) -> FinetuneConfig:
    """The paper's recipe for this base model: :func:`image_recipe` for ViT, else :func:`text_recipe`."""
    from .convert import detect_arch

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


def _weight_names(folder: Path) -> set[str]:
    """Tensor names of a checkpoint folder, without loading the tensors when it is safetensors."""
    from safetensors import safe_open

    from .convert import read_state_dict

    file = folder / "model.safetensors"
    if file.is_file():
        with safe_open(str(file), framework="pt") as f:
            return set(f.keys())
    return set(read_state_dict(folder))


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

    from .convert import detect_arch, read_config

    output_dir = check_output_dir(output_dir, overwrite)
    work_dir = Path(work_dir) if work_dir is not None else output_dir.with_name(output_dir.name + ".work")
    if work_dir.resolve() == output_dir.resolve() or output_dir.resolve() in work_dir.resolve().parents:
        raise ValueError(f"work_dir {str(work_dir)!r} must not be the output folder or inside it; choose another")
    model_dir = Path(model_dir)
    base_config = read_config(model_dir)
    arch = _arch_support(detect_arch(model_dir))
    masks = masks if isinstance(masks, HeadMasks) else HeadMasks.load(masks)
    masks.check_compatible(
        base_config["num_hidden_layers"], base_config["num_attention_heads"], model=f"the model {str(model_dir)!r}"
    )
    has_classifier = "classifier.weight" in _weight_names(model_dir)
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
        from .data import ROTTEN_TOMATOES_LABELS

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
        work_dir=work_dir, output_dir=output_dir, config=config, overwrite=overwrite,
    )  # fmt: skip


def _load_data(
    data: Any, config: FinetuneConfig, num_labels: int | None, max_samples: int | None, what: str, modality: str
):
    """A dataset spec (string) or a ``datasets.Dataset`` -> a dataset with ``text`` (or ``image``)
    and ``label``."""
    import datasets

    from .data import check_labels, resolve_dataset

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


def _check_work_dir(run: _Run, names: list[str], resume: bool, is_main: bool) -> None:
    """The work folder may be shared by several launches (``members=``) and by ``--resume``; starting
    a member that already has state there without ``resume`` is an error, as is a changed config."""
    saved_file = run.work_dir / CONFIG_FILE
    if saved_file.is_file():
        saved = json.loads(saved_file.read_text())
        now = run.config.to_dict()
        diff = {k: (saved.get(k), v) for k, v in now.items() if k not in _RESUME_FREE and saved.get(k) != v}
        if diff:
            raise ValueError(
                f"the work folder {str(run.work_dir)!r} holds a run with other settings {diff} (saved, now); "
                "use the same settings, another --work-dir, or --overwrite"
            )
    if not resume:
        started = [n for n in names if (run.work_dir / n).exists()]
        if started:
            raise FileExistsError(
                f"the work folder {str(run.work_dir)!r} already holds {started}; pass --resume to continue that run, "
                "or --overwrite / another --work-dir to start over"
            )
    if is_main:
        run.work_dir.mkdir(parents=True, exist_ok=True)
        if not saved_file.is_file():
            run.config.save(saved_file)


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
        }  # fmt: skip

    # ------------------------------------------------------------------------------- loaders
    def _loader(self, dataset, batch_size: int):
        from .data import make_image_loader, make_text_loader

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
        loader = DataLoader(
            self.run.train, batch_size=self.config.batch_size, sampler=self.order,
            drop_last=True, collate_fn=text.collate_fn,
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
        the new one is complete (an interruption while saving keeps the previous checkpoint)."""
        acc = self.accelerator
        tmp = self.folder / "checkpoint.tmp"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))
        acc.wait_for_everyone()
        if acc.is_main_process:
            (tmp / STATE_FILE).write_text(json.dumps(self.state, indent=1) + "\n")
            old = self.folder / "checkpoint.old"
            shutil.rmtree(old, ignore_errors=True)
            if self.checkpoint.exists():
                os.replace(self.checkpoint, old)
            os.replace(tmp, self.checkpoint)
            shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()

    def _load_checkpoint(self) -> bool:
        if not (self.checkpoint / STATE_FILE).is_file():
            return False
        self.accelerator.load_state(str(self.checkpoint))
        self.state = json.loads((self.checkpoint / STATE_FILE).read_text())
        if self.accelerator.is_main_process:
            logger.info(
                "%s: resuming after epoch %d, %d batches into the next (step %d)",
                self.tag, self.state["epoch"], self.state["batches_in_epoch"], self.state["global_step"],
            )
        return True

    def _save_best(self) -> None:
        from safetensors.torch import save_file

        if self.accelerator.is_main_process:
            state = self.accelerator.unwrap_model(self.model).state_dict()
            tmp = self.best_file.with_name(self.best_file.name + ".tmp")
            save_file({k: v.detach().float().cpu().contiguous() for k, v in state.items()}, str(tmp))
            os.replace(tmp, self.best_file)
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
    def train(self, resume: bool, step_callback: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        acc, c = self.accelerator, self.config
        for name, param in self.model.named_parameters():
            if c.freeze_embeddings and name.startswith(self.run.arch.frozen_prefixes):
                param.requires_grad_(False)
        optimizer = self._optimizer()
        scheduler = self._scheduler(optimizer)
        self.model, optimizer, scheduler = acc.prepare(self.model, optimizer, scheduler)
        eval_loader = acc.prepare(self._loader(self.run.eval, self.eval_batch_size)) if self.run.eval is not None else None
        if resume:
            self._load_checkpoint()
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
                loss_sum = torch.zeros(2, device=acc.device)  # (sum of batch losses, batches) this process
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
                    loss_sum += torch.stack([loss.detach().float(), torch.ones((), device=acc.device)])
                    if not acc.sync_gradients:
                        continue
                    s["global_step"] += 1
                    progress.update(1)
                    if s["global_step"] % c.log_every_steps == 0:
                        progress.set_postfix(loss=f"{float(loss_sum[0] / loss_sum[1]):.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
                    hit_max = c.max_steps is not None and s["global_step"] >= c.max_steps
                    mid_epoch = s["batches_in_epoch"] < self.batches_per_epoch  # an epoch end saves anyway
                    if c.save_every_steps and s["global_step"] % c.save_every_steps == 0 and mid_epoch and not hit_max:
                        self._save_checkpoint()
                    if step_callback is not None:
                        step_callback({"tag": self.tag, "epoch": s["epoch"], "step": s["global_step"], "loss": float(loss.detach())})
                    if hit_max:
                        break
                self._end_epoch(eval_loader, loss_sum, hit_max)
        progress.close()
        return s

    def _end_epoch(self, eval_loader, loss_sum: torch.Tensor, hit_max: bool) -> None:
        acc, c, s = self.accelerator, self.config, self.state
        total = acc.gather(loss_sum.unsqueeze(0)).sum(0)  # over processes
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
            with open(self.run.work_dir / "log.jsonl", "a") as f:
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
    from .convert import convert_checkpoint

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
    stock = run.arch.stock_model(cfg)
    stock.load_state_dict(stock_state, strict=True)

    def write(tmp: Path) -> None:
        stock.save_pretrained(str(tmp), safe_serialization=True)
        copy_preprocessor(run.model_dir, tmp)
        member_masks.save(tmp / "masks.json")
        (tmp / "finetune_member.json").write_text(json.dumps(info, indent=1) + "\n")

    atomic_folder(folder, write, overwrite=True)


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
    overwrite: bool = False,
    id2label: dict[int, str] | None = None,
    step_callback: Callable[[dict[str, Any]], None] | None = None,
) -> Path | None:
    """Fine-tune every member (the base with that member's heads removed) on its own, then fuse.

    Run it in one process, or under ``accelerate launch`` (data parallel: every member is trained
    by all processes in turn). Only the main process writes files.

    Args:
        model_dir: the base checkpoint folder (a BERT classifier, or a bare encoder: every member then
            gets a new classifier, initialised with its own seed).
        masks: the masks file (or ``HeadMasks``) for this base model.
        train_data, eval_data: dataset specs (``rotten_tomatoes:train``, a csv/jsonl/parquet file, a
            ``save_to_disk`` folder) or ``datasets.Dataset`` objects with the configured text and
            label columns. Without ``eval_data`` there is no early stopping and the last weights are kept.
        output_dir: the fused Hydra Ensemble folder, written atomically once every member is trained.
        config: the settings (default: the paper's recipe for the base, :func:`default_recipe`).
        members: train only these members (e.g. one launch per GPU, sharing ``work_dir``); the fused
            folder is written by the launch that finds every member trained.
        work_dir: checkpoints, logs and the per-member stock folders (default ``<output_dir>.work``).
        resume: continue the members' last checkpoints in ``work_dir`` (finished members are skipped).
        overwrite: replace an existing ``output_dir`` and start ``work_dir`` afresh.
        id2label: class names for a bare encoder (the checkpoint's own labels win otherwise).
        step_callback: called after every optimizer step with ``{"tag", "epoch", "step", "loss"}``;
            raising :class:`TrainingInterrupted` there stops the run (resume later).

    Returns:
        ``output_dir``, or ``None`` when other members remain to be trained.
    """
    accelerator, config = _make_accelerator(config or default_recipe(model_dir))
    with accelerator.main_process_first():  # the main process fills the datasets cache first
        run = _prepare_run(model_dir, masks, train_data, eval_data, output_dir, config, work_dir, overwrite, id2label)
    M = run.masks.num_members
    chosen = list(range(M)) if members is None else sorted(set(members))
    bad = [m for m in chosen if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < M]
    if bad:
        raise ValueError(f"members {bad} are not members of the masks file (0..{M - 1})")
    if overwrite and accelerator.is_main_process and run.work_dir.exists():
        shutil.rmtree(run.work_dir)
    accelerator.wait_for_everyone()
    _check_work_dir(run, [f"member_{m}" for m in chosen], resume, accelerator.is_main_process)
    accelerator.wait_for_everyone()

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
        state = trainer.train(resume, step_callback)
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
    from .convert import convert_checkpoint

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
    save_hydra_model(model, run.output_dir, preprocessor_from=folders[0], overwrite=run.overwrite, extra=_summary_writer(summary))
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
    accelerator, config = _make_accelerator(config or default_recipe(model_dir))
    with accelerator.main_process_first():
        run = _prepare_run(model_dir, masks, train_data, eval_data, output_dir, config, work_dir, overwrite, id2label)
    if overwrite and accelerator.is_main_process and run.work_dir.exists():
        shutil.rmtree(run.work_dir)
    accelerator.wait_for_everyone()
    _check_work_dir(run, ["fused"], resume, accelerator.is_main_process)
    accelerator.wait_for_everyone()
    from accelerate.utils import set_seed

    model = _build_hydra(run, run.masks, run.config.mlp_fusion, run.config.seed)
    set_seed(run.config.seed)
    folder = run.work_dir / "fused"
    trainer = _Trainer(accelerator, run, model, folder, run.config.seed, tag="fused")
    state = trainer.train(resume, step_callback)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        model.load_state_dict(trainer.final_state_dict(), strict=True)
        summary = {
            "mode": "fused", "config": run.config.to_dict(), "epochs": state["epoch"], "steps": state["global_step"],
            "best_eval_accuracy": state["best_metric"], "best_epoch": state["best_epoch"], "history": state["history"],
        }  # fmt: skip
        save_hydra_model(model.eval(), run.output_dir, preprocessor_from=run.model_dir, overwrite=run.overwrite, extra=_summary_writer(summary))
        if not run.config.keep_checkpoints:
            shutil.rmtree(folder / "checkpoint", ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.free_memory()
    return run.output_dir
