"""The paper's image setting: Hydra Ensembles of ViT-B/16 on CIFAR-100.

Budget (the paper's): **3 members, each keeping 10 of the 12 heads in every
one of ViT-B/16's 12 blocks** (24 of 144 heads removed per member; ``Budget(heads_per_layer=10)``,
``--heads-per-layer 10``; the paper keeps about 10 per block on CIFAR-100 and 8 on ImageNet: run
``--heads-per-layer 8`` for the ImageNet setting; not 10 heads removed in total). Members by Taylor importance, pruned
layer by layer with the gradients recomputed after each layer (paper D.1.1), seeds ``seed, seed+1, seed+2`` (each
member scores heads on its own seeded 80 % of the validation images and samples its kept heads from the ranking).

Base model: Hugging Face ``google/vit-base-patch16-224-in21k`` (ImageNet-21k ViT-B/16) with a new
100-class classifier. Hydra's fine-tuning trains Hugging Face ViT folders, not timm ones, so the
timm ``vit_base_patch16_224.augreg_in21k`` weights are not used here. Its config has no dropout;
this recipe sets ``hidden_dropout_prob=0.1`` (``--dropout``) so that the MC Dropout baseline is
defined, for every model alike (``--dropout 0`` keeps the checkpoint's and drops MC Dropout).

Fine-tuning: the paper's image recipe (:func:`hydra_hf.finetune.image_recipe`: SGD momentum 0.9,
lr 0.01, cosine decay after 10 % warm-up, label smoothing 0.1, batch 64), up to 7 epochs with early
stopping (patience 2), embeddings frozen, for Single and for every member.

Data (``--data-dir``, written once by :func:`prepare_data` with ``datasets.load_dataset`` and
``save_to_disk``; CIFAR images are upscaled to 224 px by the ViT image processor):

- ID: CIFAR-100 (``uoft-cs/cifar100``, fine labels): its test split is the test split; a stratified,
  seeded 5,000-image validation split is carved from train.
- OOD test sets: SVHN (``ufldl-stanford/svhn``, cropped digits), CIFAR-10 (``uoft-cs/cifar10``,
  near-OOD) and DTD textures (``tanganke/dtd``), the usual CIFAR-100 OOD sets; check them against the
  paper's table before comparing numbers. Taylor members use ID validation data only.

    accelerate launch --num_processes 1 examples/recipe_cifar100_vit.py --output outputs/cifar100-vit
    python examples/recipe_cifar100_vit.py --smoke --output /tmp/vit-smoke   # offline, seconds

``--smoke`` runs the same code on a tiny ViT (2 layers x 4 heads, 16 px) and stand-ins built from
scikit-learn's digits (3 classes, upscaled to 16 px RGB), with noise and inverted digits as OOD.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets

from hydra_hf.cli import finite_float, run_script
from hydra_hf.pruning import Budget
from hydra_hf.recipes import ImagePipeline, PipelineResult, add_budget_arguments, budget_arguments, run_image_pipeline
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads

BASE_MODEL = "google/vit-base-patch16-224-in21k"
PAPER_HEADS_PER_LAYER = 10  # keep about 10 of ViT-B/16's 12 heads in every block (CIFAR-100; ImageNet: 8)
VALIDATION_SIZE = 5000
ID_SET = ("uoft-cs/cifar100", "img", "fine_label")  # Hub id, image column, label column
# name -> (Hub id, config, image column, split)
OOD_SETS: dict[str, tuple[str, str | None, str, str]] = {
    "svhn": ("ufldl-stanford/svhn", "cropped_digits", "image", "test"),
    "cifar10": ("uoft-cs/cifar10", None, "img", "test"),
    "dtd": ("tanganke/dtd", None, "image", "test"),
}

Loader = Callable[..., datasets.DatasetDict]


def prepare_data(data_dir: Path, load: Loader = datasets.load_dataset, *, max_ood: int = 5000, seed: int = 0,
                 validation_size: int = VALIDATION_SIZE) -> tuple[dict[str, Any], list[str]]:
    """Download (``load``) CIFAR-100 and the OOD sets, standardise them to ``image``/``label`` and save
    them under ``data_dir``. Returns the :class:`ImagePipeline` data specs and the class names."""
    data_dir = Path(data_dir)
    id_dir = data_dir / "cifar100"
    hub_id, image_col, label_col = ID_SET
    if not (id_dir / "dataset_dict.json").is_file():
        raw = load(hub_id)

        def standard(ds):
            return ds.select_columns([image_col, label_col]).rename_columns({image_col: "image", label_col: "label"})

        parts = standard(raw["train"]).train_test_split(
            test_size=validation_size, seed=seed, stratify_by_column="label"
        )
        datasets.DatasetDict(train=parts["train"], validation=parts["test"], test=standard(raw["test"])).save_to_disk(
            str(id_dir)
        )
    names = datasets.load_from_disk(str(id_dir))["train"].features["label"].names
    specs: dict[str, Any] = {"train_data": f"{id_dir}:train", "validation_data": f"{id_dir}:validation",
                             "test_data": f"{id_dir}:test", "ood_test_data": {}}
    for name, (ood_id, config, column, split) in OOD_SETS.items():
        folder = data_dir / f"ood_{name}"
        if not (folder / "dataset_dict.json").is_file():
            raw = load(ood_id, config) if config else load(ood_id)
            part = raw[split].shuffle(seed=seed).select_columns([column])
            part = part.rename_column(column, "image") if column != "image" else part
            datasets.DatasetDict(ood_test=part.select(range(min(max_ood, len(part))))).save_to_disk(str(folder))
        specs["ood_test_data"][name] = f"{folder}:ood_test"
    return specs, list(names)


def prepare_base(
    folder: Path, labels: list[str], model_id: str = BASE_MODEL, dropout: float = 0.1, seed: int = 0
) -> Path:
    """ViT-B/16 (ImageNet-21k) with a new classifier for ``labels`` (seeded) and its image processor."""
    import torch
    from transformers import ViTForImageClassification, ViTImageProcessor

    if not (folder / "config.json").is_file():
        torch.manual_seed(seed)
        model = ViTForImageClassification.from_pretrained(
            model_id, num_labels=len(labels), id2label=dict(enumerate(labels)),
            label2id={l: i for i, l in enumerate(labels)}, hidden_dropout_prob=dropout)
        model.save_pretrained(folder)
        ViTImageProcessor.from_pretrained(model_id).save_pretrained(folder)
    return folder


def paper_pipeline(
    base: Path,
    specs: dict[str, Any],
    *,
    members: int = 3,
    heads_per_layer: int | None = PAPER_HEADS_PER_LAYER,
    remove: int | None = None,
    seed: int = 0,
    method: str = "taylor",
    **overrides: Any,
) -> ImagePipeline:
    """The paper's CIFAR-100 settings as an :class:`ImagePipeline`; ``overrides`` replace any field.

    The budget is per block (``heads_per_layer``) unless ``remove`` is given (then ``heads_per_layer``
    must be None)."""
    budget = Budget(heads_per_layer=heads_per_layer, remove=remove)
    values: dict[str, Any] = dict(
        base_model=str(base), **specs, members=members, method=method, remove=remove, heads_per_layer=heads_per_layer,
        seed=seed, hub_base_model=BASE_MODEL,
        report_title=f"Hydra Ensembles of ViT-B/16 on CIFAR-100 ({members} members, {budget.describe()})",
        report_notes="Members were selected on the CIFAR-100 validation split carved from train only; the test "
        "split and the OOD test sets were never used for any choice.",
    )
    values.update(overrides)
    return ImagePipeline(**values)


# ------------------------------------------------------------------------------------------ smoke
SMOKE_CLASSES = 3
SMOKE_SIZE = 16


def _digit_images(images, size: int):
    import numpy as np
    from PIL import Image

    out = []
    for im in images:  # (8, 8) in 0..16
        gray = Image.fromarray((np.asarray(im) * (255 / 16)).astype("uint8")).resize((size, size), Image.BILINEAR)
        out.append(gray.convert("RGB"))
    return out


def smoke_loader(path: str, config: str | None = None) -> datasets.DatasetDict:
    """Tiny offline stand-ins with the Hub data sets' splits and columns (digits 0-2 as CIFAR-100)."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    keep = np.flatnonzero(digits.target < SMOKE_CLASSES)
    if path == ID_SET[0]:
        features = datasets.Features(
            {
                "img": datasets.Image(),
                "fine_label": datasets.ClassLabel(names=[f"digit_{i}" for i in range(SMOKE_CLASSES)]),
            }
        )
        tr, te = keep[:120], keep[120:150]
        make = lambda idx: datasets.Dataset.from_dict(  # noqa: E731
            {"img": _digit_images(digits.images[idx], SMOKE_SIZE), "fine_label": digits.target[idx].tolist()},
            features=features,
        )
        return datasets.DatasetDict(train=make(tr), test=make(te))
    _, _, column, split = next(v for v in OOD_SETS.values() if v[0] == path)
    rng = np.random.default_rng(len(path))
    if path == "uoft-cs/cifar10":  # inverted digits: the same strokes, reversed contrast
        images = _digit_images(16 - digits.images[keep[150:170]], SMOKE_SIZE)
    else:  # uniform noise
        from PIL import Image

        images = [
            Image.fromarray(rng.integers(0, 256, (SMOKE_SIZE, SMOKE_SIZE, 3), dtype=np.uint8)) for _ in range(20)
        ]
    return datasets.DatasetDict(
        {split: datasets.Dataset.from_dict({column: images}, features=datasets.Features({column: datasets.Image()}))}
    )


