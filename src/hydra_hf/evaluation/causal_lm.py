"""Evaluation of causal language models, stock or Hydra: perplexity and per-token calibration on
in-distribution text, sequence-level OOD detection from the mean per-token uncertainty.

A Hydra causal LM returns ``member_logits (B, M, T, V)`` (and ``logits (B, T, V)``, the log of the
mean of the members' softmaxes); a stock causal LM returns ``logits (B, T, V)`` and counts as one
member. :func:`evaluate_causal_lm` runs the model over the ID data and every named OOD set in
batches (right padding, attention mask), shifts for next tokens and streams each batch into a
:class:`hydra_hf.metrics.causal_lm.CausalLMAccumulator`: nothing of size ``(N, V)`` is kept. The numbers
come from :mod:`hydra_hf.metrics.causal_lm` and :mod:`hydra_hf.metrics` (ECE bins, AUROC, FPR@95).

Data may be given as texts with a tokenizer (:func:`tokenize_texts`), as token-id sequences
(:func:`batch_token_ids`; offline tests need no tokenizer), or as ready batches: mappings with
``input_ids`` (and ``attention_mask``) or ``(B, T)`` integer tensors.

``hydra-hf evaluate`` on a causal LM folder: :func:`load_causal_lm` (a Hydra or stock folder with its
tokenizer), :func:`evaluate_causal_lm` per model, :func:`write_causal_lm_report` (``report.json`` and
``report.md``: one row per model with perplexity, NLL, next-token accuracy, ECE and per OOD set the
AUROC / FPR95 of one sequence score, and a table of every score's AUROC).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from .. import metrics
from ..families import is_causal_lm_config
from ..metrics import causal_lm as lm_metrics
from ..progress import progress_bars
from .loading import max_text_positions
from .report import render_markdown_table, write_report
from .run import recipe_of

__all__ = [
    "CausalLMEnsemble",
    "batch_token_ids",
    "tokenize_texts",
    "causal_lm_member_logits",
    "run_causal_lm",
    "evaluate_causal_lm",
    "is_causal_lm_config",
    "causal_lm_rows",
    "causal_lm_columns",
    "write_causal_lm_report",
]

logger = logging.getLogger(__name__)

Batch = Mapping[str, torch.Tensor]


def batch_token_ids(
    sequences: Sequence[Sequence[int]], batch_size: int = 8, pad_token_id: int = 0
) -> list[dict[str, torch.Tensor]]:
    """Token-id sequences -> right-padded batches, in order.

    Shape:
        sequences: N lists of ids (any lengths) -> ceil(N / batch_size) dicts with ``input_ids (B, T)``
        int64 (``pad_token_id`` after each sequence's end) and ``attention_mask (B, T)`` int64, ``T``
        the longest sequence of the batch (at least 1).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    batches = []
    for start in range(0, len(sequences), batch_size):
        chunk = [torch.as_tensor(s, dtype=torch.int64).reshape(-1) for s in sequences[start:start + batch_size]]
        t = max(1, max(len(s) for s in chunk))
        ids = torch.full((len(chunk), t), int(pad_token_id), dtype=torch.int64)
        attention = torch.zeros((len(chunk), t), dtype=torch.int64)
        for i, s in enumerate(chunk):
            ids[i, : len(s)] = s
            attention[i, : len(s)] = 1
        batches.append({"input_ids": ids, "attention_mask": attention})
    return batches


def _pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its EOS id (causal LM tokenizers often have no pad token; the
    attention mask hides it either way), else 0."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def _token_ids(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    if isinstance(texts, str) or not all(isinstance(x, str) for x in texts):
        raise TypeError("texts must be a list of strings; pass [text] for a single text")
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 (a next-token prediction needs two tokens), got {max_length}")
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length, padding=False)
    return [list(ids) for ids in encoded["input_ids"]]


def tokenize_texts(
    tokenizer: Any, texts: Sequence[str], max_length: int = 512, batch_size: int = 8
) -> list[dict[str, torch.Tensor]]:
    """Tokenize ``texts`` (truncated to ``max_length`` tokens, the tokenizer's special tokens added)
    into right-padded batches, in order; the pad id is the tokenizer's pad token, else its EOS.

    Shape:
        texts: N strings -> ceil(N / batch_size) dicts with ``input_ids (B, T)``, ``attention_mask (B, T)``.
    """
    return batch_token_ids(_token_ids(tokenizer, texts, max_length), batch_size, _pad_token_id(tokenizer))


