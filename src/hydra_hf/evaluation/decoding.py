"""Decode speed of causal LMs, measured side by side: a stock model, a fused Hydra, or members run one by one.

A *group* is one causal LM (a stock ``*ForCausalLM`` or a fused Hydra, whose ``logits`` are already the log of
the members' mean softmax) or a list of causal LMs run one after another with a cache each, decoding from the
log of the mean of their softmaxes (what a user without the fused model runs for an ensemble).
:func:`greedy_decode` prefills a prompt and then decodes one token per step with the cache, timing both phases;
:func:`decode_speed` times every group at every batch size in interleaved rounds (the median of each), so the
groups share the machine's state and the ratios between them are the result, not the absolute tokens/s.

Example::

    speed = decode_speed({"Single": stock, "Hydra": hydra, "members one by one": members}, prompts,
                         batch_sizes=(1, 8), new_tokens=16)
    speed["8"]["Hydra"]["decode_tokens_per_s"] / speed["8"]["Single"]["decode_tokens_per_s"]
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Group", "decode_speed", "ensemble_step_log_probs", "greedy_decode"]

Group = nn.Module | Sequence[nn.Module]


def ensemble_step_log_probs(logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """Log of the mean of M models' softmaxes, as a fused Hydra computes its ``logits``.

    Shape:
        logits: M tensors ``(B, V)`` -> ``(B, V)`` float32.
    """
    log_p = F.log_softmax(torch.stack(list(logits), dim=1).float(), dim=-1)  # (B, M, V)
    return torch.logsumexp(log_p, dim=1) - math.log(len(logits))


@torch.inference_mode()
def greedy_decode(group: Group, input_ids: torch.Tensor, new_tokens: int) -> dict[str, Any]:
    """Greedy decoding of ``new_tokens`` tokens after the prompt ``input_ids`` (no padding), timed.

    The prefill is one forward pass over the prompt (the last position's logits only, as ``generate()``
    computes them) and gives the first new token; then ``new_tokens - 1`` steps of one token each with the cache.

    Shape:
        input_ids: ``(B, P)`` -> ``tokens (B, new_tokens)``.

    Returns:
        ``{"tokens", "prefill_s", "decode_s"}``: the greedy tokens, the prefill's seconds and the seconds of
        the one-token steps.
    """
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 2:
        raise ValueError(f"new_tokens must be an int >= 2 (a prefill and one decode step), got {new_tokens!r}")
    models = list(group) if isinstance(group, Sequence) else [group]
    if not models:
        raise ValueError("the group holds no model; give a causal LM or a list of them")

    def step(inputs: torch.Tensor, caches: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        logits, new_caches = [], []
        for model, cache in zip(models, caches):
            out = model(input_ids=inputs, cache=cache, use_cache=True, logits_to_keep=1)
            new_caches.append(out.cache)
            logits.append(out.logits[:, -1])  # (B, V); a fused Hydra's are the ensemble's log-probabilities
        scores = logits[0] if len(logits) == 1 else ensemble_step_log_probs(logits)
        return scores.argmax(-1, keepdim=True), new_caches  # (B, 1)

    start = time.perf_counter()
    token, caches = step(input_ids, [None] * len(models))
    prefilled = time.perf_counter()
    tokens = [token]
    for _ in range(new_tokens - 1):
        token, caches = step(token, caches)
        tokens.append(token)
    done = time.perf_counter()
    return {"tokens": torch.cat(tokens, dim=1), "prefill_s": prefilled - start, "decode_s": done - prefilled}


def decode_speed(
    groups: Mapping[str, Group],
    prompts: torch.Tensor,
    *,
    batch_sizes: Sequence[int] = (1, 8),
    new_tokens: int = 16,
    rounds: int = 3,
    warmup: int = 1,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Greedy decode speed of every group at every batch size, measured side by side (interleaved rounds).

    Args:
        groups: name -> a causal LM or a list of causal LMs run one by one (:func:`greedy_decode`).
        prompts: ``(N, P)`` prompt token ids (no padding); batch size ``B`` decodes the first ``B`` of them.
        batch_sizes: the batch sizes to measure, each at most ``N``.
        new_tokens: tokens generated per run (the first by the prefill).
        rounds: timed rounds; every round runs every group once, in turn; the median of each is reported.
        warmup: untimed rounds first.

    Returns:
        ``{str(B): {name: {"decode_tokens_per_s", "decode_s", "prefill_s", "tokens"}}}``: tokens/s of the
        one-token steps (``B * (new_tokens - 1) / decode_s``), the median seconds, and the greedy tokens of the
        last round as lists (``B`` rows of ``new_tokens``: a fused Hydra and its members run one by one compute
        the same distributions, so they give the same tokens up to near-ties).
    """
    if not groups:
        raise ValueError("no group to measure; give {name: model or [models]}")
    prompts = torch.as_tensor(prompts)
    if prompts.ndim != 2 or prompts.is_floating_point():
        raise ValueError(f"prompts must be (N, P) integer token ids, got {prompts.dtype} {tuple(prompts.shape)}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for batch in batch_sizes:
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= prompts.shape[0]:
            raise ValueError(f"batch size {batch!r} must be an int in [1, {prompts.shape[0]}] (the prompts given)")
        ids = prompts[:batch]
        for _ in range(warmup):
            for group in groups.values():
                greedy_decode(group, ids, new_tokens)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in groups}
        for _ in range(rounds):
            for name, group in groups.items():
                runs[name].append(greedy_decode(group, ids, new_tokens))
        results[str(batch)] = {}
        for name, samples in runs.items():
            decode_s = statistics.median(r["decode_s"] for r in samples)
            results[str(batch)][name] = {
                "decode_tokens_per_s": batch * (new_tokens - 1) / decode_s,
                "decode_s": decode_s,
                "prefill_s": statistics.median(r["prefill_s"] for r in samples),
                "tokens": samples[-1]["tokens"].tolist(),
            }
    return results
