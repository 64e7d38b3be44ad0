"""`hydra-hf finetune`: fine-tune every pruned member on a task (Accelerate), then fuse them into one
Hydra Ensemble folder. Runs as is, or under `accelerate launch` for several processes/GPUs:

    accelerate launch --multi_gpu --num_processes 2 -m hydra_hf.cli finetune --model ... --output ...

`--recipe NAME` starts from a registered recipe (`hydra_hf.finetune.RECIPES`: the paper's per task, the demo's
Single and members), logged at the start of the run; every `FinetuneConfig` setting has a flag
(`--learning-rate`, `--num-epochs`, ...); `--config FILE` (JSON or YAML) sets many at once; the flags given on the
command line override both.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from accelerate import PartialState

from ..assemble import detect_arch
from ..finetune import (
    MIXED_PRECISION,
    MLP_FUSIONS,
    OPTIMIZERS,
    RECIPES,
    SCHEDULERS,
    FinetuneConfig,
    finetune_fused,
    finetune_members,
    get_recipe,
)
from . import finite_float, non_negative_int, positive_int

logger = logging.getLogger(__name__)


def _optional(kind: type):
    def parse(text: str):
        return None if text.lower() in ("none", "off", "null") else kind(text)

    parse.__name__ = f"{kind.__name__} or none"
    return parse


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``FinetuneConfig`` field; unset flags stay absent from the namespace."""
    choices = {
        "optimizer": OPTIMIZERS,
        "scheduler": SCHEDULERS,
        "mixed_precision": MIXED_PRECISION,
        "mlp_fusion": MLP_FUSIONS,
    }
    group = parser.add_argument_group("training settings (override --recipe and --config)")
    for f in dataclasses.fields(FinetuneConfig):
        flag = "--" + f.name.replace("_", "-")
        helptext = f"{f.metadata.get('help', '')} (default {f.default})"
        kwargs: dict = dict(dest=f.name, default=argparse.SUPPRESS, help=helptext)
        if f.type == "bool":
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        base = f.type.replace(" | None", "")
        # every count of FinetuneConfig is >= 1, a seed >= 0: checked at parse time (--batch-size 0 never
        # reaches a loader)
        whole = non_negative_int if f.name == "seed" else positive_int
        kind = {"int": whole, "float": finite_float, "str": str}[base]
        kwargs["type"] = _optional(kind) if f.type.endswith("| None") else kind
        if f.name in choices:
            kwargs["choices"] = list(choices[f.name])
        group.add_argument(flag, **kwargs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="base checkpoint folder: a text or image classifier of a registered family (its trained head is kept), a "
        "bare encoder, or a decoder causal LM (Llama-style, GPT-2: trained on the next-token loss of the text; with "
        "--labels or --num-labels a last-token classifier with new heads); or a GGUF checkpoint (a .gguf file: a "
        "causal LM)",
    )
    p.add_argument("--masks", required=True, help="masks JSON file for this base model")
    p.add_argument(
        "--train-data",
        required=True,
        help="training data: NAME[:SPLIT] (e.g. rotten_tomatoes:train), a "
        "csv/jsonl/parquet file or a save_to_disk folder",
    )
    p.add_argument("--eval-data", default=None, help="validation data for early stopping (same forms as --train-data)")
    p.add_argument(
        "--output", required=True, help="the fused model folder (must not exist or be empty, unless --overwrite)"
    )
    p.add_argument(
        "--work-dir",
        default=None,
        help="checkpoints, logs and per-member folders (default: OUTPUT.work); a new or empty folder, or one an "
        "earlier `hydra-hf finetune` created; never the model folder, the output, or a folder holding them",
    )
    p.add_argument("--members", type=non_negative_int, nargs="+", default=None, metavar="M",
                   help="train only these members (e.g. one launch per GPU sharing --work-dir); fusing waits for all")
    p.add_argument(
        "--fused",
        action="store_true",
        help="train the fused model directly (loss = mean member cross-entropy) instead of member by member",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run from its last checkpoint in --work-dir, exactly (the same weights "
        "and loss history as without the interruption); a checkpoint without "
        "its RNG or trainer state is an error",
    )
    p.add_argument("--resume-partial", action="store_true",
                   help="--resume, and go on with a warning when a checkpoint lacks random_states_*.pkl (dropout then "
                        "differs from an uninterrupted run) or trainer_state.json (that "
                        "member is retrained from its first step)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --output and empty --work-dir, but only folders an earlier `hydra-hf finetune` wrote "
                        "(they hold its .hydra_hf_output.json marker); any other non-empty "
                        "folder is an error and is never deleted")
    p.add_argument(
        "--recipe",
        choices=list(RECIPES),
        default=None,
        metavar="NAME",
        help="preset settings, logged when the run starts (default: the paper's recipe for the base: image for "
        "ViT, text otherwise): " + "; ".join(f"{name}: {recipe.help}" for name, recipe in RECIPES.items()),
    )
    p.add_argument("--config", default=None, help="JSON/YAML file of training settings (keys as the flags, with _)")
    p.add_argument(
        "--labels", default=None,
        help="comma-separated class names for a bare encoder or a causal LM (e.g. negative,positive)"
    )
    add_config_flags(p)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune the pruned members on a task, then fuse them",
        description="Fine-tune every member (the base with that member's heads removed) independently — its own "
        "seed, the same data — then fuse them into one Hydra Ensemble folder. Use `accelerate launch` for "
        "several processes or GPUs.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> FinetuneConfig:
    """The ``FinetuneConfig`` of the parsed arguments: recipe, then --config file, then flags; the recipe
    and what overrides it are logged in one line."""
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(FinetuneConfig) if hasattr(args, f.name)}
    if args.config:
        if args.recipe:
            overrides["recipe"] = args.recipe
        config = FinetuneConfig.from_file(args.config, **overrides)
        logger.info("settings from %s (recipe %s), flags over them: %s", args.config, args.recipe or "from the file",
                    ", ".join(f"{k}={v}" for k, v in overrides.items() if k != "recipe") or "none")
        return config
    # no --recipe: the paper's recipe for this base, image for ViT, text otherwise
    recipe = get_recipe(args.recipe or ("image" if detect_arch(args.model) == "vit" else "text"))
    config = recipe.config(**overrides)
    logger.info("%s", recipe.describe(overrides))
    return config


def run(args: argparse.Namespace) -> int:
    if not getattr(args, "verbose", False):
        logging.getLogger("accelerate").setLevel(logging.WARNING)  # a line per checkpoint file is too chatty
    config = config_from_args(args)
    id2label = None
    if args.labels:
        names = [s.strip() for s in args.labels.split(",") if s.strip()]
        if len(names) < 2:
            raise ValueError(f"--labels needs at least two comma-separated class names, got {args.labels!r}")
        id2label = dict(enumerate(names))
    common = dict(
        model_dir=args.model, masks=args.masks, train_data=args.train_data, eval_data=args.eval_data,
        output_dir=args.output, config=config, work_dir=args.work_dir, resume=args.resume,
        resume_partial=args.resume_partial, overwrite=args.overwrite, id2label=id2label,
        inputs=[args.config] if args.config else [],  # read here: never inside --output or --work-dir
    )
    if args.fused:
        if args.members is not None:
            raise ValueError("--members selects members to train one by one; it cannot be combined with --fused")
        out = finetune_fused(**common)
    else:
        out = finetune_members(**common, members=args.members)

    if PartialState().is_main_process:
        print(
            json.dumps({"output": str(out) if out is not None else None, "mode": "fused" if args.fused else "members"})
        )
    return 0