def _is_token_sequence(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return x.ndim == 1 and not x.is_floating_point()
    return isinstance(x, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)


def _as_batches(data: Any, name: str, tokenizer: Any, max_length: int, batch_size: int) -> Iterable[Batch]:
    """Texts, token-id sequences or batches -> an iterable of batches (sequences with fewer than 2
    tokens dropped from texts / id lists, as they hold no next-token prediction)."""
    if isinstance(data, (str, torch.Tensor)) or isinstance(data, Mapping):
        raise TypeError(
            f"{name}: pass a list of texts, a list of token-id lists or an iterable of batches, got a "
            f"{type(data).__name__}; wrap a single batch in a list"
        )
    if isinstance(data, Sequence) and len(data) and (isinstance(data[0], str) or _is_token_sequence(data[0])):
        if isinstance(data[0], str):
            if tokenizer is None:
                raise ValueError(
                    f"{name} is a list of texts but tokenizer is None; pass "
                    "tokenizer=AutoTokenizer.from_pretrained(...)"
                )
            ids, pad = _token_ids(tokenizer, data, max_length), _pad_token_id(tokenizer)
        else:
            if not all(_is_token_sequence(s) for s in data):
                raise TypeError(f"{name}: every sequence must be a list of int token ids (or a 1-D int tensor)")
            ids = [torch.as_tensor(s, dtype=torch.int64)[:max_length] for s in data]
            pad = _pad_token_id(tokenizer) if tokenizer is not None else 0
        kept = [s for s in ids if len(s) >= 2]
        if len(kept) < len(ids):
            logger.warning(
                "%s: %d of %d sequences have fewer than 2 tokens (no next-token prediction) and are left out",
                name,
                len(ids) - len(kept),
                len(ids),
            )
        if not kept:
            raise ValueError(f"{name}: no sequence has 2 or more tokens; pass longer texts")
        return batch_token_ids(kept, batch_size, pad)
    return data


def _prepare(batch: Any, name: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        input_ids, attention_mask = batch, None
    elif isinstance(batch, Mapping) and "input_ids" in batch:
        input_ids, attention_mask = batch["input_ids"], batch.get("attention_mask")
    else:
        raise TypeError(
            f"{name}: a batch must be a (B, T) token-id tensor or a mapping with "
            f"'input_ids', got {type(batch).__name__}"
        )
    input_ids = torch.as_tensor(input_ids)
    if input_ids.ndim != 2 or input_ids.is_floating_point():
        raise ValueError(
            f"{name}: input_ids must be a (B, T) integer tensor, got "
            f"{input_ids.dtype} of shape {tuple(input_ids.shape)}"
        )
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = torch.as_tensor(attention_mask)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"{name}: attention_mask has shape {tuple(attention_mask.shape)} but "
            f"input_ids has {tuple(input_ids.shape)}"
        )
    return input_ids.to(device=device, dtype=torch.int64), attention_mask.to(device=device, dtype=torch.int64)


def _accepts(model: nn.Module, argument: str) -> bool:
    try:
        return argument in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def causal_lm_member_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One forward pass: the output's ``member_logits`` (a Hydra causal LM) or its ``logits`` as one
    member (a stock causal LM). The KV cache is turned off where the model takes ``use_cache``.

    Shape:
        input_ids, attention_mask: (B, T) -> (B, M, T, V)
    """
    extra = {"use_cache": False} if _accepts(model, "use_cache") else {}
    out = model(input_ids=input_ids, attention_mask=attention_mask, **extra)
    get = out.get if isinstance(out, Mapping) else (lambda key: getattr(out, key, None))
    logits = get("member_logits")
    if logits is None:
        logits = get("logits")
    if logits is None:
        raise TypeError(
            f"the model returned {type(out).__name__} without 'member_logits' or 'logits'; pass a causal LM "
            "(…ForCausalLM)"
        )
    return lm_metrics.as_member_logits(logits)


class CausalLMEnsemble(nn.Module):
    """M stock causal LMs run one after another on the same batch, seen as one model with ``member_logits (B, M,
    T, V)``: a Deep or LoRA Ensemble as it is deployed, evaluated by :func:`evaluate_causal_lm` like a Hydra.

    Args:
        models: the members (``*ForCausalLM``, or Hydra causal LMs: their ensemble ``logits`` count as one member).
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        if not models:
            raise ValueError("a CausalLMEnsemble needs at least one model")
        self.members = nn.ModuleList(models)
        self.config = getattr(models[0], "config", None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = [m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits for m in self.members]
        return {"member_logits": torch.stack(logits, dim=1)}  # (B, M, T, V)


@torch.no_grad()
def run_causal_lm(
    model: nn.Module,
    batches: Iterable[Any],
    *,
    name: str = "data",
    device: torch.device | str | None = None,
    progress: bool = True,
    chunk_elements: int = lm_metrics.CHUNK_ELEMENTS,
) -> lm_metrics.CausalLMAccumulator:
    """Run ``model`` over ``batches`` (mappings with ``input_ids`` / ``attention_mask``, or ``(B, T)``
    id tensors) and stream its next-token predictions into a :class:`~hydra_hf.metrics.causal_lm.CausalLMAccumulator`.

    The model runs in eval mode under ``torch.no_grad`` (its training flag is restored afterwards).
    """
    if device is None:
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
    device = torch.device(device)
    accumulator = lm_metrics.CausalLMAccumulator(chunk_elements)
    was_training = model.training
    model.eval()
    try:
        for batch in tqdm(batches, desc=f"causal LM: {name}", disable=not (progress and progress_bars()), leave=False):
            input_ids, attention_mask = _prepare(batch, name, device)
            logits = causal_lm_member_logits(model, input_ids, attention_mask)
            accumulator.update(*lm_metrics.shift_for_next_token(logits, input_ids, attention_mask))
            del logits
    finally:
        model.train(was_training)
    if accumulator.num_sequences == 0:
        raise ValueError(f"{name} holds no batch; pass at least one sequence")
    return accumulator


def _finite(scores: torch.Tensor, name: str, score: str) -> torch.Tensor:
    kept = scores[torch.isfinite(scores)]
    if kept.numel() < scores.numel():
        logger.warning(
            "%s: %d of %d sequences have no next-token prediction (fewer than 2 tokens) and are left out of %s",
            name,
            scores.numel() - kept.numel(),
            scores.numel(),
            score,
        )
    if kept.numel() == 0:
        raise ValueError(f"{name}: no sequence has 2 or more real tokens; pass longer sequences")
    return kept


def evaluate_causal_lm(
    model: nn.Module,
    data: Any,
    ood: Mapping[str, Any] | None = None,
    *,
    tokenizer: Any = None,
    max_length: int = 512,
    batch_size: int = 8,
    n_bins: int = 15,
    device: torch.device | str | None = None,
    progress: bool = True,
    return_sequence_scores: bool = False,
    chunk_elements: int = lm_metrics.CHUNK_ELEMENTS,
) -> dict[str, Any]:
    """Perplexity, next-token accuracy and calibration on ID data; sequence-level OOD detection.

    Args:
        model: a causal LM; a Hydra one returns ``member_logits (B, M, T, V)``, a stock one ``logits
            (B, T, V)`` (M = 1).
        data: the in-distribution set: texts (with ``tokenizer``), token-id sequences, or an iterable
            of batches (mappings with ``input_ids`` and ``attention_mask``, right or left padded, or
            ``(B, T)`` id tensors). Texts and id sequences are truncated to ``max_length`` tokens and
            batched ``batch_size`` at a time (``max_length`` at most the model's positions, e.g. GPT-2's
            ``n_positions``); those with fewer than 2 tokens are left out.
        ood: named OOD sets, each in one of the forms of ``data``.
        batch_size: sequences per forward pass for texts / id lists. The model's own output, ``B x M x
            T x V`` logits, is the largest tensor of a pass (the metrics add a few chunks of
            ``chunk_elements``); lower it for long sequences or large vocabularies.
        n_bins: equal-width bins of the per-token ECE.
        return_sequence_scores: also return every set's per-sequence scores (tensors) under
            ``"sequence_scores"``.

    Returns:
        ``{"perplexity", "nll", "accuracy", "ece", "msp", "predictive_entropy", "expected_entropy",
        "mutual_information", "disagreement", "num_tokens", "num_sequences", "num_members", "error_detection",
        "n_bins",
        "ood": {name: {the same token numbers on that set, "scores": {score: {"auroc", "fpr95",
        "aupr_in", "aupr_out"}}}}}``: every number a python float or int (``"error_detection"``: ``{token
        score: AUROC}`` with which the score flags the wrong next tokens,
        :func:`hydra_hf.metrics.causal_lm.token_error_detection`); with a model config, ``"recipe"``
        (:func:`hydra_hf.evaluation.recipe_of`). The ID numbers are over all
        valid ID tokens pooled. The scores (:data:`hydra_hf.metrics.causal_lm.SEQUENCE_SCORES`, higher = more
        ID, ID the positive class) are the mean MSP, the negative mean predictive entropy, the
        negative mean mutual information (``M > 1`` only) and the mean token log-likelihood of each
        sequence. With ``return_sequence_scores``: ``"sequence_scores": {"id": {score: (N_id,)},
        name: {score: (N_name,)}}`` (float64, NaN for a sequence without a prediction).
    """
    ood = dict(ood or {})
    if "id" in ood:
        raise ValueError("an OOD set is named 'id', which names the ID set in the report; rename it")
    limit = max_text_positions(getattr(model, "config", None))
    if limit is not None and max_length > limit:  # longer texts would index past the position embeddings
        logger.info("max_length %d is more than the model's %d positions: texts are truncated to %d tokens",
                    max_length, limit, limit)
        max_length = limit
    runs = {}
    for name, value in [("id", data), *ood.items()]:
        batches = _as_batches(value, name, tokenizer, max_length, batch_size)
        runs[name] = run_causal_lm(
            model, batches, name=name, device=device, progress=progress, chunk_elements=chunk_elements
        )
    id_run = runs["id"]
    report: dict[str, Any] = {**id_run.summary(n_bins), "n_bins": n_bins, "ood": {}}
    recipe = recipe_of(model)
    if recipe is not None:
        report["recipe"] = recipe
    logger.info("ID: perplexity %.4g, next-token accuracy %.4f, ECE %.4f over %d tokens of %d sequences (M=%d)",
                report["perplexity"], report["accuracy"], report["ece"], report["num_tokens"], report["num_sequences"],
                report["num_members"])
    id_scores = id_run.sequence_scores()
    for name in ood:
        run = runs[name]
        if run.num_members != id_run.num_members:
            raise ValueError(
                f"OOD set {name!r} gave M={run.num_members} members but the ID set M={id_run.num_members}; the model "
                "changed"
            )
        entry = run.summary(n_bins)
        entry["scores"] = {}
        for score, values in run.sequence_scores().items():
            entry["scores"][score] = metrics.ood_report(
                _finite(id_scores[score], "id", score), _finite(values, name, score)
            )
        logger.info("OOD %s: perplexity %.4g; AUROC %s", name, entry["perplexity"],
                    ", ".join(f"{s} {r['auroc']:.4f}" for s, r in entry["scores"].items()))
        report["ood"][name] = entry
    if return_sequence_scores:
        report["sequence_scores"] = {name: run.sequence_scores() for name, run in runs.items()}
    if not math.isfinite(report["perplexity"]):
        logger.warning("the ID perplexity overflowed (mean NLL %.4g nats)", report["nll"])
    return report


_OOD_KEYS = ("auroc", "fpr95", "aupr_in", "aupr_out")


def causal_lm_rows(
    reports: Mapping[str, Mapping[str, Any]], *, score: str = "msp", params: Mapping[str, int] | None = None,
    compute: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One report row per model from :func:`evaluate_causal_lm` reports: ``method``, ``perplexity``,
    ``nll``, ``accuracy`` (next token), ``ece``, ``msp``, ``mutual_information``, ``members``,
    ``num_tokens``, per OOD set ``"<set>/perplexity"`` and ``"<set>/auroc"`` ... of the sequence score
    ``score`` (:data:`hydra_hf.metrics.causal_lm.SEQUENCE_SCORES`; a model without it, e.g. mutual information
    of one model, leaves the cells empty), ``params_m`` when ``params`` gives the parameter count, ``compute_x``
    (multiply-adds per token relative to the Single, :mod:`hydra_hf.cost`) when ``compute`` gives it, and the
    report's ``recipe`` (:func:`hydra_hf.evaluation.recipe_of`)."""
    if score not in lm_metrics.SEQUENCE_SCORES:
        raise ValueError(f"unknown sequence score {score!r}; choose one of {list(lm_metrics.SEQUENCE_SCORES)}")
    rows = []
    for name, report in reports.items():
        row: dict[str, Any] = {"method": name}
        for key in ("perplexity", "nll", "accuracy", "ece", "msp", "mutual_information", "num_tokens"):
            row[key] = report.get(key)
        row["members"] = report.get("num_members")
        for ood_name, entry in (report.get("ood") or {}).items():
            row[f"{ood_name}/perplexity"] = entry.get("perplexity")
            values = (entry.get("scores") or {}).get(score) or {}
            for key in _OOD_KEYS:
                row[f"{ood_name}/{key}"] = values.get(key)
        if params and name in params:
            row["params_m"] = params[name] / 1e6
        if compute and name in compute:
            row["compute_x"] = compute[name]
        if isinstance(report.get("recipe"), str):
            row["recipe"] = report["recipe"]
        rows.append(row)
    return rows


def causal_lm_columns(ood_sets: Sequence[str]) -> list[list[str]]:
    """The report table's columns (``[key, header, format]``) for :func:`causal_lm_rows`."""
    columns = [["method", "Method", ""], ["perplexity", "PPL ↓", ".4g"], ["nll", "NLL ↓", ".4f"],
               ["accuracy", "Acc ↑", ".4f"], ["ece", "ECE ↓", ".4f"], ["mutual_information", "MI", ".4f"]]
    for name in ood_sets:
        columns += [[f"{name}/auroc", f"{name} AUROC ↑", ".4f"], [f"{name}/fpr95", f"{name} FPR95 ↓", ".4f"]]
    columns.append(["compute_x", "compute (x Single)", ".2f"])
    columns.append(["params_m", "params (M)", ".3g"])
    return columns


def _scores_table(reports: Mapping[str, Mapping[str, Any]], ood_sets: Sequence[str]) -> str:
    """Markdown: the AUROC of every sequence score, one row per model and OOD set."""
    scores = list(lm_metrics.SEQUENCE_SCORES)
    rows = []
    for name, report in reports.items():
        for ood_name in ood_sets:
            found = ((report.get("ood") or {}).get(ood_name) or {}).get("scores") or {}
            rows.append({"method": name, "ood": ood_name, **{s: (found.get(s) or {}).get("auroc") for s in scores}})
    columns = [("method", "Model", ""), ("ood", "OOD set", ""), *((s, f"{s} AUROC ↑", ".4f") for s in scores)]
    return render_markdown_table(rows, columns)


def write_causal_lm_report(
    reports: Mapping[str, Mapping[str, Any]],
    out_dir: str | os.PathLike,
    *,
    score: str = "msp",
    settings: Mapping[str, Any] | None = None,
    params: Mapping[str, int] | None = None,
    title: str = "Hydra Ensembles causal LM evaluation",
    compute: Mapping[str, float] | None = None,
) -> dict[str, str]:
    """Write ``report.json`` and ``report.md`` of :func:`evaluate_causal_lm` reports (``{model name:
    report}``) into ``out_dir``: the table of :func:`causal_lm_rows` (OOD columns of ``score``), the
    AUROC of every sequence score, and every model's full report under ``"causal_lm"`` in the JSON.

    Returns ``{"json": path, "markdown": path}``."""
    if not reports:
        raise ValueError("no model report to write; pass {name: evaluate_causal_lm(...)}")
    ood_sets = list(dict.fromkeys(o for report in reports.values() for o in (report.get("ood") or {})))
    clean = {name: {k: v for k, v in report.items() if k != "sequence_scores"} for name, report in reports.items()}
    notes = (
        "Causal LM: perplexity = exp(mean next-token NLL, nats) over every valid ID token; Acc is next-token "
        "accuracy of the members' mean distribution, ECE its per-token calibration (top token, "
        f"{next(iter(reports.values())).get('n_bins', 15)} equal-width bins); MI is the mean per-token mutual "
        "information (member disagreement; one model has none). OOD detection is per sequence: a sequence's score is "
        f"the mean over its tokens (here `{score}`; higher = more in-distribution), ID the positive class. Brier and "
        "aECE do not apply."
    )
    if ood_sets:
        notes += "\n\nAUROC of every sequence score:\n\n" + _scores_table(reports, ood_sets)
    report = {
        "title": title,
        "task": "causal_lm",
        "rows": causal_lm_rows(reports, score=score, params=params, compute=compute),
        "columns": causal_lm_columns(ood_sets),
        "ood_sets": ood_sets,
        "ood_score": score,
        "causal_lm": clean,
        "notes": notes,
    }
    if settings is not None:
        report["settings"] = dict(settings)
    return write_report(report, out_dir)
