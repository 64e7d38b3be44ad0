"""`hydra-hf prune`: compute the head masks of M Hydra members and write the masks file.

Example::

    hydra-hf prune --model ./minilm --method circuit-avg --members 3 --remove 36 --seed 0 \\
        --id-data rotten_tomatoes:validation --ood-data guardian_headlines:ood_validation \\
        --output masks.json

Text models (BERT-like sequence classifiers) and HF ViT image classifiers are loaded from ``--model``;
other architectures (timm, open_clip, CLIP zero-shot) are pruned through the library API
(:func:`hydra_hf.pruning.prune_members`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from ..pruning.diversity import METHODS

    p = subparsers.add_parser(
        "prune",
        help="choose the heads every member keeps (Taylor / circuits / random) and write masks.json",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--model", required=True, help="folder of a Hugging Face checkpoint (text or ViT classifier)")
    p.add_argument(
        "--method",
        default="taylor",
        help=f"pruning method, or several comma-separated (one member each): {', '.join(METHODS)}",
    )
    p.add_argument("--members", type=int, default=3, help="members to compute (default 3)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--heads-per-layer", type=int, help="keep K heads in every layer")
    budget.add_argument("--remove", type=int, help="remove N heads in total (anywhere)")
    p.add_argument("--seed", type=int, default=0, help="seed of member 0; member m uses seed+m")
    p.add_argument("--id-data", required=True, help="labelled ID data: file, save_to_disk folder or NAME[:SPLIT]")
    p.add_argument("--ood-data", help="OOD data (needed by circuit-ood and circuit-avg)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--ood-text-column", help="text column of --ood-data (default: --text-column)")
    p.add_argument("--label-column", default="label")
    p.add_argument("--image-column", help="image column (image data); image folders need none")
    p.add_argument("--max-samples", type=int, help="use at most this many ID (and OOD) examples")
    p.add_argument("--max-length", type=int, default=128, help="max tokens per text (default 128)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-labels", type=int, help="classes of a checkpoint without a trained classifier head")
    p.add_argument("--temperature", type=float, help="Taylor sampling temperature (default 1 for several members)")
    p.add_argument("--data-fraction", type=float, help="fraction of the data per member (default 0.8 for several)")
    p.add_argument("--heads-per-step", type=int, default=1, help="circuit heads removed per step (1 = exact greedy)")
    p.add_argument("--taylor-rounds", type=int, default=1, help="recompute rounds of the global Taylor ranking")
    p.add_argument("--include-masks", help="masks file whose members are added to the output unchanged")
    p.add_argument("--no-fast", action="store_true", help="circuits: re-run the full model per candidate")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    p.add_argument("--output", required=True, help="masks file to write (JSON)")
    p.set_defaults(func=run)
    return p


def _load_model(path: str, num_labels: int | None) -> tuple[torch.nn.Module, Any, str]:
    """Load a sequence or image classifier; returns ``(model, tokenizer_or_processor, modality)``."""
    from transformers import AutoConfig

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"--model {path!r} is not a Hugging Face checkpoint folder (no config.json there)")
    config = AutoConfig.from_pretrained(folder)
    kwargs = {"num_labels": num_labels} if num_labels is not None else {}
    if config.model_type == "vit":
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        model = AutoModelForImageClassification.from_pretrained(folder, **kwargs)
        return model, AutoImageProcessor.from_pretrained(folder), "image"
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder, **kwargs)
    return model, AutoTokenizer.from_pretrained(folder), "text"


def _label2id(config: Any) -> dict[str, int] | None:
    mapping = dict(getattr(config, "label2id", None) or {})
    default = {f"LABEL_{i}": i for i in range(getattr(config, "num_labels", 0))}
    return None if not mapping or mapping == default else {str(k): int(v) for k, v in mapping.items()}


def run(args: argparse.Namespace) -> int:
    from ..data import make_image_loader, make_text_loader, resolve_dataset
    from ..masks import HeadMasks
    from ..pruning.adapters import get_adapter
    from ..pruning.budget import Budget
    from ..pruning.diversity import parse_methods, prune_members

    # --- cheap checks first: fail before loading anything heavy
    methods = parse_methods(args.method)
    if any(m in ("circuit-ood", "circuit-avg") for m in methods) and not args.ood_data:
        raise ValueError(f"--method {args.method} needs OOD validation data; give --ood-data (e.g. guardian_headlines:ood_validation)")
    budget = Budget(heads_per_layer=args.heads_per_layer, remove=args.remove)
    output = Path(args.output)
    if output.exists() and not args.overwrite:
        raise FileExistsError(f"--output {str(output)!r} exists; pass --overwrite to replace it")
    if args.members < 0:
        raise ValueError(f"--members must be >= 0, got {args.members}")
    include = HeadMasks.load(args.include_masks) if args.include_masks else None

    model, processor, modality = _load_model(args.model, args.num_labels)
    model.eval()
    adapter = get_adapter(model)
    L, H = adapter.shape(None)
    budget.check(L, H)

    data_kwargs = dict(
        text_column=None if args.image_column else args.text_column,
        image_column=args.image_column,
        max_samples=args.max_samples,
    )
    num_labels = model.config.num_labels
    id_data = resolve_dataset(
        args.id_data,
        label_column=args.label_column,
        label2id=_label2id(model.config),
        num_labels=num_labels,
        require_labels=any(m != "random" for m in methods),
        **data_kwargs,
    )
    ood_kwargs = {**data_kwargs}
    if args.ood_text_column and not args.image_column:
        ood_kwargs["text_column"] = args.ood_text_column
    ood_data = resolve_dataset(args.ood_data, label_column=None, **ood_kwargs) if args.ood_data else None
    logger.info("ID data: %d examples%s", len(id_data), f"; OOD data: {len(ood_data)}" if ood_data is not None else "")

    if modality == "text":
        if "text" not in id_data.column_names:
            raise ValueError(f"--model {args.model} is a text model but the ID data has no text column")

        def make_batches(dataset: Any, seed: int) -> list[dict[str, torch.Tensor]]:
            return list(make_text_loader(dataset, processor, args.batch_size, args.max_length))
    else:

        def transform(image: Any) -> torch.Tensor:
            return processor(image, return_tensors="pt")["pixel_values"][0]

        def make_batches(dataset: Any, seed: int) -> list[dict[str, torch.Tensor]]:
            return list(make_image_loader(dataset, transform, args.batch_size))

    masks = prune_members(
        adapter,
        methods=methods,
        budget=budget,
        make_batches=make_batches,
        id_data=id_data,
        ood_data=ood_data,
        members=args.members,
        seed=args.seed,
        temperature=args.temperature,
        data_fraction=args.data_fraction,
        heads_per_step=args.heads_per_step,
        taylor_rounds=args.taylor_rounds,
        include=include,
        fast=not args.no_fast,
        progress=not args.no_progress,
        metadata={
            "base_model": str(args.model),
            "id_data": args.id_data,
            "ood_data": args.ood_data,
            "num_labels": num_labels,
        },
    )
    masks.save(output)
    print(masks.summary())
    print(f"wrote {output}")
    return 0
