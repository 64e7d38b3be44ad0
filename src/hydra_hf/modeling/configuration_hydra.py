# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Configuration of a Hydra Ensemble: one base transformer, M members that each keep their own
subset of attention heads, fused into one model."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from transformers import AutoConfig, PretrainedConfig
from transformers.utils import logging

if TYPE_CHECKING:  # never executed: this line only makes transformers ship the pipeline file with this one
    # transformers finds a remote-code file's siblings by scanning it for relative imports (a regex, so
    # this line counts although it never runs): `save_pretrained` (hence `push_to_hub`, `Trainer.save_model`
    # and Trainer checkpoints) copies them next to it, and `trust_remote_code` loading downloads them.
    # The config names `pipeline_hydra` in `custom_pipelines`, so the pipeline file must travel with it:
    # this import makes every save path and every download include it, with no `save_pretrained` override.
    from .pipeline_hydra import HydraTextClassificationPipeline  # noqa: F401

logger = logging.get_logger(__name__)

MLP_FUSIONS = ("average", "per_member")
BASE_MODEL_TYPES = ("bert",)

# Task head (auto class) -> the uncertainty pipeline that uses it: (task name, class in pipeline_hydra.py,
# input type). A config names the ones its auto_map has in `custom_pipelines`, so that
# `pipeline(model=folder_or_repo, trust_remote_code=True)` builds it.
PIPELINE_MODULE = "pipeline_hydra"
HYDRA_PIPELINES: dict[str, tuple[str, str, str]] = {
    "AutoModelForSequenceClassification": ("hydra-text-classification", "HydraTextClassificationPipeline", "text"),
    "AutoModelForImageClassification": ("hydra-image-classification", "HydraImageClassificationPipeline", "image"),
    "AutoModelForZeroShotImageClassification": (
        "hydra-zero-shot-image-classification", "HydraZeroShotImageClassificationPipeline", "multimodal"),
    "AutoModelForCausalLM": ("hydra-text-generation", "HydraTextGenerationPipeline", "text"),
}


# A stock pipeline task (and its aliases) -> the Hydra task that adds the uncertainty: `pipeline("text-classification",
# model=hydra_folder, trust_remote_code=True)` builds transformers' stock pipeline (label and score only).
STOCK_TASKS: dict[str, str] = {
    **{task.removeprefix("hydra-"): task for task, _, _ in HYDRA_PIPELINES.values()},
    "sentiment-analysis": "hydra-text-classification",
}


def warn_stock_task(config_dict: dict[str, Any], task: Any, name: Any) -> None:
    """Log one warning when a pipeline asks for a folder through a stock task name that has a Hydra
    uncertainty pipeline in its ``custom_pipelines`` (the stock pipeline would drop the uncertainty)."""
    hydra_task = STOCK_TASKS.get(task) if isinstance(task, str) else None
    if hydra_task is None or hydra_task not in (config_dict.get("custom_pipelines") or {}):
        return
    logger.warning_once(
        f"{name}: pipeline task {task!r} builds transformers' stock pipeline, which returns the Hydra Ensemble's "
        f"label and score without its uncertainty; ask for {hydra_task!r} (pipeline({hydra_task!r}, model=..., "
        "trust_remote_code=True)) or leave the task out"
    )


