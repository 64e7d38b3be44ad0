"""The family registry: everything hydra_hf knows about one architecture, in one object.

A *family* is one base architecture (BERT, RoBERTa, ViT, CLIP, ...). Its :class:`Family` says how to
recognise a checkpoint of it, how to read that checkpoint into the canonical per-layer tensors that
``convert/fuse.py`` fuses, which Hydra config and model classes it builds and ships, its task and
pipeline, where a stock model keeps its attention heads (pruning), how to build a stock model of it
(members, references) and which fused parameters fine-tuning freezes. The pipeline stages (convert,
export, pruning, ...) look a family up here instead of branching on architecture names.

Names: one spelling, lowercase with underscores (``"timm_vit"``, ``"open_clip"``, ``"xlm_roberta"``);
hyphenated spellings (``"open-clip"``, ``"timm-vit"``, HF's ``"xlm-roberta"``) are accepted everywhere a
name is read and mapped to it.

Adding a family: subclass :class:`Family` (or :class:`~hydra_hf.families.text.HFTextFamily` for a
Hugging Face text encoder) in ``families/<name>.py``, ship its modeling and config files in ``modeling/``, call
:func:`register_family`, and import the module in ``families/__init__.py``.
"""

from __future__ import annotations

import importlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel

from ..convert.gguf import is_gguf, materialize_gguf
from ..convert.reader import Reader
from ..convert.slim import unslim
from ..errors import HydraInputError
from ..masks import HeadMasks
from ..outputs import read_model_config
from .adapters import ModelAdapter, bert_like_adapter, find_bert_like_layers

# pipeline task -> (Auto class of the task model, model-card kind in hub.KINDS)
TASKS: dict[str, tuple[str, str]] = {
    "text-classification": ("AutoModelForSequenceClassification", "text"),
    "image-classification": ("AutoModelForImageClassification", "image"),
    "zero-shot-image-classification": ("AutoModelForZeroShotImageClassification", "zero-shot"),
}
MODALITIES = ("text", "image", "image-text")
# Files every family ships besides its own modeling file (the config names the uncertainty pipelines; handler.py is
# the folder's entry point for servers: Inference Endpoints' custom handler, `hydra-hf serve`).
COMMON_SHIPPED = (
    "hydra_formulas.py", "configuration_hydra.py", "hydra_attention.py", "hydra_layers.py", "hydra_skeletons.py",
    "pipeline_hydra.py", "handler.py",
)


def canonical_name(name: str) -> str:
    """The registry spelling of a family name: lowercase, ``-`` -> ``_`` (``"open-clip"`` -> ``"open_clip"``)."""
    return str(name).strip().lower().replace("-", "_")


@dataclass
class Built:
    """What :meth:`Family.build` returns: the fused model and how to finish its folder.

    Attributes:
        model: the fused Hydra model, in eval mode.
        preprocessor_from: the folder whose tokenizer / image processor is copied next to it (None:
            the checkpoint has none in transformers' format).
        extra: writes more files into the output folder (e.g. a converted image processor), or None.
    """

    model: PreTrainedModel
    preprocessor_from: Path | None = None
    extra: Callable[[Path], None] | None = None


