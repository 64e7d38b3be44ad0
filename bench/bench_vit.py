"""Hydra fused vs Single / Deep Ensemble / Naive members at ViT-B/16 sizes (224x224, fp32).

Contenders, all measured side by side in this process (interleaved rounds, medians):
- Single: one stock ``ViTForImageClassification`` (ViT-B/16, 1000 classes, SDPA attention).
- Deep Ensemble: 3 full stock models run one after another.
- Naive members: 3 structurally pruned models (8 of 12 heads per layer) run one after another. A
  Hydra model with ONE member is exactly such a model (removed heads are gone from the weights).
- Hydra fused: the same 3 members (8 of 12 heads per layer, averaged MLP: the paper's setting) in one
  forward pass.

Parameter counts are checked against the paper's Table 7 (86.57M Single, 116.31M Hydra, 259.7M Deep
Ensemble). Hydra and Naive run the same multiply-adds (the averaged MLP saves parameters, not compute).

    python bench/bench_vit.py [--batch-sizes 1 8] [--device cpu|cuda] [--rounds 3] [--repeats 1]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from transformers import ViTConfig, ViTForImageClassification

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    COLUMNS,
    NAMES,
    add_timing_args,
    compare_contenders,
    group_parameters,
    pin_bench_threads,
    random_kept_heads,
    summary_lines,
    table,
    write_results,
)

from hydra_hf.modeling.configuration_hydra_vit import HydraEnsembleViTConfig
from hydra_hf.modeling.modeling_hydra_vit import HydraEnsembleForImageClassification

logger = logging.getLogger("bench_vit")

PAPER_PARAMS_M = {"Single": 86.57, "Hydra fused (3)": 116.31, "Deep Ensemble (3)": 259.7}


def build(members: int = 3, keep: int = 8, attn: str = "sdpa", device: str = "cpu") -> dict:
    base = ViTConfig(num_labels=1000)  # ViT-B/16 shapes: 12 layers, 12 heads, d=768, I=3072, 224px, 16px patches
    torch.manual_seed(0)
    single = ViTForImageClassification(base).eval()
    deep = [ViTForImageClassification(base).eval() for _ in range(members)]
    kept = random_kept_heads(members, base.num_hidden_layers, base.num_attention_heads, keep)

    def hydra(kept_heads):
        cfg = HydraEnsembleViTConfig(base_config=base.to_dict(), kept_heads=kept_heads, num_labels=1000)
        return HydraEnsembleForImageClassification(cfg).eval()

    models = {"single": single, "deep": deep, "naive": [hydra([k]) for k in kept], "fused": hydra(kept)}
    for group in models.values():
        for m in group if isinstance(group, list) else [group]:
            m.set_attn_implementation(attn)
            m.to(device)
    return models


def parameter_counts(models: dict) -> dict[str, int]:
    return {NAMES[name]: group_parameters(group) for name, group in models.items()}


def inputs_for(device: str):
    return lambda batch: {"pixel_values": torch.randn(batch, 3, 224, 224, device=device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_timing_args(parser, rounds=3, repeats=1)
    parser.add_argument("--params-only", action="store_true", help="print the parameter counts and exit")
    args = parser.parse_args()
    threads = pin_bench_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("torch %s, %d threads, device %s", torch.__version__, torch.get_num_threads(), args.device)
    if args.params_only:
        counts = parameter_counts(build(device=args.device))
        for name, n in counts.items():
            paper = PAPER_PARAMS_M.get(name)
            print(f"{name}: {n / 1e6:.2f}M" + (f" (paper: {paper}M)" if paper else ""))
        return
    models = build(device=args.device)
    rows = compare_contenders(models, inputs_for(args.device), args.batch_sizes, device=args.device,
                              rounds=args.rounds, repeats=args.repeats, warmup=args.warmup)
    for row in rows:
        row["paper params_M"] = PAPER_PARAMS_M.get(row["model"], float("nan"))
    columns = COLUMNS[:7] + ["paper params_M"] + COLUMNS[7:]
    print(table(rows, columns))
    print("\n".join(summary_lines(rows)))
    if args.json:
        write_results(args.json, threads, columns=columns, rows=rows, summary=summary_lines(rows))


if __name__ == "__main__":
    main()
