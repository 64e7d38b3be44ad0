"""``hydra-hf prune``: the head masks of M Hydra members, chosen on a model's ID (and OOD) data, written
as a masks file.

:func:`prune` reads a :class:`PruneSpec`, checks every option and input before anything is loaded, loads the
model (:func:`load_target`: a Hugging Face classifier, CLIP-like or causal LM folder or GGUF checkpoint, or an
open_clip / timm model from local weights) and calls :func:`build_members`, the one path from a model and its
data specs to :class:`~hydra_hf.masks.HeadMasks` that every recipe takes too: it resolves the data specs,
checks that the data suits the model (text or images; a zero-shot model's labels matched to its class names),
makes the batches and runs :func:`hydra_hf.pruning.diversity.prune_members`. What differs between models is
only how they are loaded, which :class:`~hydra_hf.pruning.members.PruningTarget` records.

Causal LMs (``*ForCausalLM``, ``GPT2LMHeadModel``) are pruned on next-token prediction
(:mod:`hydra_hf.pruning.lm`): the ID data is any text (its labels are the next tokens, a label column is not
read), batched with the folder's tokenizer and ``max_length``; Taylor scores the mean next-token loss, circuits
score next-token accuracy (``acc``), the AUROC of the per-sequence mean MSP of ID against OOD texts (``ood``)
and their mean (``avg``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer

from ..convert.gguf import checkpoint_inputs, is_gguf
from ..convert.io import from_pretrained
from ..data import (
    check_data_spec,
    data_spec_paths,
    make_image_loader,
    make_text_loader,
    read_class_names,
    resolve_dataset,
    zero_shot_class_names,
    zero_shot_labels,
    zero_shot_paths,
)
from ..errors import HydraUnsafeError
from ..families import detect_family, get_adapter, is_causal_lm_folder, resolve_checkpoint
from ..lazy import lazy_module
from ..masks import HeadMasks, load_masks
from ..outputs import check_output_file
from ..prompting import TEXT_FIELD, parse_label_words, read_zero_shot_prompts
from ..pruning.budget import Budget
from ..pruning.diversity import parse_methods, prune_members, uses_ood
from ..pruning.layout import HeadLayout
from ..pruning.loading import DEFAULT_PROMPT_TEMPLATE, class_prompts, load_open_clip, load_timm_vit
from ..pruning.members import PruningTarget, causal_lm_batches, load_pruning_target, load_zero_shot_lm_target
from ..pruning.neurons import check_mlp_keep
from ..pruning.zero_shot_lm import zero_shot_lm_batches

__all__ = ["TOWERS", "PruneSpec", "build_members", "load_target", "prune"]

logger = logging.getLogger(__name__)

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")
Data = Any  # a data spec (str, for resolve_dataset) or a datasets.Dataset already in standard columns

TOWERS = ("vision", "text", "joint")


@dataclass(frozen=True)
class PruneSpec:
    """What ``hydra-hf prune`` computes; one field per option of the command (same names, same defaults).

    Attributes:
        output: the masks file to write.
        id_data, ood_data: labelled ID data and OOD data (``circuit-ood`` / ``circuit-avg``), data specs.
        model: a Hugging Face checkpoint folder (text or ViT classifier, CLIP-like model, causal LM) or a GGUF
            checkpoint; or ``open_clip`` / ``timm``: a model name with its local ``checkpoint``.
        class_names, prompt_template: CLIP-like models' classes (default: an image folder's sub-folders) and
            their prompt (default ``"a photo of a {}."``); a causal LM with ``prompt``: its classes' names.
        prompt, label_words: a causal LM as a zero-shot classifier: the user message holding ``{text}`` (or a JSON
            file of one prompt) and each class's label words (comma-separated, alternatives with ``|``; default:
            ``class_names``); members are pruned on the cross-entropy of the label words' next-token distribution.
        tower: two-tower models: ``vision``, ``text`` or ``joint`` (default: joint).
        method: one pruning method or several, comma-separated (one member each).
        members, seed: members to compute; member m uses seed ``seed + m``.
        heads_per_layer, remove: the budget (exactly one): K heads kept in every layer, or N removed in all.
        text_column, ood_text_column, label_column, image_column: the columns of local files.
        max_samples, max_length, batch_size: data cap; tokens per text; examples per forward pass (default 32;
            causal LMs 8).
        num_labels: classes of a checkpoint without a trained classifier head.
        temperature, data_fraction, heads_per_step, taylor_rounds: the methods' settings (``taylor_rounds``
            None: the paper's recomputes, after every layer of a per-layer budget).
        mlp_keep, mlp_spread: slim members: the fraction of each layer's MLP neurons every member keeps.
        include_masks: a masks file whose members are added unchanged.
        no_fast, circuit_precision, no_progress: circuits: the full model per candidate; fp32 / screened /
            bf16 scores; no progress bars.
        overwrite: replace ``output`` when it is a masks file.
        trust_remote_code: allow a ``model`` folder that ships its own code.

    Raises:
        ValueError: a method that needs ``ood_data`` without it, a bad budget or count, ``mlp_spread`` without
            ``mlp_keep``, weights without their model or a model without its weights, an unknown tower, a
            prompt template without one ``{}``: one line naming the option and the fix.
    """

    output: str | os.PathLike
    id_data: str
    model: str | None = None
    open_clip: str | None = None
    timm: str | None = None
    checkpoint: str | None = None
    class_names: str | None = None
    prompt_template: str | None = None
    prompt: str | None = None
    label_words: str | None = None
    tower: str | None = None
    method: str = "taylor"
    members: int = 3
    heads_per_layer: int | None = None
    remove: int | None = None
    seed: int = 0
    ood_data: str | None = None
    text_column: str = "text"
    ood_text_column: str | None = None
    label_column: str | None = None
    image_column: str | None = None
    max_samples: int | None = None
    max_length: int = 128
    batch_size: int | None = None
    num_labels: int | None = None
    temperature: float | None = None
    data_fraction: float | None = None
    heads_per_step: int = 1
    taylor_rounds: int | None = None
    mlp_keep: float | None = None
    mlp_spread: bool = False
    include_masks: str | None = None
    no_fast: bool = False
    circuit_precision: str = "fp32"
    no_progress: bool = False
    overwrite: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.model, self.open_clip, self.timm)) != 1:
            raise ValueError("give one model: --model DIR, --open-clip NAME or --timm NAME")
        if uses_ood(self.method) and not self.ood_data:
            raise ValueError(
                f"--method {self.method} needs OOD validation data; give --ood-data (e.g. "
                "guardian_headlines:ood_validation)"
            )
        self.budget()
        if self.members < 0:
            raise ValueError(f"--members must be >= 0, got {self.members}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.mlp_keep is not None:
            check_mlp_keep(self.mlp_keep)
        elif self.mlp_spread:
            raise ValueError("--mlp-spread spreads slim members over the MLP; give --mlp-keep F too")
        if self.checkpoint and not (self.open_clip or self.timm):
            raise ValueError(
                "--checkpoint gives the weights of --open-clip / --timm models; a --model folder holds its own"
            )
        if (self.open_clip or self.timm) and not self.checkpoint:
            flag = "--open-clip" if self.open_clip else "--timm"
            raise ValueError(f"{flag} needs --checkpoint PATH: the local weights of the model (nothing is downloaded)")
        if self.tower is not None and self.tower not in TOWERS:
            raise ValueError(f"unknown --tower {self.tower!r}; choose one of {', '.join(TOWERS)}")
        if self.prompt_template is not None:
            class_prompts(["x"], self.prompt_template)  # ValueError for a template without exactly one {}
        if self.label_words and not self.prompt:
            raise ValueError("--label-words names the answers of a --prompt; give the prompt too, or drop "
                             "--label-words")

    def budget(self) -> Budget:
        """Every member's budget."""
        return Budget(heads_per_layer=self.heads_per_layer, remove=self.remove)