def smoke_base(folder: Path, labels: list[str], seed: int = 0) -> Path:
    """A tiny ViT classifier (hidden 32, 2 layers x 4 heads, 16 px, patch 8, dropout 0.1)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(seed)
    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                       image_size=SMOKE_SIZE, patch_size=8, hidden_dropout_prob=0.1, num_labels=len(labels),
                       id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})
    ViTForImageClassification(config).save_pretrained(folder)
    ViTImageProcessor(size={"height": SMOKE_SIZE, "width": SMOKE_SIZE}).save_pretrained(folder)
    return folder


SMOKE_HEADS_PER_LAYER = 3  # the tiny ViT has 4 heads per block
SMOKE_OVERRIDES: dict[str, Any] = dict(
    prune_samples=24, batch_size=16, learning_rate=0.05, member_learning_rate=0.05, single_steps=6,
    member_steps=4, num_epochs=1, early_stopping_patience=None, max_test_samples=30, max_ood_samples=20,
    eval_batch_size=32, mc_samples=3, ensemble_heads=2,
)


def main(argv: list[str] | None = None) -> PipelineResult:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="outputs/cifar100-vit", help="output folder")
    parser.add_argument("--data-dir", default=None, help="prepared data (default: <output>/data)")
    parser.add_argument("--smoke", action="store_true", help="tiny local ViT and generated data, offline")
    parser.add_argument("--resume", action="store_true", help="keep the stages already finished in --output")
    parser.add_argument("--members", type=int, default=3)
    add_budget_arguments(parser, heads_per_layer=PAPER_HEADS_PER_LAYER)
    parser.add_argument("--method", default="taylor", help="member criterion (hydra_hf.pruning.METHODS)")
    parser.add_argument("--dropout", type=finite_float, default=0.1, help="hidden dropout of the base ViT")
    parser.add_argument("--max-ood", type=int, default=5000, help="images per OOD set")
    parser.add_argument("--seed", type=int, default=0)
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    threads = pin_threads(args.threads)  # first, before any torch work: the runs repeat on any machine of this kind
    print(describe_threads(threads))
    out = Path(args.output)
    data_dir = Path(args.data_dir) if args.data_dir else out / "data"
    start = time.perf_counter()
    if args.smoke:
        specs, labels = prepare_data(data_dir, smoke_loader, max_ood=args.max_ood, seed=args.seed, validation_size=30)
        base = smoke_base(out / "base", labels, seed=args.seed)
        overrides = {
            **SMOKE_OVERRIDES,
            **budget_arguments(args, smoke_heads_per_layer=SMOKE_HEADS_PER_LAYER, smoke_remove=3),
        }
    else:
        specs, labels = prepare_data(data_dir, max_ood=args.max_ood, seed=args.seed)
        base = prepare_base(out / "base", labels, dropout=args.dropout, seed=args.seed)
        overrides = budget_arguments(args)
    p = paper_pipeline(base, specs, members=args.members, seed=args.seed, method=args.method, **overrides)
    result = run_image_pipeline(p, out / "run", resume=args.resume, repo_id="your-org/hydra-vit-b16-cifar100")
    print(result.summary(time.perf_counter() - start))
    return result


if __name__ == "__main__":
    run_script(main)  # bad input: one line, as the hydra-hf commands give it
