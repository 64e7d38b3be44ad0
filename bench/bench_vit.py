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
import json
import logging
import sys
from pathlib import Path

import torch
from transformers import ViTConfig, ViTForImageClassification

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import count_matmul_macs, count_parameters, interleaved_medians, matmul_peak_gflops, table  # noqa: E402

from hydra_hf.modeling.configuration_hydra import HydraEnsembleViTConfig  # noqa: E402
from hydra_hf.modeling.modeling_hydra_vit import HydraEnsembleForImageClassification  # noqa: E402

logger = logging.getLogger("bench_vit")

PAPER_PARAMS_M = {"Single": 86.57, "Hydra fused (3)": 116.31, "Deep Ensemble (3)": 259.7}
NAMES = {"single": "Single", "deep": "Deep Ensemble (3)", "naive": "Naive members (3)", "fused": "Hydra fused (3)"}


def random_kept_heads(num_members: int, num_layers: int, num_heads: int, keep: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        [sorted(torch.randperm(num_heads, generator=g)[:keep].tolist()) for _ in range(num_layers)]
        for _ in range(num_members)
    ]


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
    return {
        NAMES[name]: sum(count_parameters(m) for m in group) if isinstance(group, list) else count_parameters(group)
        for name, group in models.items()
    }


def run(batch_sizes: list[int], device: str, rounds: int, repeats: int, warmup: int) -> list[dict]:
    models = build(device=device)
    params = parameter_counts(models)
    peak = matmul_peak_gflops() if device == "cpu" else float("nan")
    logger.info("measured fp32 matmul peak: %.1f GFLOP/s", peak)
    rows = []
    for batch in batch_sizes:
        x = torch.randn(batch, 3, 224, 224, device=device)

        def call(group):
            if isinstance(group, list):
                return lambda: [m(x).logits for m in group]
            return lambda: group(x).logits

        fns = {name: call(group) for name, group in models.items()}
        sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
        timed = {name: (lambda f=f: (f(), sync())) for name, f in fns.items()}
        ms = interleaved_medians(timed, rounds=rounds, repeats=repeats, warmup=warmup)
        for name in models:
            macs = count_matmul_macs(fns[name])
            rows.append({
                "batch": batch,
                "model": NAMES[name],
                "latency_ms": ms[name],
                "x Single": ms[name] / ms["single"],
                "x Deep": ms[name] / ms["deep"],
                "x Naive": ms[name] / ms["naive"],
                "params_M": params[NAMES[name]] / 1e6,
                "paper params_M": PAPER_PARAMS_M.get(NAMES[name], float("nan")),
                "GMACs": macs / 1e9,
                "GFLOP/s": 2 * macs / (ms[name] * 1e-3) / 1e9,
                "% of matmul peak": 100 * 2 * macs / (ms[name] * 1e-3) / 1e9 / peak,
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--params-only", action="store_true", help="print the parameter counts and exit")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("torch %s, %d threads, device %s", torch.__version__, torch.get_num_threads(), args.device)
    if args.params_only:
        counts = parameter_counts(build(device=args.device))
        for name, n in counts.items():
            paper = PAPER_PARAMS_M.get(name)
            print(f"{name}: {n / 1e6:.2f}M" + (f" (paper: {paper}M)" if paper else ""))
        return
    rows = run(args.batch_sizes, args.device, args.rounds, args.repeats, args.warmup)
    cols = ["batch", "model", "latency_ms", "x Single", "x Deep", "x Naive", "params_M", "paper params_M", "GMACs",
            "GFLOP/s", "% of matmul peak"]
    print(table(rows, cols))
    for batch in args.batch_sizes:
        r = {row["model"]: row for row in rows if row["batch"] == batch}
        fused = r["Hydra fused (3)"]
        print(f"batch {batch}: Hydra/Deep = {fused['x Deep']:.2f}, Hydra/Naive = {fused['x Naive']:.2f}, "
              f"Hydra/Single = {fused['x Single']:.2f}, params Hydra/Single = "
              f"{fused['params_M'] / r['Single']['params_M']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
