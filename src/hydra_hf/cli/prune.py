"""`hydra-hf prune`: compute the head masks of M Hydra members and write the masks file.

Example::

    hydra-hf prune --model ./minilm --method circuit-avg --members 3 --remove 36 --seed 0 \\
        --id-data rotten_tomatoes:validation --ood-data guardian_headlines:ood_validation \\
        --output masks.json

Models:

- ``--model DIR``: a Hugging Face checkpoint folder: a text classifier (BERT-like, or a decoder
  ``*ForSequenceClassification``), a ViT image classifier, a ``CLIPModel`` (detected from
  ``config.json``), pruned as a zero-shot classifier, or a decoder causal LM (``LlamaForCausalLM``,
  ``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``GPT2LMHeadModel``), pruned on
  next-token prediction; or a GGUF checkpoint (a ``.gguf`` file or a folder holding one), a causal LM read
  through its cached plain folder (:func:`hydra_hf.families.resolve_checkpoint`);
- ``--open-clip NAME --checkpoint PATH``: an open_clip CLIP model (a model name such as ``ViT-B-32``,
  or a local ``open_clip_config.json`` / a folder holding one) with local weights, zero-shot;
- ``--timm NAME --checkpoint PATH``: a timm ViT image classifier with local weights (a file, or a
  ``save_for_hf`` folder whose ``model_args`` are used). Nothing is downloaded.

CLIP models classify images zero-shot: ``--class-names`` (comma-separated, or a file with one name
per line, in label order; an image folder as ``--id-data`` names them itself) and ``--prompt-template`` (default ``"a
photo of a {}."``) give the class prompts; label values must be ``0 .. C-1`` (or the class names themselves;
image-folder classes are matched by name). ``--tower joint`` (the default for two-tower models) selects every member's
heads over both towers at once (``--remove N`` counts the heads of both, ``--heads-per-layer K`` applies
to every layer of each); ``--tower vision`` / ``text`` prunes one tower and keeps the other whole.
CLIP masks are written in the two-tower format that ``hydra-hf convert`` reads; the file is written
atomically, never half.

Causal LMs read only texts: ``--id-data`` (and ``--ood-data`` for circuit-ood / circuit-avg) are any
text data (the ``--text-column`` of local files, or an embedded corpus), tokenized with the folder's
tokenizer and cut to ``--max-length`` tokens; the labels are the next tokens. Taylor scores the mean
next-token loss; circuit-acc scores next-token accuracy, circuit-ood the AUROC of each sequence's mean
maximum softmax probability (ID against OOD texts), circuit-avg their mean. ``--label-column`` and
``--num-labels`` are refused (an error, not ignored: they mean a classifier was intended). The masks
count query heads; ``hydra-hf convert`` then builds the fused causal LM.

The command is a thin layer over :func:`hydra_hf.pruning.build_members` (data specs -> masks, the
function every recipe calls) and :mod:`hydra_hf.pruning.loading` (open_clip / timm models and class
prompts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer

from ..convert.gguf import checkpoint_inputs, is_gguf
from ..convert.io import from_pretrained
from ..data import check_data_spec, data_spec_paths, read_class_names, zero_shot_class_names, zero_shot_paths
from ..errors import HydraUnsafeError
from ..families import detect_family, get_adapter, is_causal_lm_folder, resolve_checkpoint
from ..masks import load_masks
from ..outputs import check_output_file
from ..prompting import TEXT_FIELD, parse_label_words, read_zero_shot_prompts
from ..pruning.budget import Budget
from ..pruning.diversity import PRUNING_METHODS, parse_methods, uses_ood
from ..pruning.loading import DEFAULT_PROMPT_TEMPLATE, class_prompts, load_open_clip, load_timm_vit
from ..pruning.members import PruningTarget, build_members, load_pruning_target, load_zero_shot_lm_target
from ..pruning.neurons import check_mlp_keep
from . import finite_float, non_negative_int, positive_int

logger = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "prune",
        help="choose the heads every member keeps (Taylor / circuits / random) and write masks.json",
        description=__doc__.split("\n\n")[0],
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="Hugging Face checkpoint folder (text classifier, ViT classifier, CLIPModel, "
                        "causal LM) or a GGUF checkpoint (a .gguf file or a folder holding one)")
    source.add_argument(
        "--open-clip",
        metavar="NAME",
        help="open_clip model name (e.g. ViT-B-32) or local open_clip_config.json; weights from --checkpoint",
    )
    source.add_argument(
        "--timm", metavar="NAME", help="timm ViT architecture (e.g. vit_base_patch16_224); weights from --checkpoint"
    )
    p.add_argument(
        "--checkpoint",
        help="local weights of --open-clip / --timm: a .safetensors/.bin/.pt file or a checkpoint folder",
    )
    p.add_argument(
        "--class-names",
        help="CLIP (or a causal LM with --prompt): class names in label order, comma-separated or a file with one "
        "per line (default with an image folder as --id-data: its sub-folders)",
    )
    p.add_argument("--prompt-template", default=None, help='CLIP: prompt of each class (default "a photo of a {}.")')
    p.add_argument("--prompt", default=None, metavar="TEMPLATE|FILE",
                   help="a causal LM as a zero-shot classifier: the user message holding {text} (or a JSON file of "
                   "one prompt, as `hydra-hf evaluate --prompt` reads it); members are pruned on the cross-entropy of "
                   "the label words' next-token distribution, renormalised over the classes, on labelled --id-data")
    p.add_argument("--label-words", default=None, metavar="WORDS",
                   help="--prompt: each class's label word, comma-separated in label order, alternatives with | "
                   "(default: --class-names)")
    p.add_argument("--tower", help="two-tower models: vision, text or joint (default joint: both towers together)")
    p.add_argument(
        "--method",
        default="taylor",
        help="pruning method, or several comma-separated (one member each): "
        + "; ".join(f"{m.name}: {m.help}" for m in PRUNING_METHODS.values()),
    )
    p.add_argument("--members", type=non_negative_int, default=3, help="members to compute (default 3)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--heads-per-layer", type=non_negative_int, help="keep K heads in every layer")
    budget.add_argument("--remove", type=non_negative_int, help="remove N heads in total (anywhere)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of member 0; member m uses seed+m")
    p.add_argument("--id-data", required=True, help="labelled ID data: file, save_to_disk folder or NAME[:SPLIT] "
                   "(a causal LM: any texts; the labels are the next tokens)")
    p.add_argument("--ood-data", help="OOD data (needed by circuit-ood and circuit-avg)")
    p.add_argument(
        "--text-column", default="text", help="column holding the text of csv/jsonl/parquet data (default: text)"
    )
    p.add_argument("--ood-text-column", help="text column of --ood-data (default: --text-column)")
    p.add_argument(
        "--label-column",
        default=None,
        help="column holding the integer class (or class name) of --id-data (default: label; not for causal LMs)",
    )
    p.add_argument("--image-column", help="image column (image data); image folders need none")
    p.add_argument("--max-samples", type=positive_int, help="use at most this many ID (and OOD) examples")
    p.add_argument(
        "--max-length", type=positive_int, default=128,
        help="max tokens per text (default 128; a causal LM: per sequence)"
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="examples per forward pass while scoring (default 32; causal LMs 8: their logits are B x T x V)",
    )
    p.add_argument("--num-labels", type=positive_int, help="classes of a checkpoint without a trained classifier head")
    p.add_argument(
        "--temperature", type=finite_float, help="Taylor sampling temperature (default 1 for several members)"
    )
    p.add_argument(
        "--data-fraction", type=finite_float, help="fraction of the data per member (default 0.8 for several)"
    )
    p.add_argument("--heads-per-step", type=positive_int, default=1,
                   help="circuit heads removed per step (1 = exact greedy)")
    p.add_argument("--taylor-rounds", type=positive_int, default=None,
                   help="Taylor's recomputes (default: the paper's, after every layer of a --heads-per-layer budget, "
                        "one ranking of a --remove budget); with --heads-per-layer, R recomputes over R groups of "
                        "consecutive layers (1: every layer from one gradient pass)")
    p.add_argument("--mlp-keep", type=finite_float, metavar="F",
                   help="slim members (an extension): every member also keeps this fraction of each layer's MLP "
                        "neurons, by Taylor importance on its own data (e.g. 0.33: 3 members at about one model's "
                        "compute); default: whole MLPs, as in the paper")
    p.add_argument("--mlp-spread", action="store_true",
                   help="with --mlp-keep: members prefer the neurons earlier members left (they cover the MLP)")
    p.add_argument(
        "--include-masks",
        help="masks file whose members are added to the output unchanged (two-tower for --tower joint)",
    )
    p.add_argument("--no-fast", action="store_true", help="circuits: re-run the full model per candidate")
    p.add_argument(
        "--circuit-precision",
        default="fp32",
        choices=["fp32", "screened", "bf16"],
        help="circuits on BERT: fp32 scores every candidate in float32; screened scores in bf16 and re-scores "
        "every candidate near the best in float32 (decisions on float32 scores; faster only when few "
        "candidates are near-tied); bf16 is approximate (default: fp32)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --output file if it is a masks file (never any other file)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a --model folder that ships its own Python code (auto_map); off by "
                   "default because loading runs that code")
    p.add_argument("--output", required=True, help="masks file to write (JSON)")
    p.set_defaults(func=run)
    return p


TOWERS = ("vision", "text", "joint")


def _check_source(args: argparse.Namespace) -> None:
    """Cheap argument checks, before anything is loaded."""
    if args.checkpoint and not (args.open_clip or args.timm):
        raise ValueError(
            "--checkpoint gives the weights of --open-clip / --timm models; a --model folder holds its own"
        )
    if (args.open_clip or args.timm) and not args.checkpoint:
        flag = "--open-clip" if args.open_clip else "--timm"
        raise ValueError(f"{flag} needs --checkpoint PATH: the local weights of the model (nothing is downloaded)")
    if args.checkpoint and not Path(args.checkpoint).exists():
        raise FileNotFoundError(
            f"--checkpoint {args.checkpoint!r} does not exist; give the local weights file or folder"
        )
    if (args.prompt or args.label_words) and not (args.model and is_causal_lm_folder(args.model)):
        flag = "--prompt" if args.prompt else "--label-words"
        raise ValueError(f"{flag} prunes a causal LM as a zero-shot classifier; give a causal LM (...ForCausalLM "
                         "folder or a GGUF checkpoint) as --model, or drop it")
    if args.label_words and not args.prompt:
        raise ValueError("--label-words names the answers of a --prompt; give the prompt too, or drop --label-words")
    if args.model and is_causal_lm_folder(args.model) and not args.prompt:
        if args.label_column is not None:
            raise ValueError(
                f"--label-column {args.label_column!r} does not apply to the causal LM {args.model!r}: its labels "
                "are the next tokens of the --id-data texts; drop --label-column"
            )
        if args.num_labels is not None:
            raise ValueError(
                f"--num-labels {args.num_labels} does not apply to the causal LM {args.model!r} (pruned on "
                "next-token prediction); drop --num-labels"
            )
        if args.max_length < 2:
            raise ValueError(
                f"--max-length {args.max_length}: a causal LM needs at least 2 tokens per sequence (a token "
                "and its successor); use e.g. --max-length 128"
            )
    if args.tower is not None and args.tower not in TOWERS:
        raise ValueError(f"unknown --tower {args.tower!r}; choose one of {', '.join(TOWERS)}")
    if args.prompt_template is not None:
        class_prompts(["x"], args.prompt_template)  # ValueError for a template without exactly one {}
    if args.class_names is not None:
        read_class_names(args.class_names)  # ValueError for an empty list or a name given twice


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
    adapter_kind: str, tokenize: Callable[[list[str]], Any], args: argparse.Namespace
) -> tuple[Any, list[str]]:
    # --class-names, else the sub-folders of an image folder given as --id-data
    names = zero_shot_class_names(args.class_names, args.id_data, model=f"a CLIP model ({adapter_kind})")
    if not args.class_names:
        print(f"class names from the image folder {args.id_data!r}: {', '.join(names)}")
    prompts = class_prompts(names, args.prompt_template or DEFAULT_PROMPT_TEMPLATE)
    return tokenize(prompts), names


def _load_target(args: argparse.Namespace) -> PruningTarget:
    if args.prompt_template and args.timm:
        raise ValueError("--prompt-template applies to CLIP models (zero-shot); a timm classifier has its own head")
    if args.open_clip:
        model, preprocess, tokenize = load_open_clip(args.open_clip, args.checkpoint)
        tokens, names = _clip_text_inputs("open_clip", tokenize, args)
        adapter = get_adapter(model, class_text_inputs=tokens)  # tokens: (C, T)
        return PruningTarget(adapter, preprocess, None, len(names), {n: i for i, n in enumerate(names)}, True)
    if args.timm:
        model, transform, label_names = load_timm_vit(args.timm, args.checkpoint)
        label2id = {str(n): i for i, n in enumerate(label_names)} if label_names else None
        return PruningTarget(get_adapter(model), transform, None, model.num_classes, label2id, False)

    config, folder = _hf_config(args.model, args.trust_remote_code)
    if args.prompt:
        if args.num_labels is not None or args.prompt_template:
            flag = "--num-labels" if args.num_labels is not None else "--prompt-template"
            raise ValueError(f"{flag} does not apply with --prompt: the classes are the label words'; drop {flag}")
        names = read_class_names(args.class_names) if args.class_names else None
        words = parse_label_words(args.label_words) or ([[n] for n in names] if names else None)
        prompts = read_zero_shot_prompts([args.prompt], words)
        if len(prompts) != 1:
            raise ValueError(f"--prompt {args.prompt!r} holds {len(prompts)} prompts; members are pruned on one")
        return load_zero_shot_lm_target(folder, prompts[0], class_names=names,
                                        trust_remote_code=args.trust_remote_code)
    family = detect_family(folder)  # refuses unknown layouts and task heads the family does not build
    if family.task == "zero-shot-image-classification":
        if args.num_labels is not None:
            raise ValueError("--num-labels does not apply to a CLIP model; its classes are --class-names")
        model = from_pretrained(AutoModel, folder).eval()  # CLIPModel, SiglipModel, ...
        try:
            tokenizer, image_processor = (
                AutoTokenizer.from_pretrained(folder),
                AutoImageProcessor.from_pretrained(folder),
            )
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"--model {args.model!r} needs its tokenizer and image processor for zero-shot pruning "
                f"(save them with CLIPProcessor.save_pretrained): {exc}"
            ) from None
        prompt_kwargs = family.prompt_tokenizer_kwargs_for(model.config)
        tokenize = lambda p: dict(tokenizer(p, return_tensors="pt", **prompt_kwargs))  # noqa: E731
        tokens, names = _clip_text_inputs(family.name, tokenize, args)
        adapter = get_adapter(
            model, class_text_inputs={k: tokens[k] for k in ("input_ids", "attention_mask") if k in tokens}
        )
        transform = lambda image: image_processor(image, return_tensors="pt")["pixel_values"][0]  # noqa: E731
        return PruningTarget(adapter, transform, None, len(names), {n: i for i, n in enumerate(names)}, True)
    if args.class_names or args.prompt_template:
        raise ValueError(
            f"--class-names / --prompt-template apply to CLIP models; {args.model!r} is a {config.model_type} model, "
            "not a CLIP one"
        )
    return load_pruning_target(folder, num_labels=args.num_labels, trust_remote_code=args.trust_remote_code)


def run(args: argparse.Namespace) -> int:
    # --- cheap checks first: fail before loading anything heavy
    if uses_ood(args.method) and not args.ood_data:
        raise ValueError(
            f"--method {args.method} needs OOD validation data; give --ood-data (e.g. "
            "guardian_headlines:ood_validation)"
        )
    budget = Budget(heads_per_layer=args.heads_per_layer, remove=args.remove)
    output = check_output_file(args.output, overwrite=args.overwrite, accept=_is_masks_file, what="--output")
    _check_not_an_input(output, args)
    if args.members < 0:
        raise ValueError(f"--members must be >= 0, got {args.members}")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.mlp_keep is not None:
        check_mlp_keep(args.mlp_keep)
    elif args.mlp_spread:
        raise ValueError("--mlp-spread spreads slim members over the MLP; give --mlp-keep F too")
    _check_source(args)
    for spec in [s for s in (args.id_data, args.ood_data) if s]:  # the data files, before the model is loaded
        check_data_spec(spec)
    include = load_masks(args.include_masks) if args.include_masks else None

    target = _load_target(args)
    base = args.model or args.checkpoint
    metadata: dict[str, Any] = {
        "base_model": str(base),
        "id_data": args.id_data,
        "ood_data": args.ood_data,
    }
    if target.causal_lm:
        metadata["task"] = "causal_lm"
        metadata["max_length"] = args.max_length
    else:
        metadata["num_labels"] = target.num_labels
    if args.open_clip or args.timm:
        metadata["architecture"] = {"open_clip": args.open_clip} if args.open_clip else {"timm": args.timm}
    if target.zero_shot:
        metadata["class_names"] = list(target.label2id or {})
        if target.prompt is not None:  # a causal LM pruned on a prompt's label words
            metadata["prompt"] = dataclasses.asdict(target.prompt)
            metadata["max_length"] = args.max_length
        else:
            metadata["prompt_template"] = args.prompt_template or "a photo of a {}."
    masks = build_members(
        target,
        method=parse_methods(args.method),
        budget=budget,
        id_data=args.id_data,
        ood_data=args.ood_data,
        members=args.members,
        seed=args.seed,
        tower=args.tower,
        max_samples=args.max_samples,
        text_column=args.text_column,
        ood_text_column=args.ood_text_column,
        label_column=args.label_column or "label",
        image_column=args.image_column,
        batch_size=args.batch_size or (8 if target.causal_lm or target.prompt is not None else 32),
        max_length=args.max_length,
        temperature=args.temperature,
        data_fraction=args.data_fraction,
        heads_per_step=args.heads_per_step,
        taylor_rounds=args.taylor_rounds,
        include=include,
        fast=not args.no_fast,
        precision=args.circuit_precision,
        progress=not args.no_progress,
        metadata=metadata,
        mlp_keep=args.mlp_keep,
        mlp_spread=args.mlp_spread,
    )
    masks.save(output)
    print(masks.summary())
    print(f"wrote {output}")
    return 0


def _is_masks_file(path: Path) -> bool:
    """Whether ``path`` holds a masks file (what ``--overwrite`` may replace)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == "hydra-head-masks"


def _check_not_an_input(output: Path, args: argparse.Namespace) -> None:
    """The masks file may not replace (or be) one of the files this command reads."""
    real = output.resolve()
    read = {"model": [args.model], "checkpoint": [args.checkpoint], "open_clip": [args.open_clip],
            "include_masks": [args.include_masks], "class_names": zero_shot_paths(args.class_names),
            "prompt": [args.prompt] if args.prompt and TEXT_FIELD not in args.prompt else [],
            "id_data": data_spec_paths(args.id_data), "ood_data": data_spec_paths(args.ood_data)}
    for name, paths in read.items():
        for value in paths:
            if value and Path(value).exists() and Path(value).resolve() == real:
                raise HydraUnsafeError(
                    f"--output {str(output)!r} is the --{name.replace('_', '-')} input; choose another file"
                )
    if args.model and is_gguf(args.model):  # a GGUF file's folder and the cache of its plain copy are inputs too
        for folder in checkpoint_inputs(args.model)[2:]:
            if folder.resolve() in real.parents:
                raise HydraUnsafeError(
                    f"--output {str(output)!r} lies inside {str(folder)!r}, an input of the GGUF --model; choose a "
                    "file outside it"
                )
