"""The settings of a fine-tuning run: :class:`FinetuneConfig` (validated when built), the paper's two
recipes, :func:`text_recipe` (BERT) and :func:`image_recipe` (ViT), and the registry of named recipes
(:data:`RECIPES`: the paper's per task, the demo's Single and members) that ``hydra-hf finetune --recipe``
and ``"recipe"`` in a ``--config`` file read."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from ..assemble import detect_arch
from ..reproducibility import describe_machine

OPTIMIZERS = ("adamw", "sgd")
SCHEDULERS = ("linear", "cosine", "constant")
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
MLP_FUSIONS = ("average", "per_member")
COMMAND = "finetune"  # the marker command of the work and output folders
# FinetuneConfig fields that may change between an interrupted run and its --resume
RESUME_FREE = ("mixed_precision", "log_every_steps", "save_every_steps", "keep_checkpoints", "eval_batch_size")


@dataclass
class FinetuneConfig:
    """Every setting of a fine-tuning run. The defaults are the paper's text recipe for BERT
    (:func:`text_recipe`); :func:`image_recipe` gives its ViT recipe. Validated when built."""

    # optimisation
    optimizer: str = field(default="adamw", metadata={"help": f"one of {list(OPTIMIZERS)}"})
    learning_rate: float = field(default=1e-5, metadata={"help": "peak learning rate"})
    weight_decay: float = field(
        default=0.01, metadata={"help": "decoupled weight decay (never on biases and LayerNorms)"}
    )
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    scheduler: str = field(default="linear", metadata={"help": f"decay after warm-up, one of {list(SCHEDULERS)}"})
    warmup_ratio: float = field(
        default=0.1, metadata={"help": "fraction of the optimizer steps spent in linear warm-up"}
    )
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "gradient clipping norm (none: off)"})
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing of the cross-entropy"})
    # schedule
    num_epochs: int = field(default=7, metadata={"help": "maximum epochs per member"})
    max_steps: int | None = field(
        default=None, metadata={"help": "stop a member after this many optimizer steps (none: no cap)"}
    )
    early_stopping_patience: int | None = field(
        default=2,
        metadata={"help": "stop after this many evaluations without a better validation accuracy (none: off)"},
    )
    batch_size: int = field(default=32, metadata={"help": "global batch per forward step, all processes together"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "forward steps per optimizer step"})
    eval_batch_size: int = field(default=64, metadata={"help": "global evaluation batch"})
    # model and data
    max_length: int = field(default=128, metadata={"help": "maximum tokens per text"})
    freeze_embeddings: bool = field(
        default=True, metadata={"help": "freeze the embeddings, so that the members share them"}
    )
    mlp_fusion: str = field(
        default="average", metadata={"help": f"MLP of the fused model, one of {list(MLP_FUSIONS)}"}
    )
    member_perturb: float = field(
        default=0.0,
        metadata={"help": "shrink and perturb each member before training (Ash & Adams 2020; not in the paper): every "
                          "weight outside the shared embeddings becomes (1 - a) * weight + a * a fresh random "
                          "initialisation drawn with the member's seed; 0: the paper's recipe, 1: from scratch"},
    )
    num_labels: int | None = field(default=None, metadata={"help": "classes of a bare encoder (none: from the data)"})
    text_column: str = field(default="text", metadata={"help": "text column of the data (text models)"})
    image_column: str = field(default="image", metadata={"help": "image column of the data (image models)"})
    label_column: str = field(default="label", metadata={"help": "label column of the data"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training examples"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N evaluation examples"})
    # run
    seed: int = field(default=0, metadata={"help": "member m uses seed + m"})
    mixed_precision: str = field(
        default="auto",
        metadata={"help": f"one of {list(MIXED_PRECISION)}; auto: bf16 (else fp16) on a GPU, none on CPU"},
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

        def number(
            name: str, *, minimum: float, integer: bool = False, optional: bool = False, strict: bool = False
        ) -> None:
            value = getattr(self, name)
            if value is None and optional:
                return
            kinds = (int,) if integer else (int, float)
            bad_type = isinstance(value, bool) or not isinstance(value, kinds)
            if bad_type:
                raise TypeError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
            if value < minimum or (strict and value == minimum):
                raise ValueError(f"{name}={value!r} must be {'>' if strict else '>='} {minimum}")

        for f in dataclasses.fields(self):  # nan passes every `value < minimum` check below; inf is no setting either
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name}={value!r} must be a finite number")
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
        for name in (
            "num_epochs",
            "batch_size",
            "gradient_accumulation_steps",
            "eval_batch_size",
            "max_length",
            "log_every_steps",
        ):
            number(name, minimum=1, integer=True)
        for name in ("max_steps", "save_every_steps", "max_train_samples", "max_eval_samples"):
            number(name, minimum=1, integer=True, optional=True)
        number("early_stopping_patience", minimum=1, integer=True, optional=True)
        number("num_labels", minimum=2, integer=True, optional=True)
        number("seed", minimum=0, integer=True)
        number("member_perturb", minimum=0)
        if self.member_perturb > 1:
            raise ValueError(
                f"member_perturb={self.member_perturb!r} must be <= 1 (1: members start from a random init)"
            )

    # ------------------------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> FinetuneConfig:
        """Build from a dict; ``"recipe": NAME`` (one of :data:`RECIPES`, default ``text``) picks the
        preset the other keys override."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
        data = dict(data)
        recipe = get_recipe(data.pop("recipe", "text"), source=source)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{source}: unknown settings {unknown}; valid ones are {sorted(names)}")
        return recipe.config(**data)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **overrides: Any) -> FinetuneConfig:
        """Read a JSON or YAML file of settings (``recipe`` plus any fields); ``overrides`` win."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"fine-tuning config file {str(path)!r} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
            if path.suffix.lower() in (".yaml", ".yml"):
                data = yaml.safe_load(text) or {}
            else:
                data = json.loads(text)
        except Exception as exc:  # not UTF-8, JSON/YAML syntax errors: name the file
            raise ValueError(f"fine-tuning config file {str(path)!r} could not be parsed: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"fine-tuning config file {str(path)!r} must hold a mapping of settings")
        return cls.from_dict({**data, **overrides}, source=f"fine-tuning config file {str(path)!r}")

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------ named recipes
def demo_precision() -> str:
    """The demo's training precision: bf16 on a CPU that multiplies bf16 natively (AVX512-BF16 or AMX, where
    it trains 1.6x faster than fp32, docs/results.md), else ``auto`` (bf16 on a GPU, fp32 on other CPUs)."""
    native = describe_machine()["bf16_products"] is not None
    return "bf16" if native and not torch.cuda.is_available() else "auto"


@dataclass(frozen=True)
class Recipe:
    """Training settings registered by name (``hydra-hf finetune --recipe NAME``).

    Attributes:
        name: the registry key.
        help: one line: what the recipe is for and where its numbers come from.
        values: the settings that differ from :class:`FinetuneConfig`'s defaults (the paper's text
            recipe); a callable value is resolved when the config is built (the demo's precision
            depends on the CPU).
    """

    name: str
    help: str
    values: Mapping[str, Any | Callable[[], Any]]

    def settings(self) -> dict[str, Any]:
        """The recipe's values, callables resolved for this machine."""
        return {key: value() if callable(value) else value for key, value in self.values.items()}

    def config(self, **overrides: Any) -> FinetuneConfig:
        """The recipe's :class:`FinetuneConfig`; ``overrides`` (e.g. the command line's flags) win."""
        return FinetuneConfig(**{**self.settings(), **overrides})

    def describe(self, overrides: Mapping[str, Any] | None = None) -> str:
        """One line for a run's log: the recipe, its values on this machine and what overrides them."""
        settings = self.settings()
        values = ", ".join(f"{key}={value}" for key, value in settings.items()) or "FinetuneConfig's defaults"
        line = f"recipe {self.name} ({self.help}): {values}"
        changed = {k: v for k, v in (overrides or {}).items() if settings.get(k, _UNSET) != v}
        if changed:
            line += "; overridden by " + ", ".join(f"{key}={value}" for key, value in changed.items())
        return line


