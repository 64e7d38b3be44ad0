"""Hydra fused vs Single / Deep Ensemble / Naive members for a registered family (CPU or GPU, fp32).

The same method and table as ``bench/bench_bert.py`` / ``bench/bench_vit.py`` (``_common.py``:
interleaved rounds, medians, FlopCounter multiply-adds), for families whose models are built through
the family registry (:func:`hydra_hf.families.get_family`): the stock model is
``family.stock_model(base_config)`` and the Hydra model is ``family.model_class()`` of
``family.config_class()``, so the shipped modeling file of that family is what is timed.

- ``--family roberta``: RoBERTa-base geometry (12 layers, 12 heads, d=768, I=3072, vocab 50265),
  ``RobertaForSequenceClassification``, 2 labels, T=128 tokens.
- ``--family deit``: DeiT-B/16 geometry (12 layers, 12 heads, d=768, I=3072, 224px, 16px patches),
  ``DeiTForImageClassification``, 1000 classes.

Contenders, all measured side by side in this process:
- Single: one stock model (SDPA attention).
- Deep Ensemble: 3 full stock models run one after another.
- Naive members: 3 structurally pruned models (6 of 12 heads per layer) run one after another (a Hydra
  model with ONE member: removed heads are gone from the weights).
- Hydra fused: the same 3 members (6 of 12 heads per layer, averaged MLP) in one forward pass.

    python bench/bench_families.py --family roberta|deit [--batch-sizes 1 8] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

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

from hydra_hf.families import get_family

logger = logging.getLogger("bench_families")

# base config (a Hydra config's base_config) and label count per family, at the published base sizes
GEOMETRIES: dict[str, tuple[dict[str, Any], int]] = {
    "roberta": ({
        "model_type": "roberta", "vocab_size": 50265, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 514,
        "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "layer_norm_eps": 1e-5,
    }, 2),
    "deit": ({
        "model_type": "deit", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "image_size": 224, "patch_size": 16, "num_channels": 3,
    }, 1000),
}


def build(family_name: str, members: int = 3, keep: int = 6, attn: str = "sdpa", device: str = "cpu") -> dict:
    """``{"single", "deep", "naive", "fused"}`` models of ``family_name``, built through the registry."""
    family = get_family(family_name)
    base_config, num_labels = GEOMETRIES[family.name]
    torch.manual_seed(0)
    single = family.stock_model(base_config, num_labels).eval()
    deep = [family.stock_model(base_config, num_labels).eval() for _ in range(members)]
    L, H = base_config["num_hidden_layers"], base_config["num_attention_heads"]
    kept = random_kept_heads(members, L, H, keep)
    # the stock model's full config (defaults filled in) is the Hydra base config, as convert writes it
    full_base = single.config.to_dict()

    def hydra(kept_heads: list) -> torch.nn.Module:
        cfg = family.config_class()(base_config=full_base, kept_heads=kept_heads, num_labels=num_labels)
        return family.model_class()(cfg).eval()

    models = {"single": single, "deep": deep, "naive": [hydra([k]) for k in kept], "fused": hydra(kept)}
    for group in models.values():
        for m in group if isinstance(group, list) else [group]:
            m.set_attn_implementation(attn)
            m.to(device)
    return models


def inputs_for(family_name: str, seq_len: int, device: str) -> Callable[[int], dict]:
    """Random inputs of the family's modality: token ids ``(B, T)`` or pixels ``(B, 3, 224, 224)``."""
    family = get_family(family_name)
    if family.modality == "text":
        vocab = GEOMETRIES[family.name][0]["vocab_size"]

        def text(batch: int) -> dict:
            ids = torch.randint(3, vocab, (batch, seq_len), device=device)  # (B, T), no special ids
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

        return text
    size = GEOMETRIES[family.name][0]["image_size"]
    return lambda batch: {"pixel_values": torch.randn(batch, 3, size, size, device=device)}  # (B, 3, S, S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", required=True, choices=sorted(GEOMETRIES))
    family = parser.parse_known_args()[0].family
    # timing defaults as bench_bert.py (text) and bench_vit.py (images: a ViT-B forward is slow on CPU)
    add_timing_args(parser, **({"rounds": 3, "repeats": 1} if get_family(family).modality == "image" else {}))
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--keep", type=int, default=6, help="heads of 12 each member keeps per layer")
    args = parser.parse_args()
    threads = pin_bench_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("family %s, torch %s, %d threads, device %s", args.family, torch.__version__, torch.get_num_threads(),
                args.device)
    models = build(args.family, keep=args.keep, device=args.device)
    rows = compare_contenders(models, inputs_for(args.family, args.seq_len, args.device), args.batch_sizes,
                              device=args.device, rounds=args.rounds, repeats=args.repeats, warmup=args.warmup)
    print(table(rows, COLUMNS))
    print("\n".join(summary_lines(rows)))
    if args.json:
        write_results(args.json, threads, columns=COLUMNS, rows=rows, summary=summary_lines(rows))


if __name__ == "__main__":
    main()