def prune(spec: PruneSpec) -> tuple[HeadMasks, Path]:
    """Compute ``spec``'s members and write their masks file; returns the masks and the file written."""
    output = check_output_file(spec.output, overwrite=spec.overwrite, accept=_is_masks_file, what="--output")
    _check_not_an_input(output, spec)
    _check_source(spec)
    for data in [s for s in (spec.id_data, spec.ood_data) if s]:  # the data files, before the model is loaded
        check_data_spec(data)
    include = load_masks(spec.include_masks) if spec.include_masks else None

    target = load_target(spec)
    base = spec.model or spec.checkpoint
    metadata: dict[str, Any] = {
        "base_model": str(base),
        "id_data": spec.id_data,
        "ood_data": spec.ood_data,
    }
    if target.causal_lm:
        metadata["task"] = "causal_lm"
        metadata["max_length"] = spec.max_length
    else:
        metadata["num_labels"] = target.num_labels
    if spec.open_clip or spec.timm:
        metadata["architecture"] = {"open_clip": spec.open_clip} if spec.open_clip else {"timm": spec.timm}
    if target.zero_shot:
        metadata["class_names"] = list(target.label2id or {})
        if target.prompt is not None:  # a causal LM pruned on a prompt's label words
            metadata["prompt"] = dataclasses.asdict(target.prompt)
            metadata["max_length"] = spec.max_length
        else:
            metadata["prompt_template"] = spec.prompt_template or "a photo of a {}."
    masks = build_members(
        target,
        method=parse_methods(spec.method),
        budget=spec.budget(),
        id_data=spec.id_data,
        ood_data=spec.ood_data,
        members=spec.members,
        seed=spec.seed,
        tower=spec.tower,
        max_samples=spec.max_samples,
        text_column=spec.text_column,
        ood_text_column=spec.ood_text_column,
        label_column=spec.label_column or "label",
        image_column=spec.image_column,
        batch_size=spec.batch_size or (8 if target.causal_lm or target.prompt is not None else 32),
        max_length=spec.max_length,
        temperature=spec.temperature,
        data_fraction=spec.data_fraction,
        heads_per_step=spec.heads_per_step,
        taylor_rounds=spec.taylor_rounds,
        include=include,
        fast=not spec.no_fast,
        precision=spec.circuit_precision,
        progress=not spec.no_progress,
        metadata=metadata,
        mlp_keep=spec.mlp_keep,
        mlp_spread=spec.mlp_spread,
    )
    masks.save(output)
    return masks, output