class Family(ABC):
    """Everything about one base architecture. Subclasses set the class attributes and implement
    :meth:`build`, :meth:`adapter` and :meth:`stock_model` (and :meth:`owns_model` for a model that is not a
    transformers one).

    Attributes:
        name: the registry name (lowercase, underscores).
        aliases: other accepted spellings (hyphenated spellings are accepted without listing them).
        modality: ``"text"``, ``"image"`` or ``"image-text"`` (two towers).
        model_types: the ``config.json`` ``model_type`` values of its Hugging Face checkpoints.
        hf_class_prefix: the prefix of its transformers classes (``"Bert"``); with ``accepted_heads``
            it names the checkpoint ``architectures`` that convert (None: no check, e.g. timm).
        accepted_heads: class-name suffixes that convert: the task head this family builds, and bare
            or pre-training encoders (which get a new classifier). Any other head is refused.
        base_model_type: ``base_model_type`` of the Hydra config it builds (timm ViTs become ``"vit"``).
        task: the pipeline task (a key of :data:`TASKS`).
        reader: how its checkpoints are read, fused and split back (:class:`~hydra_hf.convert.reader.Reader`:
            a layout table's or the family's own three functions).
        config_class_name: its Hydra config class, in ``config_file``.
        config_file: its shipped config file in ``modeling/`` (``configuration_hydra_<family>.py``, over the
            shared ``configuration_hydra.py``, which is BERT's and the default).
        modeling_file: its shipped modeling file in ``modeling/``.
        model_class_names: Auto class -> model class name in ``modeling_file`` (``AutoModel`` and the
            task's Auto class).
        towers: the pruning towers of a stock model (``("text",)``, ``("vision",)``, or both).
        mlp_down_proj: tower -> a regular expression matching (``re.search``, at the end of the name) the
            module names of a stock model's MLP down projections, its group 1 the layer index: the layer whose
            input features are the MLP's intermediate neurons (slim members prune them; Taylor scores gate them).
        frozen_prefixes: fused parameter names that members share and fine-tuning keeps frozen.
        classifier_keys: stock tensor names whose presence means the checkpoint has a trained classifier.
        prompt_tokenizer_kwargs: zero-shot families: tokenizer arguments for the class prompts.
        uncertainty_pipelines: its folders name hydra_hf's uncertainty pipelines in ``custom_pipelines``
            (False where the predictive distribution is not a softmax over the labels, e.g. SigLIP).
    """

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    modality: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]] = ()
    hf_class_prefix: ClassVar[str | None] = None
    accepted_heads: ClassVar[tuple[str, ...]] = ("Model", "ForSequenceClassification", "ForMaskedLM", "ForPreTraining")
    base_model_type: ClassVar[str]
    task: ClassVar[str]
    reader: ClassVar[Reader]
    config_class_name: ClassVar[str]
    config_file: ClassVar[str] = "configuration_hydra.py"
    modeling_file: ClassVar[str]
    model_class_names: ClassVar[dict[str, str]]
    towers: ClassVar[tuple[str, ...]]
    mlp_down_proj: ClassVar[dict[str, str]] = {}
    frozen_prefixes: ClassVar[tuple[str, ...]] = ("hydra.embeddings.",)
    classifier_keys: ClassVar[tuple[str, ...]] = ("classifier.weight",)
    # zero-shot families: how the class prompts are tokenized (as transformers' zero-shot pipeline does)
    prompt_tokenizer_kwargs: ClassVar[dict[str, Any]] = {"padding": True}
    # whether its folders ship hydra_hf's uncertainty pipelines (they assume a softmax over the labels)
    uncertainty_pipelines: ClassVar[bool] = True

    def __repr__(self) -> str:
        return f"<family {self.name}>"

    # ------------------------------------------------------------------------------ recognising
    def detect(self, folder: Path, config: Mapping[str, Any] | None) -> bool:
        """Whether the checkpoint ``folder`` (with its ``config.json`` as ``config``, None when it has
        none) is of this family. Default: ``config["model_type"]`` is one of :attr:`model_types`."""
        return config is not None and config.get("model_type") in self.model_types

    @property
    def supported_architectures(self) -> tuple[str, ...]:
        """The ``architectures`` entries that convert (empty: not checked)."""
        if self.hf_class_prefix is None:
            return ()
        return tuple(f"{self.hf_class_prefix}{head}" for head in self.accepted_heads)

    def check_checkpoint(self, config: Mapping[str, Any] | None, source: str) -> None:
        """``HydraInputError`` when the checkpoint's ``architectures`` names a task head this family
        does not build (token classification, question answering, ...): it is never converted into
        something else."""
        supported = self.supported_architectures
        if config is None or not supported:
            return
        names = config.get("architectures") or []
        bad = [a for a in names if a not in supported]
        if bad:
            raise HydraInputError(
                f"{source} is a {bad[0]} checkpoint: hydra_hf builds {self.task} ensembles and converts "
                f"{', '.join(supported)} {self.name} checkpoints, not this task head"
            )

    # ----------------------------------------------------------------------------- converting
    @abstractmethod
    def build(
        self,
        folders: list[Path],
        masks: HeadMasks,
        *,
        mlp_fusion: str,
        shared: str,
        num_labels: int | None,
        id2label: dict[int, str] | None,
        seed: int,
    ) -> Built:
        """Read the checkpoints in ``folders`` (one shared base, or one per member), fuse them with
        ``masks`` and build the Hydra model (see :func:`hydra_hf.assemble.convert_checkpoint`, which has
        checked that ``masks`` fit the family's towers)."""

    def read_member(self, state: dict[str, Any], config: dict[str, Any], source: str = "checkpoint") -> Any:
        """One checkpoint's state dict (and config) in canonical form: per-layer tensors named as in
        ``convert/fuse.py`` plus the shared and per-member parts (checks key counts and shapes)."""
        return self.reader.read_member(state, config, source=source)

    def unfuse(self, state: dict[str, Any], hydra_config: Any) -> list[dict[str, Any]]:
        """One stock state dict per member from a fused state dict (removed heads zeroed); loading
        member m's into :meth:`stock_model` reproduces the fused model's ``member_logits[:, m]``. The family's
        own :meth:`unfuse_whole_mlps` does the work; slim members are first widened to whole per-member MLPs
        whose removed neurons are zero."""
        if getattr(hydra_config, "slim", False):
            state, hydra_config = unslim(state, hydra_config, self.model_class("AutoModel"))
        return self.unfuse_whole_mlps(state, hydra_config)

    def unfuse_whole_mlps(self, state: dict[str, Any], hydra_config: Any) -> list[dict[str, Any]]:
        """:meth:`unfuse` of a fused state dict whose members keep whole MLPs (the reader's inverse)."""
        return self.reader.unfuse(state, hydra_config)

    # ----------------------------------------------------------------------- shipped code, Auto
    @property
    def shipped_files(self) -> tuple[str, ...]:
        """The modeling files copied flat into every model folder of this family."""
        return tuple(dict.fromkeys((*COMMON_SHIPPED, self.modeling_file, self.config_file)))

    @property
    def auto_map(self) -> dict[str, str]:
        """``config.auto_map`` of its model folders: ``AutoConfig`` and the model classes."""
        stem = self.modeling_file.removesuffix(".py")
        out = {"AutoConfig": f"{self.config_file.removesuffix('.py')}.{self.config_class_name}"}
        out.update({auto: f"{stem}.{cls}" for auto, cls in self.model_class_names.items()})
        return out

    @property
    def task_auto_class(self) -> str:
        return TASKS[self.task][0]

    @property
    def card_kind(self) -> str:
        """The model-card template kind (a key of ``hub.KINDS``)."""
        return TASKS[self.task][1]

    def config_class(self) -> type:
        """The Hydra config class (imported on first use)."""
        module = importlib.import_module(f"hydra_hf.modeling.{self.config_file.removesuffix('.py')}")
        return getattr(module, self.config_class_name)

    def model_class(self, auto_class: str | None = None) -> type:
        """The Hydra model class for ``auto_class`` (default: the task model)."""
        module = importlib.import_module(f"hydra_hf.modeling.{self.modeling_file.removesuffix('.py')}")
        return getattr(module, self.model_class_names[auto_class or self.task_auto_class])

    # ------------------------------------------------------------------------------- pruning
    def owns_model(self, model: nn.Module) -> bool:
        """Whether a live stock model (transformers / timm / open_clip) is of this family. Default: a
        transformers model whose ``config.model_type`` is one of :attr:`model_types`."""
        return getattr(getattr(model, "config", None), "model_type", None) in self.model_types

    def mlp_layers(self, model: nn.Module) -> dict[str, list[nn.Module]]:
        """``{tower: [down projection of layer 0, 1, ...]}`` of a stock model (see :attr:`mlp_down_proj`): the
        modules whose input features are each layer's MLP neurons (an ``nn.Linear``'s input columns; a
        transformers ``Conv1D``'s input rows)."""
        if not self.mlp_down_proj:
            raise HydraInputError(f"family {self.name!r} does not say where its MLPs are; it cannot prune MLP neurons")
        out = {}
        for tower, pattern in self.mlp_down_proj.items():
            found = {}
            for name, module in model.named_modules():
                match = re.search(f"(?:{pattern})$", name)
                if match:
                    found[int(match.group(1))] = module
            if not found or sorted(found) != list(range(len(found))):
                raise HydraInputError(
                    f"found MLP layers {sorted(found)} of the {tower} tower in this {type(model).__name__}; "
                    f"expected layers 0..L-1 (family {self.name!r})"
                )
            out[tower] = [found[i] for i in range(len(found))]
        return out

    def prompt_tokenizer_kwargs_for(self, config: Any) -> dict[str, Any]:
        """Zero-shot families: the tokenizer arguments for the class prompts of a model with ``config``
        (stock or Hydra), ``prompt_tokenizer_kwargs`` by default."""
        return dict(self.prompt_tokenizer_kwargs)

    @abstractmethod
    def adapter(self, model: nn.Module, *, class_text_inputs: Any = None) -> ModelAdapter:
        """Where ``model`` keeps its attention heads and how it computes logits (for pruning)."""

    # ----------------------------------------------------------------- stock models (members)
    @abstractmethod
    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> nn.Module:
        """A stock task model (random weights) of ``base_config`` (a Hydra config's ``base_config``):
        the architecture of one member, which :meth:`unfuse` dicts load into."""


