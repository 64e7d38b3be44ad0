"""Hydra fused vs Single / Deep Ensemble / Naive members at BERT-base sizes (CPU or GPU, fp32).

Contenders, all measured side by side in this process (interleaved rounds, medians):
- Single: one stock ``BertForSequenceClassification`` (SDPA attention).
- Deep Ensemble: 3 full stock models run one after another.
- Naive members: 3 structurally pruned models (6 of 12 heads per layer) run one after another. A
  Hydra model with ONE member is exactly such a model (removed heads are gone from the weights).
- Hydra fused: the same 3 members (6 of 12 heads per layer, averaged MLP) in one forward pass.

Hydra and Naive run the same multiply-adds (the averaged MLP saves parameters, not compute), so at
large batch the floor is Naive; the fused pass wins by running fewer, larger kernels.

    python bench/bench_bert.py [--batch-sizes 1 8] [--seq-len 128] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    COLUMNS,
    add_timing_args,
    compare_contenders,
    pin_bench_threads,
    random_kept_heads,
    summary_lines,
    table,
    write_results,
)

from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig
from hydra_hf.modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification

logger = logging.getLogger("bench_bert")


def build(members: int = 3, keep: int = 6, attn: str = "sdpa", device: str = "cpu"):
    base = BertConfig(num_labels=2)  # bert-base-uncased shapes: 12 layers, 12 heads, d=768, I=3072
    torch.manual_seed(0)
    single = BertForSequenceClassification(base).eval()
    deep = [BertForSequenceClassification(base).eval() for _ in range(members)]
    kept = random_kept_heads(members, base.num_hidden_layers, base.num_attention_heads, keep)

    def hydra(kept_heads):
        cfg = HydraEnsembleConfig(base_config=base.to_dict(), kept_heads=kept_heads, num_labels=2)
        return HydraEnsembleForSequenceClassification(cfg).eval()

    fused = hydra(kept)
    naive = [hydra([k]) for k in kept]
    models = {"single": single, "deep": deep, "naive": naive, "fused": fused}
    for group in models.values():
        for m in group if isinstance(group, list) else [group]:
            m.set_attn_implementation(attn)
            m.to(device)
    return models


def inputs_for(seq_len: int, device: str):
    def make(batch: int) -> dict:
        ids = torch.randint(1000, 30000, (batch, seq_len), device=device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_timing_args(parser)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    threads = pin_bench_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("torch %s, %d threads, device %s", torch.__version__, torch.get_num_threads(), args.device)
    rows = compare_contenders(build(device=args.device), inputs_for(args.seq_len, args.device), args.batch_sizes,
                              device=args.device, rounds=args.rounds, repeats=args.repeats, warmup=args.warmup)
    print(table(rows, COLUMNS))
    print("\n".join(summary_lines(rows)))
    if args.json:
        write_results(args.json, threads, columns=COLUMNS, rows=rows, summary=summary_lines(rows))


if __name__ == "__main__":
    main()