def _check_source(spec: PruneSpec) -> None:
    """The checks of the model's files, before anything is loaded."""
    if spec.checkpoint and not Path(spec.checkpoint).exists():
        raise FileNotFoundError(
            f"--checkpoint {spec.checkpoint!r} does not exist; give the local weights file or folder"
        )
    if (spec.prompt or spec.label_words) and not (spec.model and is_causal_lm_folder(spec.model)):
        flag = "--prompt" if spec.prompt else "--label-words"
        raise ValueError(f"{flag} prunes a causal LM as a zero-shot classifier; give a causal LM (...ForCausalLM "
                         "folder or a GGUF checkpoint) as --model, or drop it")
    if spec.model and is_causal_lm_folder(spec.model) and not spec.prompt:
        if spec.label_column is not None:
            raise ValueError(
                f"--label-column {spec.label_column!r} does not apply to the causal LM {spec.model!r}: its labels "
                "are the next tokens of the --id-data texts; drop --label-column"
            )
        if spec.num_labels is not None:
            raise ValueError(
                f"--num-labels {spec.num_labels} does not apply to the causal LM {spec.model!r} (pruned on "
                "next-token prediction); drop --num-labels"
            )
        if spec.max_length < 2:
            raise ValueError(
                f"--max-length {spec.max_length}: a causal LM needs at least 2 tokens per sequence (a token "
                "and its successor); use e.g. --max-length 128"
            )
    if spec.class_names is not None:
        read_class_names(spec.class_names)  # ValueError for an empty list or a name given twice


def _hf_config(path: str, trust_remote_code: bool = False) -> tuple[Any, Path]:
    """The config of ``--model`` and the folder it is read from (a GGUF checkpoint's cached plain folder)."""
    if not Path(path).exists():
        raise FileNotFoundError(
            f"--model {path!r} does not exist; pass a Hugging Face checkpoint folder or a .gguf file"
        )
    folder = resolve_checkpoint(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"--model {path!r} is not a Hugging Face checkpoint folder (no config.json there) nor a GGUF checkpoint"
        )
    return from_pretrained(AutoConfig, folder, trust_remote_code=trust_remote_code), folder