# ------------------------------------------------------------------------------------ registry
_REGISTRY: dict[str, Family] = {}
_ALIASES: dict[str, str] = {}


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Add ``family`` to the registry under its name and aliases; returns it.

    Raises:
        HydraInputError: the name is not canonical, or is taken (unless ``replace``), or the family holds no
            :class:`~hydra_hf.convert.reader.Reader`.
    """
    name = family.name
    if name != canonical_name(name):
        raise HydraInputError(f"family name {name!r} is not in registry spelling; use {canonical_name(name)!r}")
    if family.modality not in MODALITIES or family.task not in TASKS:
        raise HydraInputError(
            f"family {name!r}: modality {family.modality!r} / task {family.task!r} unknown; "
            f"use one of {list(MODALITIES)} / {list(TASKS)}"
        )
    if not isinstance(getattr(family, "reader", None), Reader):
        raise HydraInputError(
            f"family {name!r} has no reader; set reader = Reader(read_member, fuse, unfuse) "
            "(hydra_hf.convert.reader) or describe its checkpoints with a TextLayout"
        )
    if name in _REGISTRY and not replace and _REGISTRY[name] is not family:
        raise HydraInputError(f"a family named {name!r} is already registered; pass replace=True to replace it")
    _REGISTRY[name] = family
    for alias in family.aliases:
        _ALIASES[canonical_name(alias)] = name
    return family


def families() -> list[Family]:
    """Every registered family, in registration order."""
    return list(_REGISTRY.values())


def family_names() -> list[str]:
    return list(_REGISTRY)


def get_family(name: str) -> Family:
    """The family registered as ``name`` (any accepted spelling), else ``HydraInputError`` listing them."""
    key = canonical_name(name)
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        raise HydraInputError(f"unknown architecture family {name!r}; hydra_hf supports {family_names()}")
    return _REGISTRY[key]


def family_of_config(config: Any) -> Family:
    """The family of a Hydra model's config (its ``base_model_type``)."""
    base = config.get("base_model_type") if isinstance(config, Mapping) else getattr(config, "base_model_type", None)
    if not base:
        raise HydraInputError("this config has no base_model_type; it is not a Hydra Ensemble config")
    return get_family(base)


