"""ONNX Runtime (fp32 and int8) against PyTorch eager, at BERT-base (T = 128) and ViT-B/16 sizes, CPU.

Contenders, all measured side by side in this process (interleaved rounds, medians):
- eager Single: one stock ``BertForSequenceClassification`` / ``ViTForImageClassification`` (SDPA).
- eager Deep Ensemble (3): 3 full stock models run one after another.
- eager Hydra (3): 3 members keeping 6 of 12 heads per layer (random), averaged MLP, one forward pass.
- ONNX fp32 Single / Hydra: the same models exported with ``torch.onnx.export(dynamo=True)`` (as
  ``hydra-hf export`` does: hydra_hf.onnx.export), run by ONNX Runtime's CPUExecutionProvider with as
  many intra-op threads as torch uses.
- ONNX int8 Single / Hydra: the export's default recipe (smoothquant, hydra_hf.onnx.int8); int8-keep-fc2 and
  int8-all: the earlier per-tensor ``quantize_dynamic`` graphs (QInt8 weights on MatMul / Gemm).

Random weights (the timing does not depend on them); every ONNX graph is checked against its eager
model on the benchmark's inputs first (fp32: max |diff| printed). The issue's targets, printed at the
end: ONNX fp32 Hydra / eager Hydra <= 0.80 at batch 1 and <= 0.92 at batch 8; int8 Hydra / eager
Single <= 1.0 at batch 1; int8 Hydra / eager Hydra <= 0.5 at batch 8.

    python bench/bench_onnx.py [--geometries bert vit] [--batch-sizes 1 8] [--rounds 5] [--quick]

``--quick`` is a smoke test (2-layer models, BERT at T = 32 only, one round): its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    add_threads_argument,
    count_parameters,
    interleaved_medians,
    pin_bench_threads,
    random_kept_heads,
    table,
    write_results,
)

from hydra_hf.onnx.export import OnnxGraph, dynamic_shapes, export_module
from hydra_hf.onnx.graph import quantize_int8
from hydra_hf.onnx.int8 import INT8_RECIPES

logger = logging.getLogger("bench_onnx")

CONTENDERS = ("eager Single", "eager Deep Ensemble (3)", "eager Hydra (3)", "ONNX fp32 Single", "ONNX fp32 Hydra (3)",
              "ONNX int8 Single", "ONNX int8 Hydra (3)", "ONNX int8-keep-fc2 Single", "ONNX int8-keep-fc2 Hydra (3)",
              "ONNX int8-all Single", "ONNX int8-all Hydra (3)")
# int8: the export's default recipe, smoothquant (constants folded, fc2 smoothed with alpha calibrated on
# the benchmark's random inputs, per-channel int8 weights on every product; hydra_hf.onnx.int8);
# int8-keep-fc2: the earlier default (per-tensor, MLP output projections fp32, members' stacked projections
# fp32); int8-all: every constant weight per-tensor (`hydra-hf export --quantize-all`)
COLUMNS = ["geometry", "batch", "model", "latency_ms", "x eager Single", "x eager Hydra", "weights_M", "file_MB"]
TARGETS = [  # (name, numerator, denominator, batch, bound)
    ("ONNX fp32 Hydra / eager Hydra", "ONNX fp32 Hydra (3)", "eager Hydra (3)", 1, 0.80),
    ("ONNX fp32 Hydra / eager Hydra", "ONNX fp32 Hydra (3)", "eager Hydra (3)", 8, 0.92),
    ("int8 Hydra / eager Single", "ONNX int8 Hydra (3)", "eager Single", 1, 1.0),
    ("int8 Hydra / eager Hydra", "ONNX int8 Hydra (3)", "eager Hydra (3)", 8, 0.5),
    ("int8 Hydra / int8 Single (stretch)", "ONNX int8 Hydra (3)", "ONNX int8 Single", 1, 1.2),
]


def build(geometry: str, layers: int | None, members: int = 3, keep: int = 6) -> tuple[dict, str]:
    """``{"single", "deep", "hydra"}`` eager models of ``geometry`` (random weights, SDPA) and its modality."""
    if geometry == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig
        from hydra_hf.modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification

        base = BertConfig(num_labels=2, **({"num_hidden_layers": layers} if layers else {}))
        stock, hydra_config, hydra_class, modality = (BertForSequenceClassification, HydraEnsembleConfig,
                                                      HydraEnsembleForSequenceClassification, "text")
    else:
        from transformers import ViTConfig, ViTForImageClassification

        from hydra_hf.modeling.configuration_hydra_vit import HydraEnsembleViTConfig
        from hydra_hf.modeling.modeling_hydra_vit import HydraEnsembleForImageClassification

        base = ViTConfig(num_labels=1000, **({"num_hidden_layers": layers} if layers else {}))
        stock, hydra_config, hydra_class, modality = (ViTForImageClassification, HydraEnsembleViTConfig,
                                                      HydraEnsembleForImageClassification, "image")
    torch.manual_seed(0)
    single = stock(base).eval()
    deep = [stock(base).eval() for _ in range(members)]
    kept = random_kept_heads(members, base.num_hidden_layers, base.num_attention_heads, keep)
    hydra = hydra_class(hydra_config(base_config=base.to_dict(), kept_heads=kept, num_labels=base.num_labels)).eval()
    for model in [single, *deep, hydra]:
        model.set_attn_implementation("sdpa")
    return {"single": single, "deep": deep, "hydra": hydra}, modality


def make_inputs(modality: str, batch: int, seq_len: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(batch)
    if modality == "image":
        return {"pixel_values": torch.randn(batch, 3, 224, 224, generator=g)}
    ids = torch.randint(1000, 30000, (batch, seq_len), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def export_pair(model: torch.nn.Module, keys: tuple[str, ...], modality: str, folder: Path, name: str, seq_len: int):
    """fp32 and int8 ONNX files of ``model`` (the example has a padded row and batch 2): the default
    recipe (smoothquant, calibrated on 4 random batches), keep-fc2 and all."""
    example = make_inputs(modality, 2, min(seq_len, 16))
    if "attention_mask" in example:
        example["attention_mask"][0, 8:] = 0
    fp32 = export_module(OnnxGraph(model, keys), example, dynamic_shapes(list(example), modality), keys,
                         folder / f"{name}.onnx")
    int8, int8_keep, int8_all = (folder / f"{name}_{tag}.onnx" for tag in ("int8", "int8_keep_fc2", "int8_all"))
    calibration = [{k: v.numpy() for k, v in make_inputs(modality, 4, min(seq_len, 64)).items()} for _ in range(2)]
    info = INT8_RECIPES["smoothquant"].run(fp32, int8, calibration)
    logger.info("%s int8 (smoothquant): alpha %s, %d MatMulInteger", name, info["alpha"], info["MatMulInteger"])
    kept = quantize_int8(fp32, int8_keep)["kept_fp32"]
    logger.info("%s int8-keep-fc2: %d products kept fp32", name, len(kept))
    quantize_int8(fp32, int8_all, keep_mlp_output_fp32=False)
    return fp32, int8, int8_keep, int8_all


def session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    # ONNX Runtime's idle threads spin-wait after each run by default, taking the cores from the next
    # contender of an interleaved round (eager PyTorch measured up to 2x slower beside them): off
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def run_geometry(geometry: str, args, folder: Path) -> list[dict]:
    models, modality = build(geometry, args.layers)
    threads = torch.get_num_threads()
    files = {}
    for name, keys in (("single", ("logits",)), ("hydra", ("logits", "member_logits"))):
        logger.info("%s: exporting %s to ONNX (fp32, then int8)", geometry, name)
        files[name] = export_pair(models[name], keys, modality, folder, f"{geometry}-{name}", args.seq_len)
    sessions = {
        f"ONNX fp32 {label}": session(files[name][0], threads)
        for name, label in (("single", "Single"), ("hydra", "Hydra (3)"))
    }
    sessions |= {
        f"ONNX int8 {label}": session(files[name][1], threads)
        for name, label in (("single", "Single"), ("hydra", "Hydra (3)"))
    }
    sessions |= {
        f"ONNX int8-keep-fc2 {label}": session(files[name][2], threads)
        for name, label in (("single", "Single"), ("hydra", "Hydra (3)"))
    }
    sessions |= {
        f"ONNX int8-all {label}": session(files[name][3], threads)
        for name, label in (("single", "Single"), ("hydra", "Hydra (3)"))
    }
    sizes = {
        f"ONNX {kind} {label}": files[name][i]
        for i, kind in ((0, "fp32"), (1, "int8"), (2, "int8-keep-fc2"), (3, "int8-all"))
        for name, label in (("single", "Single"), ("hydra", "Hydra (3)"))
    }
    rows = []
    for batch in args.batch_sizes:
        inputs = make_inputs(modality, batch, args.seq_len)
        feeds = {name: {k: v.numpy() for k, v in inputs.items()} for name in sessions}
        with torch.inference_mode():
            eager = {"single": models["single"](**inputs).logits, "hydra": models["hydra"](**inputs).logits}
        for name, sess in sessions.items():
            got = torch.from_numpy(sess.run(None, feeds[name])[0])
            diff = float((got - eager["hydra" if "Hydra" in name else "single"]).abs().max())
            logger.info("%s batch %d: %s max |logit - eager| = %.2e", geometry, batch, name, diff)
            if "fp32" in name and diff > 1e-3:
                raise RuntimeError(f"{name} differs from eager by {diff}")
        fns = {
            "eager Single": lambda: models["single"](**inputs).logits,
            "eager Deep Ensemble (3)": lambda: [m(**inputs).logits for m in models["deep"]],
            "eager Hydra (3)": lambda: models["hydra"](**inputs).logits,
            **{name: (lambda s=sess, f=feeds[name]: s.run(None, f)) for name, sess in sessions.items()},
        }
        ms = interleaved_medians(fns, rounds=args.rounds, repeats=args.repeats, warmup=args.warmup)
        weights = {"eager Single": count_parameters(models["single"]),
                   "eager Deep Ensemble (3)": sum(count_parameters(m) for m in models["deep"]),
                   "eager Hydra (3)": count_parameters(models["hydra"])}
        for name in CONTENDERS:
            weights.setdefault(name, weights["eager Hydra (3)" if "Hydra" in name else "eager Single"])
            rows.append({
                "geometry": geometry, "batch": batch, "model": name, "latency_ms": ms[name],
                "x eager Single": ms[name] / ms["eager Single"], "x eager Hydra": ms[name] / ms["eager Hydra (3)"],
                "weights_M": weights[name] / 1e6,
                "file_MB": sizes[name].stat().st_size / 2**20 if name in sizes else float("nan"),
            })
    return rows


def target_lines(rows: list[dict]) -> list[str]:
    lines = []
    for geometry in dict.fromkeys(r["geometry"] for r in rows):
        ms = {(r["batch"], r["model"]): r["latency_ms"] for r in rows if r["geometry"] == geometry}
        for label, num, den, batch, bound in TARGETS:
            if (batch, num) not in ms:
                continue
            ratio = ms[(batch, num)] / ms[(batch, den)]
            verdict = "met" if ratio <= bound else "MISSED"
            lines.append(f"{geometry} batch {batch}: {label} = {ratio:.2f} (target <= {bound:.2f}: {verdict})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--geometries", nargs="+", choices=["bert", "vit"], default=["bert", "vit"],
                        help="BERT-base (text, T = --seq-len) and/or ViT-B/16 (224 px)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seq-len", type=int, default=128, help="text tokens per example (default 128)")
    parser.add_argument("--layers", type=int, default=None, help="encoder layers (default: the base geometry's 12)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: BERT only, 2 layers, T = 32, batch 1 and 2, one round (numbers mean nothing)",
    )
    parser.add_argument("--json", default=None, help="also write the thread settings and the rows to this JSON file")
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = pin_bench_threads(args.threads)
    if args.quick:
        args.geometries, args.layers, args.seq_len, args.batch_sizes = ["bert"], 2, 32, [1, 2]
        args.rounds, args.repeats, args.warmup = 1, 1, 1
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import os

    import onnxruntime

    load = os.getloadavg()
    logger.info("torch %s (%d threads), onnxruntime %s; nproc %d, load average %.2f %.2f %.2f", torch.__version__,
                torch.get_num_threads(), onnxruntime.__version__, os.cpu_count(), *load)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hydra-bench-onnx-") as tmp:
        for geometry in args.geometries:
            rows += run_geometry(geometry, args, Path(tmp))
    print(table(rows, COLUMNS))
    print("\n".join(target_lines(rows)))
    logger.info("load average after: %.2f %.2f %.2f", *os.getloadavg())
    if args.json:
        write_results(args.json, threads, columns=COLUMNS, rows=rows, summary=target_lines(rows))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