def custom_pipelines_for(auto_map: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``config.custom_pipelines`` for a folder with this ``auto_map``: one uncertainty pipeline per
    task head the folder ships (transformers' format: ``{task: {"impl", "pt", "type"}}``)."""
    return {
        task: {"impl": f"{PIPELINE_MODULE}.{cls}", "pt": [auto_class], "type": kind}
        for auto_class, (task, cls, kind) in HYDRA_PIPELINES.items()
        if auto_class in auto_map
    }


# The attributes every transformers config has of its own (output flags, labels, dtype ...) and the Hydra
# fields: a Hydra config keeps these itself; every other name the base model's config holds is one of the
# base's settings, kept in ``base_config`` (see ``HydraEnsembleConfig.__getattr__``).
_CONFIG_OWN_NAMES = frozenset(PretrainedConfig().to_dict()) | {
    "base_model_type", "base_config", "num_members", "kept_heads", "vision_kept_heads", "text_kept_heads",
    "mlp_fusion", "member_metadata", "distilled", "auto_map", "custom_pipelines", "lm_head_fusion", "kept_kv_heads",
    "kept_neurons", "vision_kept_neurons", "text_kept_neurons", "calibration",
}


# The labels are the Hydra config's own (top level): ``base_config`` keeps none of the base's (the converter
# writes none). A base config's ``to_dict()`` has them (``BertConfig().to_dict()``: ``LABEL_0``, ``LABEL_1``),
# and JSON turns ``id2label``'s integer keys into strings, so a config holding them would not equal its
# saved copy.
BASE_LABEL_KEYS = ("id2label", "label2id")


def without_base_labels(base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a base config dict) without its labels, in nested tower configs too."""
    out = {k: v for k, v in base.items() if k not in BASE_LABEL_KEYS}
    for key, value in out.items():
        if key.endswith("_config") and isinstance(value, dict):
            out[key] = without_base_labels(value)
    return out


_KEPT_HEADS_FIELDS = ("kept_heads", "vision_kept_heads", "text_kept_heads")  # a config naming members has a base


@cache
def default_base_config(base_model_type: str) -> dict[str, Any]:
    """The settings of ``base_model_type``'s transformers config built without arguments (``LlamaConfig()``'s),
    without its labels, with the common names its ``attribute_map`` aliases (DistilBERT's ``hidden_size`` for
    ``dim``, as the converter writes them): what a Hydra config built without arguments answers for the
    base's settings. Empty for a type transformers does not know. Callers must not modify it (one copy per
    type)."""
    try:
        stock = AutoConfig.for_model(base_model_type)
    except (KeyError, ValueError):
        return {}
    settings = stock.to_dict()
    aliases = {alias: settings[name] for alias, name in stock.attribute_map.items() if name in settings}
    return without_base_labels({**aliases, **settings})


def _layer_lists(kept: Any, num_layers: int, where: str, what: str) -> Iterator[tuple[int, int, Any]]:
    """``(m, l, kept[m][l])`` for every member and layer, after checking that member ``m`` holds one list of
    integer ``what`` indices (``"head"``, ``"neuron"``) per layer (``ValueError`` naming the entry otherwise)."""
    for m, member in enumerate(kept):
        if not isinstance(member, (list, tuple)) or len(member) != num_layers:
            got = len(member) if isinstance(member, (list, tuple)) else type(member).__name__
            raise ValueError(
                f"{where}[{m}] must hold one list of {what}s per layer ({num_layers} layers), got {got}; "
                "give every member exactly one list per layer of the base model"
            )
        for layer, indices in enumerate(member):
            if not isinstance(indices, (list, tuple)) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in indices
            ):
                raise ValueError(f"{where}[{m}][{layer}] must be a list of integer {what} indices, got {indices!r}")
            yield m, layer, indices


def check_kept_heads(kept_heads: Any, num_layers: int, num_heads: int, where: str = "kept_heads") -> None:
    """Raise ``ValueError`` unless ``kept_heads[m][l]`` is a sorted list of unique heads in ``[0, H)``
    for every member ``m`` and each of the ``num_layers`` layers."""
    if not isinstance(kept_heads, (list, tuple)) or len(kept_heads) == 0:
        raise ValueError(f"{where} must be a non-empty list with one entry per member, got {kept_heads!r}")
    for m, layer, heads in _layer_lists(kept_heads, num_layers, where, "head"):
        bad = [h for h in heads if not 0 <= h < num_heads]
        if bad:
            raise ValueError(
                f"{where}[{m}][{layer}] has head indices {bad} outside [0, {num_heads}); "
                f"the base model has {num_heads} heads per layer"
            )
        if len(set(heads)) != len(heads):
            raise ValueError(f"{where}[{m}][{layer}] lists a head twice: {list(heads)}; list each kept head once")
        if list(heads) != sorted(heads):
            raise ValueError(f"{where}[{m}][{layer}] must be sorted, got {list(heads)}; use {sorted(heads)}")


def neurons_field(heads_field: str) -> str:
    """The slim-member field beside a kept-heads field: ``kept_heads`` -> ``kept_neurons``,
    ``vision_kept_heads`` -> ``vision_kept_neurons``."""
    return heads_field.replace("kept_heads", "kept_neurons")


def check_kept_neurons(kept_neurons: Any, num_members: int, num_layers: int, where: str = "kept_neurons") -> None:
    """Raise ``ValueError`` unless ``kept_neurons[m][l]`` is a sorted list of unique non-negative neuron indices
    for each of the ``num_members`` members and ``num_layers`` layers (may be empty: the member's MLP then adds
    only its output bias). The upper bound, the MLP's width, is checked by the layer that builds the MLP."""
    if not isinstance(kept_neurons, (list, tuple)) or len(kept_neurons) != num_members:
        got = len(kept_neurons) if isinstance(kept_neurons, (list, tuple)) else type(kept_neurons).__name__
        raise ValueError(
            f"{where} must list one entry per member ({num_members}), got {got}; give every member its neurons"
        )
    for m, layer, neurons in _layer_lists(kept_neurons, num_layers, where, "neuron"):
        bad = [n for n in neurons if n < 0]
        if bad:
            raise ValueError(f"{where}[{m}][{layer}] has negative neuron indices {bad[:5]}; indices start at 0")
        if any(b <= a for a, b in zip(neurons, neurons[1:])):
            fix = "list each kept neuron once" if len(set(neurons)) != len(neurons) else "sort them"
            raise ValueError(f"{where}[{m}][{layer}] must be sorted and unique (increasing indices); {fix}")