_UNSET = object()
RECIPES: dict[str, Recipe] = {}
"""name -> :class:`Recipe`: the paper's recipes per task (``text``, ``image``) and the demo's (``demo-single``,
``demo-members``: the settings ``make demo`` and the README's Quickstart train with)."""


def register_recipe(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to :data:`RECIPES` (its values are checked by building its config once)."""
    recipe.config()
    RECIPES[recipe.name] = recipe
    return recipe


def get_recipe(name: Any, *, source: str = "--recipe") -> Recipe:
    """The registered recipe ``name``; an unknown one is a one-line error naming the registered ones."""
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"{source}: recipe {name!r} is unknown; use one of {list(RECIPES)}")
    return RECIPES[name]


register_recipe(Recipe("text", "the paper's text recipe (BERT on SST-2): AdamW lr 1e-5, up to 7 epochs with early "
                       "stopping; meant for full epochs, too small a step for a few hundred steps", {}))
register_recipe(Recipe("image", "the paper's image recipe (ViT on CIFAR-100): SGD lr 0.01, cosine, label smoothing "
                       "0.1, up to 7 epochs", dict(
                           optimizer="sgd", learning_rate=0.01, momentum=0.9, weight_decay=0.0, scheduler="cosine",
                           warmup_ratio=0.1, label_smoothing=0.1, max_grad_norm=1.0, batch_size=64, num_epochs=7)))
# The demo's settings (hydra_hf.recipes.TextPipeline's defaults; tests/finetune/test_recipes.py checks that the two
# agree): a few hundred CPU steps on the first 6,000 training reviews replace the paper's up-to-7 GPU epochs at
# lr 1e-5, so the step is ten times larger; the members start from the fine-tuned Single (recovery, not
# re-training) at half the Single's rate.
_DEMO = dict(num_epochs=1, early_stopping_patience=None, max_length=48, batch_size=32, eval_batch_size=128,
             max_train_samples=6000, max_eval_samples=400, log_every_steps=20, mixed_precision=demo_precision)
register_recipe(Recipe("demo-single", "the demo's Single: all-MiniLM-L6-v2 with every head on Rotten Tomatoes, "
                       "lr 1e-4 for 180 steps", {**_DEMO, "learning_rate": 1e-4, "max_steps": 180}))
register_recipe(Recipe("demo-members", "the demo's members, each from the demo's Single: lr 5e-5 for 120 steps",
                       {**_DEMO, "learning_rate": 5e-5, "max_steps": 120}))
# docs/slim.md's slim members that keep the OOD detection (slim-k6-m33-top-ft480): the demo's members trained four
# times as long, over up to 3 epochs of the 6,000 reviews with the best epoch on validation (the study trained
# them in fp32; this recipe keeps the demo's precision)
register_recipe(Recipe("demo-slim-members", "slim members (--mlp-keep) of the demo's Single, the recipe docs/slim.md "
                       "measured: lr 5e-5 for 480 steps, best of up to 3 epochs",
                       {**_DEMO, "learning_rate": 5e-5, "max_steps": 480, "num_epochs": 3,
                        "early_stopping_patience": 2}))


def text_recipe(**overrides: Any) -> FinetuneConfig:
    """The paper's text recipe (BERT): AdamW (weight decay 0.01, none on biases and LayerNorms),
    lr 1e-5, linear warm-up over 10 % of the steps then linear decay, gradient clipping 1.0, max
    length 128, up to 7 epochs with early stopping on validation accuracy (patience 2), embeddings
    frozen so that the members share them."""
    return RECIPES["text"].config(**overrides)


def image_recipe(**overrides: Any) -> FinetuneConfig:
    """The paper's image recipe (ViT): SGD with momentum 0.9, warm-up then cosine decay, label
    smoothing 0.1. The learning rate (0.01), no weight decay, 10 % warm-up, gradient clipping 1.0 and
    batch 64 follow the usual ViT fine-tuning practice; override them for your data."""
    return RECIPES["image"].config(**overrides)


def default_recipe(model_dir: str | os.PathLike) -> FinetuneConfig:
    """The paper's recipe for this base model: :func:`image_recipe` for ViT, else :func:`text_recipe`."""
    return image_recipe() if detect_arch(model_dir) == "vit" else text_recipe()