def _clip_text_inputs(
    adapter_kind: str, tokenize: Callable[[list[str]], Any], spec: PruneSpec
) -> tuple[Any, list[str]]:
    # --class-names, else the sub-folders of an image folder given as --id-data
    names = zero_shot_class_names(spec.class_names, spec.id_data, model=f"a CLIP model ({adapter_kind})")
    if not spec.class_names:
        logger.info("class names from the image folder %r: %s", spec.id_data, ", ".join(names))
    prompts = class_prompts(names, spec.prompt_template or DEFAULT_PROMPT_TEMPLATE)
    return tokenize(prompts), names


def load_target(spec: PruneSpec) -> PruningTarget:
    """The model ``spec`` names, loaded for member selection: an open_clip or timm model from its local
    weights, a CLIP-like folder with its class prompts (zero-shot), or a Hugging Face classifier or causal LM
    folder (:func:`~hydra_hf.pruning.members.load_pruning_target`)."""
    if spec.prompt_template and spec.timm:
        raise ValueError("--prompt-template applies to CLIP models (zero-shot); a timm classifier has its own head")
    if spec.open_clip:
        model, preprocess, tokenize = load_open_clip(spec.open_clip, spec.checkpoint)
        tokens, names = _clip_text_inputs("open_clip", tokenize, spec)
        adapter = get_adapter(model, class_text_inputs=tokens)  # tokens: (C, T)
        return PruningTarget(adapter, preprocess, None, len(names), {n: i for i, n in enumerate(names)}, True)
    if spec.timm:
        model, transform, label_names = load_timm_vit(spec.timm, spec.checkpoint)
        label2id = {str(n): i for i, n in enumerate(label_names)} if label_names else None
        return PruningTarget(get_adapter(model), transform, None, model.num_classes, label2id, False)

    config, folder = _hf_config(spec.model, spec.trust_remote_code)
    if spec.prompt:
        if spec.num_labels is not None or spec.prompt_template:
            flag = "--num-labels" if spec.num_labels is not None else "--prompt-template"
            raise ValueError(f"{flag} does not apply with --prompt: the classes are the label words'; drop {flag}")
        names = read_class_names(spec.class_names) if spec.class_names else None
        words = parse_label_words(spec.label_words) or ([[n] for n in names] if names else None)
        prompts = read_zero_shot_prompts([spec.prompt], words)
        if len(prompts) != 1:
            raise ValueError(f"--prompt {spec.prompt!r} holds {len(prompts)} prompts; members are pruned on one")
        return load_zero_shot_lm_target(folder, prompts[0], class_names=names,
                                        trust_remote_code=spec.trust_remote_code)
    family = detect_family(folder)  # refuses unknown layouts and task heads the family does not build
    if family.task == "zero-shot-image-classification":
        if spec.num_labels is not None:
            raise ValueError("--num-labels does not apply to a CLIP model; its classes are --class-names")
        model = from_pretrained(AutoModel, folder).eval()  # CLIPModel, SiglipModel, ...
        try:
            tokenizer, image_processor = (
                AutoTokenizer.from_pretrained(folder),
                AutoImageProcessor.from_pretrained(folder),
            )
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"--model {spec.model!r} needs its tokenizer and image processor for zero-shot pruning "
                f"(save them with CLIPProcessor.save_pretrained): {exc}"
            ) from None
        prompt_kwargs = family.prompt_tokenizer_kwargs_for(model.config)
        tokenize = lambda p: dict(tokenizer(p, return_tensors="pt", **prompt_kwargs))  # noqa: E731
        tokens, names = _clip_text_inputs(family.name, tokenize, spec)
        adapter = get_adapter(
            model, class_text_inputs={k: tokens[k] for k in ("input_ids", "attention_mask") if k in tokens}
        )
        transform = lambda image: image_processor(image, return_tensors="pt")["pixel_values"][0]  # noqa: E731
        return PruningTarget(adapter, transform, None, len(names), {n: i for i, n in enumerate(names)}, True)
    if spec.class_names or spec.prompt_template:
        raise ValueError(
            f"--class-names / --prompt-template apply to CLIP models; {spec.model!r} is a {config.model_type} model, "
            "not a CLIP one"
        )
    return load_pruning_target(folder, num_labels=spec.num_labels, trust_remote_code=spec.trust_remote_code)