# ------------------------------------------------------------------------------ a stored calibration
# What `hydra-hf calibrate` stores in ``config.calibration`` (``hydra_hf.calibration`` fits it): split conformal
# sets and an abstention threshold of a classifier, or the abstention thresholds of a causal LM
# (``"task": "causal_lm"``). The pipelines, ``generate_with_uncertainty`` and hydra_hf's readers all check it with
# :func:`check_calibration` before they use it: a folder's config is input, not necessarily written by hydra-hf.
CONFORMAL_METHODS = ("lac", "aps", "raps")
RANDOMIZED_METHODS = ("aps", "raps")
SELECTIVE_SCORES = ("msp", "entropy", "mi")  # uncertainty scores of a classifier: higher = less sure
GENERATION_SCORE_NAMES = ("entropy", "mi")  # token scores of a causal LM's abstention
CALIBRATION_TASKS = ("causal_lm",)  # a classifier's calibration names no task
_SCORE_TOLERANCE = 1e-6  # sums of float probabilities exceed 1 (a score's bound) by rounding
_RECALIBRATE = "calibrate the folder again (hydra-hf calibrate ... --overwrite) or remove the key"


def check_calibration(calibration: Any, num_labels: int | None = None) -> dict[str, Any] | None:
    """``config.calibration`` checked field by field (returned as it is), or None when there is none.

    Every number is finite and in its range: ``alpha`` in (0, 1), ``n`` a positive integer, a classifier's
    ``q_hat`` in the range of its method's scores ([0, 1] for lac and aps; raps adds its penalty per rank
    above ``regularization_rank``, bounded with ``num_labels`` classes, or the stored ``class_names``), a
    ``temperature`` above 0, a ``threshold`` in the range of its ``score`` (msp [0, 1], entropy and mi
    [0, ln C]) with its ``risk``, ``delta`` in (0, 1) and ``answered_fraction`` in [0, 1]; a randomised
    method (aps, raps) has an integer ``seed``. A causal LM's ``token_threshold`` and ``sequence_threshold``
    are at least 0, its ``score`` entropy or mi.

    Raises:
        ValueError: one line naming the field, its value and the fix.
    """
    if calibration is None:
        return None
    if not isinstance(calibration, dict):
        raise ValueError(f"config.calibration must be an object (what `hydra-hf calibrate` stores), got "
                         f"{type(calibration).__name__}; {_RECALIBRATE}")

    def refuse(key: str, expected: str) -> None:
        raise ValueError(f"config.calibration {key} {calibration.get(key)!r} must be {expected}; {_RECALIBRATE}")

    def number(key: str, low: float, high: float, *, interval: str, optional: bool = False) -> float | None:
        value = calibration.get(key)
        if value is None and optional:
            return None
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or not low <= value <= high):
            refuse(key, f"a finite number in {interval}")
        return float(value)

    def integer(key: str, low: int, *, optional: bool = False) -> int | None:
        value = calibration.get(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            refuse(key, f"an integer >= {low}")
        return value

    def fraction(key: str, *, optional: bool = False) -> float | None:  # in (0, 1), both ends open
        value = number(key, 0.0, 1.0, interval="(0, 1)", optional=optional)
        if value is not None and not 0 < value < 1:
            refuse(key, "a finite number in (0, 1)")
        return value

    task = calibration.get("task")
    if task is not None and task not in CALIBRATION_TASKS:
        refuse("task", f"one of {list(CALIBRATION_TASKS)} or absent (a classifier's calibration)")
    fraction("alpha")
    integer("n", 1)
    if task == "causal_lm":
        if calibration.get("score") not in GENERATION_SCORE_NAMES:
            refuse("score", f"one of {list(GENERATION_SCORE_NAMES)} (a causal LM's token score)")
        for key in ("token_threshold", "sequence_threshold"):
            number(key, 0.0, math.inf, interval="[0, inf) (entropy and mutual information are >= 0)")
        return calibration
    method = calibration.get("method")
    if method not in CONFORMAL_METHODS:
        refuse("method", f"one of {list(CONFORMAL_METHODS)}")
    randomized = calibration.get("randomized", False)
    if not isinstance(randomized, bool) or (randomized and method not in RANDOMIZED_METHODS):
        refuse("randomized", f"true or false (true only for {' and '.join(RANDOMIZED_METHODS)}, not {method})")
    integer("seed", 0, optional=not randomized)
    penalty = number("penalty", 0.0, math.inf, interval="[0, inf)", optional=True) or 0.0
    rank = integer("regularization_rank", 0, optional=True)
    names = calibration.get("class_names")
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        refuse("class_names", "a list of class names")
    templates = calibration.get("templates")
    if templates is not None and (not isinstance(templates, list) or not all(isinstance(t, str) for t in templates)):
        refuse("templates", "a list of prompt templates")
    classes = len(names) if names else num_labels
    top = 1.0
    if method == "raps":
        top = math.inf if not classes else 1.0 + penalty * max(classes - (1 if rank is None else rank), 0)
    number("q_hat", 0.0, top + _SCORE_TOLERANCE, interval=f"[0, {top:g}] (the range of {method} scores)")
    number("temperature", 0.0, math.inf, interval="(0, inf)", optional=True)
    if calibration.get("temperature") == 0:
        refuse("temperature", "a finite number in (0, inf)")
    score = calibration.get("score", "msp")
    if score not in SELECTIVE_SCORES:
        refuse("score", f"one of {list(SELECTIVE_SCORES)}")
    selective = calibration.get("threshold") is not None  # a threshold comes with its risk and delta
    if selective:
        high = 1.0 if score == "msp" else (math.log(classes) if classes and classes > 1 else math.inf)
        number("threshold", 0.0, high + _SCORE_TOLERANCE, interval=f"[0, {high:.4g}] (the range of {score})")
    fraction("risk", optional=not selective)
    fraction("delta", optional=not selective)
    number("answered_fraction", 0.0, 1.0, interval="[0, 1]", optional=True)
    return calibration


class HydraEnsembleConfig(PretrainedConfig):
    r"""Configuration of a Hydra Ensemble built on a BERT encoder, and the base of every family's config.

    Args:
        base_model_type (`str`, *optional*): architecture of the base model, one of the class's
            ``supported_base_model_types`` (default: the first, ``"bert"`` here).
        base_config (`dict`): the base model's own configuration (``BertConfig.to_dict()``), nested. Its
            labels are dropped: the labels are this config's (``id2label``, ``num_labels`` ...).
        num_members (`int`): M, the number of members. Must equal ``len(kept_heads)``.
        kept_heads (`list[list[list[int]]]`): ``kept_heads[m][l]`` = sorted indices of the heads that
            member ``m`` keeps in layer ``l``. Members and layers may keep different numbers of heads,
            including 0.
        mlp_fusion (`str`): ``"average"`` (the paper's merged MLP: one MLP per layer whose weights are
            the members' average, shared by all members) or ``"per_member"`` (every member keeps its own
            MLP: the exact, larger variant).
        member_metadata (`list[dict]`, *optional*): how each member was built (method, seed, ...).
        kept_neurons (`list[list[list[int]]]`, *optional*): slim members (an extension beyond the paper):
            ``kept_neurons[m][l]`` = sorted indices of the MLP intermediate neurons member ``m`` keeps in layer
            ``l`` (may be empty). Each member then runs its own MLP over its kept neurons only (with
            ``mlp_fusion="average"``: its slice of the averaged MLP). Empty (the default): every member keeps
            the whole MLP, as in the paper.

    Labels (``id2label``, ``label2id``, ``num_labels``, ``problem_type``) are the usual
    ``PretrainedConfig`` arguments. The configuration validates itself when it is built: every error
    names the bad value and how to fix it.

    A family's config class is a subclass in its own file (``configuration_hydra_<family>.py``) that names its
    ``model_type`` and ``supported_base_model_types`` (the first is its default ``base_model_type``). One that adds
    no argument keeps this ``__init__`` with ``__init__ = HydraEnsembleConfig.__init__``: transformers makes every
    config class a dataclass, whose generated ``__init__`` would replace an inherited one.

    The base model's settings read through, as in transformers' composite configs: ``config.vocab_size``,
    ``config.pad_token_id``, ``config.hidden_dropout_prob`` ... are ``base_config``'s values and
    ``config.get_text_config()`` is the config itself. One set on the config (by
    ``resize_token_embeddings``, ``from_pretrained(folder, hidden_dropout_prob=0.2)``,
    ``HydraEnsembleConfig(..., vocab_size=...)``) is written into ``base_config`` (``sync_base_settings``)
    when the config is built or loaded, when a model is built from it, after ``resize_token_embeddings``
    and when it is saved, so that a saved folder rebuilds the same model. The attributes every transformers config has
    (``return_dict``, ``id2label``, ``dtype`` ...) and the Hydra fields above stay the Hydra config's own.
    """

    model_type = "hydra_ensemble"
    supported_base_model_types: tuple[str, ...] = BASE_MODEL_TYPES
    # Where the remote code finds the model classes (flat files next to config.json; ``AutoConfig`` is the
    # config class's own file, added by ``__init__``). Every config starts from it, so a model saved by any
    # path (save_pretrained, push_to_hub, Trainer) names all its heads; entries given in `auto_map` (e.g.
    # code kept in another repository, "org/repo--module.Class") win.
    hydra_auto_map: ClassVar[dict[str, str]] = {
        "AutoModel": "modeling_hydra_bert.HydraEnsembleModel",
        "AutoModelForSequenceClassification": "modeling_hydra_bert.HydraEnsembleForSequenceClassification",
    }
    # Trainer.predict / evaluate: `predictions` are the ensemble logits, as for a stock classifier; pass
    # `ignore_keys=[]` to get `(logits, member_logits)` (see docs/transformers.md).
    keys_to_ignore_at_inference = ["member_logits"]
    # whether the folder ships the softmax uncertainty pipelines (SigLIP's sigmoid scores do not fit them)
    hydra_uncertainty_pipelines: ClassVar[bool] = True

    def __init__(
        self,
        base_model_type: str | None = None,
        base_config: dict[str, Any] | None = None,
        num_members: int | None = None,
        kept_heads: list[list[list[int]]] | None = None,
        mlp_fusion: str = "average",
        member_metadata: list[dict[str, Any]] | None = None,
        kept_neurons: list[list[list[int]]] | None = None,
        **kwargs: Any,
    ) -> None:
        # a family's config class names its bases; the first is the default
        self.base_model_type = base_model_type or self.supported_base_model_types[0]
        self.kept_neurons = [[list(n) for n in member] for member in (kept_neurons or [])]
        self.base_config = without_base_labels(dict(base_config or {}))
        self.kept_heads = [[list(h) for h in member] for member in (kept_heads or [])]
        self.num_members = len(self.kept_heads) if num_members is None else num_members
        self.mlp_fusion = mlp_fusion
        self.member_metadata = list(member_metadata or [])
        # only the class's own map: a family config that inherits this class but ships other files gets
        # its map from the family registry when hydra_hf is imported, and from its config.json otherwise
        inherited = getattr(super(type(self), self), "hydra_auto_map", None)
        own_map = {} if self.hydra_auto_map is inherited else dict(self.hydra_auto_map)
        if own_map:  # the config class's own file: here, or the folder's copy loaded as remote code
            own_map = {"AutoConfig": f"{type(self).__module__.rsplit('.', 1)[-1]}.{type(self).__name__}", **own_map}
        kwargs["auto_map"] = {**own_map, **(kwargs.get("auto_map") or {})}
        if kwargs.get("custom_pipelines") is None:
            kwargs["custom_pipelines"] = (
                custom_pipelines_for(kwargs["auto_map"]) if self.hydra_uncertainty_pipelines else {}
            )
        super().__init__(**kwargs)
        self.sync_base_settings()  # base settings given as arguments (or at the top level of an older config.json)
        # PretrainedConfig.__init__ may be called with nothing (e.g. to build a default instance for
        # diffing when saving); only a config that names its members is validated.
        if self.kept_heads or self.base_config:
            self.validate_hydra()

    # ------------------------------------------------------------------- the base's settings
    @staticmethod
    def is_base_setting(name: str, base: dict[str, Any]) -> bool:
        """Whether ``name`` is one of the base model's settings: a public key of ``base`` (the base config
        dict) that is neither a Hydra field nor an attribute every transformers config has. The towers of
        a two-tower base (``text_config``, ``vision_config``) are not settings of their own: they stay
        in ``base_config``."""
        return (
            name in base
            and not name.startswith("_")
            and name not in _CONFIG_OWN_NAMES
            and not (name.endswith("_config") and isinstance(base[name], dict))
        )

    def base_settings(self) -> dict[str, Any]:
        """The base model's settings the config answers with: ``base_config`` or, for a config built without
        arguments (no ``base_config``, no kept heads: the instance transformers builds to diff a config
        against, or ``ConfigTester`` checks), the defaults of its base model type (``default_base_config``),
        so that such a config answers ``hidden_size`` or ``vocab_size`` as ``LlamaConfig()`` does. Nothing
        is written into ``base_config``: a saved config holds only what it was given."""
        base = getattr(self, "base_config", None)
        base_type = getattr(self, "base_model_type", None)
        members = (  # literal names: the shipped-code audit allows getattr only so
            getattr(self, "kept_heads", None), getattr(self, "vision_kept_heads", None),
            getattr(self, "text_kept_heads", None),
        )
        if base or any(members) or not isinstance(base_type, str):
            return base if isinstance(base, dict) else {}
        return default_base_config(base_type)

    def base_value(self, name: str) -> Any:
        """``base_settings()[name]``; ``AttributeError`` (so that ``hasattr`` answers False and ``getattr``
        with a default works) when the base's settings have no ``name``."""
        base = self.base_settings()
        if name not in base:
            raise AttributeError(
                f"{type(self).__name__} has no {name!r}: its base_config does not set it; pass the base model's "
                "full config (e.g. BertConfig.from_pretrained(base).to_dict())"
            )
        return base[name]

    def __getattr__(self, name: str) -> Any:
        # reached only when the normal lookup fails (a property raising AttributeError included): the base
        # model's settings read through
        if name not in ("base_config", "base_model_type", *_KEPT_HEADS_FIELDS) and not name.startswith("__"):
            base = self.base_settings()
            if self.is_base_setting(name, base):
                value = base[name]  # a default (shared by every such config) is handed out as a copy
                return value if base is getattr(self, "base_config", None) else copy.deepcopy(value)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (nor has its base_config)")

    def sync_base_settings(self) -> None:
        """Write the base settings set on this config (``config.vocab_size = ...`` by
        ``resize_token_embeddings``, ``from_pretrained(folder, hidden_dropout_prob=...)``) into
        ``base_config``, which the model reads. Runs when the config is built or loaded, when a model is
        built from it, after ``resize_token_embeddings`` and when it is saved (``to_dict``)."""
        base = getattr(self, "base_config", None)
        if isinstance(base, dict):
            base.update(self.to_dict()["base_config"])

    @classmethod
    def get_config_dict(
        cls, pretrained_model_name_or_path: Any, **kwargs: Any
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """transformers' ``get_config_dict``; a pipeline that opens the folder through a stock task name
        (``pipeline("text-classification", model=folder, trust_remote_code=True)``: ``from_pretrained`` gets the
        task as ``_from_pipeline``) logs one warning naming the Hydra task (:func:`warn_stock_task`)."""
        config_dict, unused = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        warn_stock_task(config_dict, kwargs.get("_from_pipeline"), pretrained_model_name_or_path)
        return config_dict, unused

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        """transformers' ``from_dict``; the overrides it sets after building the config
        (``from_pretrained(folder, hidden_dropout_prob=0.2)``) are written into ``base_config``."""
        out = super().from_dict(config_dict, **kwargs)
        (out[0] if isinstance(out, tuple) else out).sync_base_settings()
        return out

    def to_dict(self) -> dict[str, Any]:
        """The config as saved: a base setting set on this config is written into ``base_config`` (one
        place for it, where the model reads it), not at the top level. Members that keep whole MLPs write
        no ``kept_neurons`` (the file is the one written before slim members existed)."""
        out = super().to_dict()
        for name in ("kept_neurons", "vision_kept_neurons", "text_kept_neurons"):
            if name in out and not out[name]:
                del out[name]
        base = out.get("base_config")
        if isinstance(base, dict):
            for name in [key for key in out if self.is_base_setting(key, base)]:
                base[name] = out.pop(name)
        return out

    # ----------------------------------------------------------------------------------- checks
    def _tower_shape(self) -> tuple[int, int]:
        """(num_layers, num_heads) of the base model, read from ``base_config`` (``ValueError`` naming the
        missing keys; the properties turn it into ``AttributeError``)."""
        base = self.base_settings()
        missing = [k for k in ("num_hidden_layers", "num_attention_heads", "hidden_size") if k not in base]
        if missing:
            raise ValueError(
                f"base_config is missing {missing}; pass the base model's full config "
                "(e.g. BertConfig.from_pretrained(base).to_dict())"
            )
        return int(base["num_hidden_layers"]), int(base["num_attention_heads"])

    def _shape_attribute(self, index: int) -> int:
        """``_tower_shape()[index]`` for a property: a base without the value raises ``AttributeError``, the
        error ``hasattr`` and ``getattr(config, name, default)`` expect of a missing attribute."""
        try:
            return self._tower_shape()[index]
        except ValueError as err:
            raise AttributeError(str(err)) from None

    def _pruned_towers(self) -> dict[str, tuple[Any, int, int]]:
        """``{field: (kept_heads, num_layers, num_heads)}`` for every pruned tower, after checking the
        tower's shape in ``base_config``. A hook: two-tower subclasses (CLIP) return one entry per tower."""
        num_layers, num_heads = self._tower_shape()
        if self.base_config["hidden_size"] % num_heads:
            raise ValueError(
                f"hidden_size={self.base_config['hidden_size']} is not a multiple of "
                f"num_attention_heads={num_heads} in base_config"
            )
        return {"kept_heads": (self.kept_heads, num_layers, num_heads)}

    def validate_hydra(self) -> None:
        if self.base_model_type not in self.supported_base_model_types:
            raise ValueError(
                f"base_model_type={self.base_model_type!r} is not supported by {type(self).__name__}; "
                f"expected one of {list(self.supported_base_model_types)}"
            )
        if self.mlp_fusion not in MLP_FUSIONS:
            raise ValueError(f"mlp_fusion={self.mlp_fusion!r} is unknown; use one of {list(MLP_FUSIONS)}")
        towers = self._pruned_towers()
        if isinstance(self.num_members, bool) or not isinstance(self.num_members, int) or self.num_members < 1:
            raise ValueError(f"num_members must be a positive integer, got {self.num_members!r}")
        for field, (kept, num_layers, num_heads) in towers.items():
            if len(kept) != self.num_members:
                raise ValueError(
                    f"num_members={self.num_members} but {field} lists {len(kept)} members; "
                    f"give one {field} entry per member (or leave num_members out)"
                )
            check_kept_heads(kept, num_layers, num_heads, where=field)
            neurons = self._neurons_of_towers().get(field)
            if neurons:
                check_kept_neurons(neurons, self.num_members, num_layers, where=neurons_field(field))
        if self.member_metadata and len(self.member_metadata) != self.num_members:
            raise ValueError(
                f"member_metadata has {len(self.member_metadata)} entries for {self.num_members} members; "
                "give one dict per member or none"
            )

    # ------------------------------------------------------------------------------ accessors
    # The shape properties raise AttributeError, never another error, when the base lacks the value (a
    # property's AttributeError is what hasattr() and getattr(config, name, default) catch).
    @property
    def num_hidden_layers(self) -> int:
        return self._shape_attribute(0)

    @property
    def num_attention_heads(self) -> int:
        return self._shape_attribute(1)

    @property
    def hidden_size(self) -> int:
        return int(self.base_value("hidden_size"))

    def heads_per_layer(self) -> list[list[int]]:
        """``out[m][l]`` = number of heads member ``m`` keeps in layer ``l``."""
        return [[len(h) for h in member] for member in self.kept_heads]

    def kept_neurons_of(self, tower: str | None = None) -> list[list[list[int]]]:
        """``out[m][l]`` = MLP neurons member m keeps in layer l (empty list: every member keeps whole MLPs).
        One-tower configs ignore ``tower``."""
        return self.kept_neurons

    def _neurons_of_towers(self) -> dict[str, list[list[list[int]]]]:
        """``{kept-heads field: its kept_neurons}`` (a hook: two-tower subclasses return one entry per tower)."""
        return {"kept_heads": self.kept_neurons}

    @property
    def slim(self) -> bool:
        """Whether the members keep subsets of the MLP neurons (in any tower)."""
        return any(bool(neurons) for neurons in self._neurons_of_towers().values())


CLIP_TOWERS = ("vision", "text")


class HydraTwoTowerConfig(HydraEnsembleConfig):
    r"""What the configurations of Hydra Ensembles built on two-tower image-text models (CLIP, SigLIP: zero-shot
    image classification) share; each family's own class (``configuration_hydra_clip.py``,
    ``configuration_hydra_siglip.py``) names its ``model_type`` and base.

    Member m is the pair (vision tower m, text tower m); each tower is pruned separately.

    Args:
        base_config (`dict`): the base's config dict (``CLIPConfig.to_dict()``, ``SiglipConfig.to_dict()``) with
            nested ``vision_config`` and ``text_config``.
        vision_kept_heads (`list[list[list[int]]]`, *optional*): ``vision_kept_heads[m][l]`` = sorted
            heads member m keeps in layer l of the vision tower.
        text_kept_heads (`list[list[list[int]]]`, *optional*): the same for the text tower.
        vision_kept_neurons, text_kept_neurons (`list[list[list[int]]]`, *optional*): slim members' MLP neurons
            per tower (see ``HydraEnsembleConfig.kept_neurons``); empty: that tower's members keep whole MLPs.
        num_members (`int`, *optional*): M; read from the kept-heads lists when left out.

    A tower given no kept heads is not pruned: every member keeps all its heads (its weights are still
    per member, so members fine-tuned separately stay distinct). The other arguments are those of
    ``HydraEnsembleConfig``; ``kept_heads`` is not used (the heads are per tower).
    """

    # as for a stock CLIPModel, plus the members' own similarities
    keys_to_ignore_at_inference = [
        "member_logits_per_image", "member_logits_per_text", "member_text_embeds", "member_image_embeds"
    ]

    def __init__(
        self,
        base_config: dict[str, Any] | None = None,
        num_members: int | None = None,
        vision_kept_heads: list[list[list[int]]] | None = None,
        text_kept_heads: list[list[list[int]]] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("kept_heads", None)  # single-tower fields of the parent: heads and neurons are per tower here
        kwargs.pop("kept_neurons", None)
        self.vision_kept_neurons = [[list(n) for n in m] for m in (kwargs.pop("vision_kept_neurons", None) or [])]
        self.text_kept_neurons = [[list(n) for n in m] for m in (kwargs.pop("text_kept_neurons", None) or [])]
        self.vision_kept_heads = [[list(h) for h in member] for member in (vision_kept_heads or [])]
        self.text_kept_heads = [[list(h) for h in member] for member in (text_kept_heads or [])]
        if num_members is None:
            given = [len(k) for k in (self.vision_kept_heads, self.text_kept_heads) if k]
            num_members = given[0] if given else None
        if base_config and isinstance(num_members, int) and not isinstance(num_members, bool):
            for tower in CLIP_TOWERS:  # an unpruned tower: every member keeps every head
                if not getattr(self, f"{tower}_kept_heads"):
                    sub = base_config.get(f"{tower}_config") or {}
                    if "num_hidden_layers" in sub and "num_attention_heads" in sub:
                        everything = [list(range(int(sub["num_attention_heads"])))] * int(sub["num_hidden_layers"])
                        setattr(
                            self, f"{tower}_kept_heads", [[list(h) for h in everything] for _ in range(num_members)]
                        )
        super().__init__(base_config=base_config, num_members=num_members, **kwargs)

    def _tower_config(self, tower: str) -> dict[str, Any]:
        """``base_config[f"{tower}_config"]``, checked for the keys the model needs."""
        sub = self.base_settings().get(f"{tower}_config")
        if not isinstance(sub, dict):
            raise ValueError(
                f"base_config has no {tower}_config; pass the base model's full CLIPConfig "
                "(CLIPConfig.from_pretrained(base).to_dict())"
            )
        missing = [k for k in ("num_hidden_layers", "num_attention_heads", "hidden_size") if k not in sub]
        if missing:
            raise ValueError(f"base_config['{tower}_config'] is missing {missing}; pass the full CLIPConfig")
        return sub

    def _tower_shape(self, tower: str = "vision") -> tuple[int, int]:
        sub = self._tower_config(tower)
        return int(sub["num_hidden_layers"]), int(sub["num_attention_heads"])

    def _pruned_towers(self) -> dict[str, tuple[Any, int, int]]:
        out = {}
        for tower in CLIP_TOWERS:
            sub = self._tower_config(tower)
            num_layers, num_heads = self._tower_shape(tower)
            if sub["hidden_size"] % num_heads:
                raise ValueError(
                    f"hidden_size={sub['hidden_size']} is not a multiple of num_attention_heads={num_heads} "
                    f"in base_config['{tower}_config']"
                )
            out[f"{tower}_kept_heads"] = (getattr(self, f"{tower}_kept_heads"), num_layers, num_heads)
        return out

    @property
    def hidden_size(self) -> int:
        """Width of the vision tower (the text tower's is ``base_config['text_config']['hidden_size']``)."""
        try:
            return int(self._tower_config("vision")["hidden_size"])
        except ValueError as err:
            raise AttributeError(str(err)) from None

    def kept_heads_of(self, tower: str) -> list[list[list[int]]]:
        """``out[m][l]`` = heads member m keeps in layer l of ``tower`` (``"vision"`` or ``"text"``)."""
        if tower not in CLIP_TOWERS:
            raise ValueError(f"unknown tower {tower!r}; a CLIP Hydra Ensemble has towers {list(CLIP_TOWERS)}")
        return getattr(self, f"{tower}_kept_heads")

    def heads_per_layer(self, tower: str = "vision") -> list[list[int]]:
        """``out[m][l]`` = number of heads member ``m`` keeps in layer ``l`` of ``tower``."""
        return [[len(h) for h in member] for member in self.kept_heads_of(tower)]

    def kept_neurons_of(self, tower: str | None = None) -> list[list[list[int]]]:
        """``out[m][l]`` = MLP neurons member m keeps in layer l of ``tower`` (empty: whole MLPs)."""
        if tower not in CLIP_TOWERS:
            raise ValueError(f"unknown tower {tower!r}; a CLIP Hydra Ensemble has towers {list(CLIP_TOWERS)}")
        return self.vision_kept_neurons if tower == "vision" else self.text_kept_neurons

    def _neurons_of_towers(self) -> dict[str, list[list[list[int]]]]:
        return {"vision_kept_heads": self.vision_kept_neurons, "text_kept_heads": self.text_kept_neurons}

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.pop("kept_heads", None)  # the parent's single-tower fields, always empty here
        out.pop("kept_neurons", None)
        return out