def family_of_model(model: nn.Module) -> Family | None:
    """The registered family that owns a live stock model (:meth:`Family.owns_model`), or None."""
    for family in families():
        if family.owns_model(model):
            return family
    return None


def get_adapter(
    model: nn.Module, *, class_text_inputs: Mapping[str, torch.Tensor] | torch.Tensor | None = None
) -> ModelAdapter:
    """Build the :class:`ModelAdapter` of a supported model: the registered family that owns it
    (:meth:`hydra_hf.families.Family.owns_model`) builds it.

    Args:
        model: a supported model (see the module docstring).
        class_text_inputs: CLIP models only: the tokenized class prompts (HF: a dict with
            ``input_ids``/``attention_mask`` of shape ``(C, T)``; open_clip: token ids ``(C, T)``),
            needed for zero-shot logits. Gates work without them.

    Raises:
        TypeError: the architecture is not supported.
    """
    family = family_of_model(model)
    if family is not None:
        return family.adapter(model, class_text_inputs=class_text_inputs)
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    if isinstance(model, PreTrainedModel) and find_bert_like_layers(model) is not None:
        # an unregistered model with BERT's encoder layout: its heads live where BERT's do
        return bert_like_adapter(model, "hf_bert")
    what = f" (model_type {model_type!r})" if model_type else ""
    raise TypeError(
        f"hydra_hf pruning does not support {type(model).__name__}{what}; supported families: {family_names()} "
        "(transformers models of these families, timm VisionTransformer, open_clip CLIP)"
    )