def _is_masks_file(path: Path) -> bool:
    """Whether ``path`` holds a masks file (what ``--overwrite`` may replace)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == "hydra-head-masks"


def _check_not_an_input(output: Path, spec: PruneSpec) -> None:
    """The masks file may not replace (or be) one of the files this command reads."""
    real = output.resolve()
    read = {"model": [spec.model], "checkpoint": [spec.checkpoint], "open_clip": [spec.open_clip],
            "include_masks": [spec.include_masks], "class_names": zero_shot_paths(spec.class_names),
            "prompt": [spec.prompt] if spec.prompt and TEXT_FIELD not in spec.prompt else [],
            "id_data": data_spec_paths(spec.id_data), "ood_data": data_spec_paths(spec.ood_data)}
    for name, paths in read.items():
        for value in paths:
            if value and Path(value).exists() and Path(value).resolve() == real:
                raise HydraUnsafeError(
                    f"--output {str(output)!r} is the --{name.replace('_', '-')} input; choose another file"
                )
    if spec.model and is_gguf(spec.model):  # a GGUF file's folder and the cache of its plain copy are inputs too
        for folder in checkpoint_inputs(spec.model)[2:]:
            if folder.resolve() in real.parents:
                raise HydraUnsafeError(
                    f"--output {str(output)!r} lies inside {str(folder)!r}, an input of the GGUF --model; choose a "
                    "file outside it"
                )


def build_members(
    target: PruningTarget | str | os.PathLike,
    *,
    method: str | Sequence[str],
    budget: Budget,
    id_data: Data,
    ood_data: Data | None = None,
    members: int = 3,
    seed: int = 0,
    tower: str | None = None,
    max_samples: int | None = None,
    text_column: str = "text",
    ood_text_column: str | None = None,
    label_column: str = "label",
    image_column: str | None = None,
    batch_size: int = 32,
    max_length: int = 128,
    device: str | torch.device | None = None,
    temperature: float | None = None,
    data_fraction: float | None = None,
    heads_per_step: int = 1,
    taylor_rounds: int | None = None,
    include: HeadMasks | None = None,
    fast: bool = True,
    precision: str = "fp32",
    progress: bool = True,
    metadata: dict[str, Any] | None = None,
    mlp_keep: float | None = None,
    mlp_spread: bool = False,
    heads: HeadMasks | None = None,
) -> HeadMasks:
    """Choose the heads of ``members`` Hydra members of a model from its ID (and OOD) data.

    Args:
        target: the loaded model (:class:`~hydra_hf.pruning.members.PruningTarget`), or a Hugging Face text /
            image classifier folder, a decoder causal LM folder or a GGUF checkpoint
            (:func:`~hydra_hf.pruning.members.load_pruning_target`).
        method: one pruning method or several, comma-separated or a list (one member each, cycled).
        budget: every member's budget.
        id_data: labelled ID validation data: a data spec (``NAME[:SPLIT]``, a file or a folder,
            resolved with the column options and ``max_samples``; a zero-shot model's labels are
            matched to its class names) or a dataset already in the standard columns (``text`` or
            ``image``, integer ``label``), taken as it is. A causal LM reads only the texts (its labels
            are the next tokens; ``label_column`` is not read).
        ood_data: OOD validation data (``circuit-ood`` / ``circuit-avg``), a spec or a dataset.
        members: members to compute; member ``m`` uses seed ``seed + m``.
        tower: two-tower models: ``"vision"``, ``"text"`` or ``"joint"`` (default: joint).
        max_samples: use at most this many ID (and OOD) examples of a data spec (the first ones).
        text_column / ood_text_column / label_column / image_column: the columns of local files
            (``ood_text_column`` defaults to ``text_column``; image models read no text column).
        batch_size / max_length: examples per forward pass while scoring; tokens per text.
        device: where the batches go (None: where the data loader makes them, the CPU).
        temperature, data_fraction, heads_per_step, taylor_rounds, include, fast, precision,
        progress, metadata, mlp_keep, mlp_spread, heads: passed to :func:`~hydra_hf.pruning.diversity.prune_members`
            (``mlp_keep``: slim members keep that fraction of every layer's MLP neurons too; ``heads``: the masks
            of an earlier call with the same seed and data, whose heads the slim members keep).

    Returns:
        The masks (not saved: the caller writes them).
    """
    methods = parse_methods(method)
    if mlp_keep is not None:
        check_mlp_keep(mlp_keep)  # before the model loads
    if not isinstance(target, PruningTarget):
        target = load_pruning_target(target)
    adapter = target.adapter
    tower = tower or ("joint" if len(adapter.towers) > 1 else None)
    HeadLayout.of(adapter, tower).check(budget)  # ValueError for joint on one tower / an unknown tower

    image_model = target.modality == "image"
    data_kwargs: dict[str, Any] = dict(text_column=None if image_model else text_column, image_column=image_column,
                                       max_samples=max_samples)
    id_spec = id_data if isinstance(id_data, str) else None
    causal_lm = target.causal_lm
    if isinstance(id_data, str):
        id_data = resolve_dataset(
            id_data,
            label_column=None if causal_lm else label_column,
            label2id=None if causal_lm else target.label2id,
            num_labels=None if target.zero_shot or causal_lm else target.num_labels,
            require_labels=not causal_lm and any(m != "random" for m in methods),
            **data_kwargs,
        )
    if isinstance(ood_data, str):
        ood_kwargs = {**data_kwargs}
        if ood_text_column and not image_model:
            ood_kwargs["text_column"] = ood_text_column
        ood_data = resolve_dataset(ood_data, label_column=None, **ood_kwargs) if ood_data else None
    for name, data in (("--id-data", id_data), ("--ood-data", ood_data)):
        if data is not None and target.modality not in data.column_names:
            raise ValueError(
                f"the model reads {target.modality}s but {name} has columns {data.column_names}; "
                + ("give an image folder or --image-column" if image_model else "give text data (--text-column)")
            )
    if id_spec is not None and target.zero_shot and "label" in id_data.column_names:
        id_data = zero_shot_labels(id_data, list(target.label2id or {}), f"--id-data {id_spec!r}")
    logger.info("ID data: %d examples%s", len(id_data), f"; OOD data: {len(ood_data)}" if ood_data is not None else "")

    def make_batches(dataset: datasets.Dataset, seed: int) -> list[dict[str, torch.Tensor]]:
        if target.prompt is not None:  # a causal LM as a zero-shot classifier: the texts inside its prompt
            batches = zero_shot_lm_batches(target.tokenizer, target.prompt, dataset, batch_size=batch_size,
                                           max_text_tokens=max_length)
            return batches if device is None else [{k: v.to(device) for k, v in b.items()} for b in batches]
        if causal_lm:
            batches = causal_lm_batches(target, dataset, max_length=max_length, batch_size=batch_size,
                                        what="the ID / OOD texts (--id-data / --ood-data)")
            return batches if device is None else [{k: v.to(device) for k, v in b.items()} for b in batches]
        if image_model:
            loader = make_image_loader(dataset, target.transform, batch_size)
        else:
            loader = make_text_loader(dataset, target.tokenizer, batch_size, max_length)
        if device is None:
            return list(loader)
        return [{k: v.to(device) for k, v in batch.items()} for batch in loader]

    return prune_members(
        adapter,
        methods=methods,
        budget=budget,
        make_batches=make_batches,
        id_data=id_data,
        ood_data=ood_data,
        members=members,
        seed=seed,
        tower=tower,
        temperature=temperature,
        data_fraction=data_fraction,
        heads_per_step=heads_per_step,
        taylor_rounds=taylor_rounds,
        include=include,
        fast=fast,
        precision=precision,
        progress=progress,
        metadata=metadata,
        mlp_keep=mlp_keep,
        mlp_spread=mlp_spread,
        heads=heads,
    )
