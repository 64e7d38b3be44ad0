"""`hydra-hf convert`: fuse a base checkpoint (or M member checkpoints) and a masks file into one
Hydra Ensemble model folder that loads with `trust_remote_code=True`."""

from __future__ import annotations

import argparse
import json
import logging

from ..assemble import convert_checkpoint
from ..families import family_names
from ..masks import load_masks
from . import non_negative_int, positive_int

logger = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="fuse pruned members into one Hydra Ensemble model folder",
        description="Fuse a base checkpoint (--base) or M member checkpoints (--members) with a masks file "
        "into one Hydra Ensemble folder (config, safetensors, shipped modeling code, tokenizer).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--base", help="one checkpoint folder (or GGUF checkpoint: a .gguf file) shared by all members")
    src.add_argument("--members", nargs="+", metavar="DIR",
                     help="one checkpoint folder (or GGUF checkpoint) per member, in masks order")
    p.add_argument("--masks", required=True, help="masks JSON file (see README: masks format)")
    p.add_argument("--output", required=True, help="output folder (must not exist or be empty, unless --overwrite)")
    p.add_argument("--mlp-fusion", choices=["average", "per_member"], default="average",
                   help="average the members' MLPs (paper, default) or keep one MLP per member (exact, larger)")
    p.add_argument(
        "--shared-weights",
        choices=["error", "average", "first"],
        default="error",
        help="when members' shared parts (embeddings) differ: fail (default), average them, or take the first",
    )

    p.add_argument("--arch", default=None, metavar="FAMILY",
                   help="force the base architecture family instead of detecting it: one of "
                   f"{', '.join(family_names())} ('-' and '_' both accepted; HF folders are detected by model_type, "
                   "timm folders by config.json's 'architecture', open_clip folders by open_clip_config.json)")
    p.add_argument("--towers", nargs="+", choices=["vision", "text"], default=None,
                   help="CLIP: the towers to prune; each must be in the masks file (default: the towers it lists)")
    p.add_argument("--num-labels", type=positive_int, default=None,
                   help="classes of a classifier built from a bare encoder or a decoder's causal LM (new heads)")
    p.add_argument("--labels", default=None,
                   help="comma-separated class names for a bare encoder or a causal LM (e.g. neg,pos)")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed for newly initialised per-member classifiers")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --output if it holds an earlier `hydra-hf convert` output "
        "(never another folder, never an input)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    masks = load_masks(args.masks)  # one tower, or named towers (CLIP) in a masks file with "towers"
    logger.info("masks: %s", masks.summary())
    if masks.num_members == 1:
        logger.warning(
            "the masks file has 1 member: the model is one pruned network, which cannot disagree with itself "
            "(mutual information 0, no ensemble uncertainty); prune 2 or more members (hydra-hf prune --members M)"
        )
    id2label = None
    if args.labels:
        names = [s.strip() for s in args.labels.split(",") if s.strip()]
        if args.num_labels is not None and args.num_labels != len(names):
            raise ValueError(f"--num-labels {args.num_labels} disagrees with {len(names)} --labels {names}")
        id2label = dict(enumerate(names))
    model = convert_checkpoint(
        masks,
        base=args.base,
        members=args.members,
        output_dir=args.output,
        mlp_fusion=args.mlp_fusion,
        shared=args.shared_weights,
        arch=args.arch,
        num_labels=args.num_labels,
        id2label=id2label,
        seed=args.seed,
        overwrite=args.overwrite,
        towers=args.towers,
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"output": args.output, "members": model.config.num_members,
                      "mlp_fusion": model.config.mlp_fusion, "parameters": n_params}))
    return 0