def _read_json(file: Path) -> dict[str, Any] | None:
    if not file.exists():
        return None
    return read_model_config(file)  # bounded; a list or a count written as a string is one line


def gguf_family(metadata: Mapping[str, Any]) -> Family:
    """The registered decoder family that builds a GGUF checkpoint's architecture (``metadata``:
    :func:`hydra_hf.convert.gguf.read_gguf_metadata`), else one :class:`HydraInputError` line naming it."""
    arch = str(metadata.get("architecture"))
    for family in families():
        if arch in family.model_types and "AutoModelForCausalLM" in family.model_class_names:
            return family
    supported = sorted({t for f in families() if "AutoModelForCausalLM" in f.model_class_names for t in f.model_types})
    raise HydraInputError(
        f"the GGUF file {metadata.get('file', '')!r} holds a {arch!r} model (general.architecture), an architecture "
        f"hydra_hf builds no Hydra of; GGUF checkpoints of {', '.join(supported)} decoders are supported"
    )


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """``path`` as a checkpoint folder: a GGUF checkpoint (a ``.gguf`` file or a folder holding one) is
    materialised into its cached plain folder (:func:`hydra_hf.convert.gguf.materialize_gguf`; an architecture no
    registered family builds is refused before its weights are read); any other path is returned as it is."""
    if is_gguf(path):
        return materialize_gguf(path, accept=gguf_family)
    return Path(path)


def detect_family(path: str | os.PathLike, *, check: bool = True) -> Family:
    """The family of the checkpoint folder ``path`` (a GGUF checkpoint: of its materialised folder,
    :func:`resolve_checkpoint`).

    With ``check`` (default) a checkpoint whose ``architectures`` is a task head the family does not
    build is refused (:meth:`Family.check_checkpoint`).

    Raises:
        HydraInputError: the folder is missing, already a Hydra Ensemble, of an unknown architecture
            (the message lists the supported families), or an unsupported task head.
    """
    folder = resolve_checkpoint(path)
    if not folder.is_dir():
        raise HydraInputError(f"checkpoint folder {str(folder)!r} does not exist; pass a local model folder")
    config = _read_json(folder / "config.json")
    model_type = (config or {}).get("model_type")
    if isinstance(model_type, str) and model_type.startswith("hydra_ensemble"):
        raise HydraInputError(f"{str(path)!r} is already a Hydra Ensemble; convert the base model it was built from")
    for family in families():
        if family.detect(folder, config):
            if check:
                family.check_checkpoint(config, repr(str(path)))
            return family
    if config is None:
        raise HydraInputError(f"{str(path)!r} has no config.json; it is not a Hugging Face model folder")
    what = (
        f"model_type={model_type!r}"
        if model_type or "architecture" not in config
        else f"architecture={config['architecture']!r}"
    )
    raise HydraInputError(
        f"{str(path)!r} has {what}: an unknown checkpoint layout; hydra_hf converts the families "
        f"{family_names()} (Hugging Face folders by model_type, timm vit_* folders, open_clip folders)"
    )
