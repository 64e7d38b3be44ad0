"""Slim members against the Single, the Deep Ensemble and the paper's Hydra, side by side, CPU.

Contenders (random weights: the timing does not depend on them), all in this process, interleaved rounds,
medians (``bench/_common.py``):
- eager Single: one stock ``BertForSequenceClassification`` / ``ViTForImageClassification`` (SDPA);
- eager Deep Ensemble (3): 3 stock models run one after another;
- eager Hydra (3): the paper's members, 6 of 12 heads per layer each (random), averaged MLP;
- eager slim Hydra (3): 3 members splitting every layer's heads (4 of 12 each) and MLP neurons (1,024 of 3,072
  each): one Single's multiply-adds (``hydra_hf.cost``);
- ONNX fp32 / int8 Single and slim Hydra: exported and quantised as ``bench/bench_onnx.py`` does (int8: the
  export's default smoothquant recipe), run by ONNX Runtime with as many threads as torch.

The issue's targets are printed at the end: slim Hydra / Single eager fp32 <= 1.3 at batch 8 and 32, parameters
<= 1.1x, int8 ONNX slim Hydra / int8 Single <= 1.3. Rows go to ``--json`` (a results file).

    python bench/bench_slim.py [--geometries bert vit] [--batch-sizes 1 8 32] [--no-onnx] [--threads 2]

``--quick`` is a smoke test (2 layers, T = 32, one round): its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    add_threads_argument,
    count_parameters,
    interleaved_medians,
    pin_bench_threads,
    table,
    write_results,
)
from bench_onnx import build, export_pair, make_inputs, session

from hydra_hf.cost import relative_cost

logger = logging.getLogger("bench_slim")

COLUMNS = ["geometry", "batch", "model", "latency_ms", "x Single", "x Deep Ensemble", "compute_x", "params_M"]
TARGETS = [  # (label, numerator, denominator, batch, bound)
    ("eager slim Hydra / eager Single", "eager slim Hydra (3)", "eager Single", 8, 1.3),
    ("eager slim Hydra / eager Single", "eager slim Hydra (3)", "eager Single", 32, 1.3),
    ("int8 slim Hydra / int8 Single", "ONNX int8 slim Hydra (3)", "ONNX int8 Single", 8, 1.3),
    ("int8 slim Hydra / int8 Single", "ONNX int8 slim Hydra (3)", "ONNX int8 Single", 32, 1.3),
]


def slim_hydra(paper: torch.nn.Module, members: int = 3) -> torch.nn.Module:
    """A Hydra of ``paper``'s class whose members split every layer's heads and MLP neurons evenly."""
    config = paper.config
    L, H = config.num_hidden_layers, config.num_attention_heads
    inner = config.base_config["intermediate_size"]
    heads = [[list(range(m * H // members, (m + 1) * H // members))] * L for m in range(members)]
    neurons = [[list(range(m * inner // members, (m + 1) * inner // members))] * L for m in range(members)]
    cfg = type(config)(
        base_config=config.base_config, kept_heads=heads, kept_neurons=neurons, num_labels=config.num_labels
    )
    torch.manual_seed(1)
    model = type(paper)(cfg).eval()
    model.set_attn_implementation("sdpa")
    return model


def run_geometry(geometry: str, args: argparse.Namespace, folder: Path) -> list[dict]:
    models, modality = build(geometry, args.layers)
    models["slim"] = slim_hydra(models["hydra"])
    threads = torch.get_num_threads()
    sessions, files = {}, {}
    if not args.no_onnx:
        for name, label, keys in (
            ("single", "Single", ("logits",)),
            ("slim", "slim Hydra (3)", ("logits", "member_logits")),
        ):
            logger.info("%s: exporting %s to ONNX (fp32, then int8)", geometry, name)
            fp32, int8, _, _ = export_pair(models[name], keys, modality, folder, f"{geometry}-{name}", args.seq_len)
            sessions[f"ONNX fp32 {label}"], sessions[f"ONNX int8 {label}"] = (
                session(fp32, threads),
                session(int8, threads),
            )
            files[f"ONNX fp32 {label}"], files[f"ONNX int8 {label}"] = fp32, int8
    params = {
        "eager Single": count_parameters(models["single"]),
        "eager Deep Ensemble (3)": sum(count_parameters(m) for m in models["deep"]),
        "eager Hydra (3)": count_parameters(models["hydra"]),
        "eager slim Hydra (3)": count_parameters(models["slim"]),
    }
    compute = {"eager Single": 1.0, "eager Deep Ensemble (3)": 3.0,
               "eager Hydra (3)": relative_cost(models["hydra"].config, args.seq_len)["macs_ratio"],
               "eager slim Hydra (3)": relative_cost(models["slim"].config, args.seq_len)["macs_ratio"]}
    rows = []
    for batch in args.batch_sizes:
        inputs = make_inputs(modality, batch, args.seq_len)
        feeds = {k: v.numpy() for k, v in inputs.items()}
        with torch.inference_mode():
            reference = {"slim": models["slim"](**inputs).logits, "single": models["single"](**inputs).logits}
        for name, sess in sessions.items():
            reference_logits = reference["slim" if "slim" in name else "single"]
            diff = float((torch.from_numpy(sess.run(None, feeds)[0]) - reference_logits).abs().max())
            logger.info("%s batch %d: %s max |logit - eager| = %.2e", geometry, batch, name, diff)
            if "fp32" in name and diff > 1e-3:
                raise RuntimeError(f"{name} differs from eager by {diff}")
        fns = {
            "eager Single": lambda: models["single"](**inputs).logits,
            "eager Deep Ensemble (3)": lambda: [m(**inputs).logits for m in models["deep"]],
            "eager Hydra (3)": lambda: models["hydra"](**inputs).logits,
            "eager slim Hydra (3)": lambda: models["slim"](**inputs).logits,
            **{name: (lambda s=sess: s.run(None, feeds)) for name, sess in sessions.items()},
        }
        ms = interleaved_medians(fns, rounds=args.rounds, repeats=args.repeats, warmup=args.warmup)
        for name, value in ms.items():
            eager_name = "eager slim Hydra (3)" if "slim" in name else "eager Single"
            rows.append(
                {
                    "geometry": geometry,
                    "batch": batch,
                    "model": name,
                    "latency_ms": value,
                    "x Single": value
                    / ms["eager Single" if name.startswith("eager") else name.replace("slim Hydra (3)", "Single")],
                    "x Deep Ensemble": value / ms["eager Deep Ensemble (3)"],
                    "compute_x": compute.get(name, compute[eager_name]),
                    "params_M": params.get(name, params[eager_name]) / 1e6,
                }
            )
    return rows


def target_lines(rows: list[dict]) -> list[str]:
    lines = []
    for geometry in dict.fromkeys(r["geometry"] for r in rows):
        ms = {(r["batch"], r["model"]): r for r in rows if r["geometry"] == geometry}
        for label, num, den, batch, bound in TARGETS:
            if (batch, num) in ms and (batch, den) in ms:
                ratio = ms[(batch, num)]["latency_ms"] / ms[(batch, den)]["latency_ms"]
                lines.append(f"{geometry} batch {batch}: {label} = {ratio:.2f} (target <= {bound}: "
                             f"{'met' if ratio <= bound else 'MISSED'})")
        any_batch = next(iter(ms))[0]
        if (any_batch, "eager slim Hydra (3)") in ms:
            ratio = ms[(any_batch, "eager slim Hydra (3)")]["params_M"] / ms[(any_batch, "eager Single")]["params_M"]
            lines.append(f"{geometry}: slim Hydra parameters / Single = {ratio:.3f} (target <= 1.1: "
                         f"{'met' if ratio <= 1.1 else 'MISSED'})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--geometries", nargs="+", choices=["bert", "vit"], default=["bert", "vit"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-onnx", action="store_true", help="eager PyTorch only")
    parser.add_argument("--quick", action="store_true", help="smoke test: BERT, 2 layers, T = 32, batch 1 and 2")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file (a results file)")
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = pin_bench_threads(args.threads)
    if args.quick:
        args.geometries, args.layers, args.seq_len, args.batch_sizes = ["bert"], 2, 32, [1, 2]
        args.rounds, args.repeats, args.warmup = 1, 1, 1
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("torch %s, %d threads; nproc %d, load average %.2f %.2f %.2f", torch.__version__,
                torch.get_num_threads(), os.cpu_count(), *os.getloadavg())
    rows = []
    with tempfile.TemporaryDirectory(prefix="hydra-bench-slim-") as tmp:
        for geometry in args.geometries:
            rows += run_geometry(geometry, args, Path(tmp))
    print(table(rows, COLUMNS))
    lines = target_lines(rows)
    print("\n".join(lines))
    if args.json:
        write_results(args.json, threads, seq_len=args.seq_len, columns=COLUMNS, rows=rows, targets=lines,
                      summary=lines)


if __name__ == "__main__":
    main()
