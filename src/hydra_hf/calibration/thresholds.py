"""The uncertainty threshold above which the shipped pipelines flag an input, fitted on validation data
(member probabilities, or the inputs of a model that makes them) and stored in the model's config."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import AutoTokenizer

from .. import metrics
from ..modeling.pipeline_hydra import UNCERTAINTY_METRICS

__all__ = ["UNCERTAINTY_METRICS", "fit_uncertainty_threshold"]


def _member_probs(model: nn.Module, data: Any, tokenizer: Any | None, batch_size: int) -> torch.Tensor:
    """``(N, M, C)`` member probabilities of ``model`` on ``data``.

    ``data`` is a tensor of member probabilities ``(N, M, C)`` (used as is), a list of texts
    (tokenized with ``tokenizer``), or an iterable of batches (dicts of model inputs; ``labels``
    and ``label`` are dropped).
    """
    if isinstance(data, torch.Tensor):
        if data.dim() != 3:
            raise ValueError(f"member probabilities must have shape (N, M, C), got {tuple(data.shape)}")
        return data.double()
    if isinstance(data, (list, tuple)) and data and all(isinstance(x, str) for x in data):
        if tokenizer is None:
            source = getattr(model, "name_or_path", None)
            if not source:
                raise ValueError("texts need a tokenizer: pass tokenizer=AutoTokenizer.from_pretrained(folder)")
            tokenizer = AutoTokenizer.from_pretrained(source)
        batches: Iterable[Mapping[str, Any]] = (
            tokenizer(list(data[i : i + batch_size]), padding=True, truncation=True, return_tensors="pt")
            for i in range(0, len(data), batch_size)
        )
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes, Mapping)):
        batches = data
    else:
        raise TypeError(
            f"data must be a (N, M, C) tensor of member probabilities, a list of texts or an iterable of "
            f"input batches, got {type(data).__name__}"
        )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for batch in batches:
                inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                          for k, v in dict(batch).items() if k not in ("labels", "label")}
                output = model(**inputs)
                member_logits = output.get("member_logits")
                if member_logits is None:
                    member_logits = output.get("member_logits_per_image")
                if member_logits is None:
                    raise ValueError("the model returned no member logits; pass a Hydra Ensemble model")
                out.append(torch.softmax(member_logits.double(), dim=-1).cpu())  # (B, M, C)
    finally:
        model.train(was_training)
    if not out:
        raise ValueError("data is empty; pass at least one validation input")
    return torch.cat(out)


def fit_uncertainty_threshold(
    model: nn.Module,
    data: Any,
    *,
    metric: str = "mutual_information",
    quantile: float = 0.95,
    ood_data: Any | None = None,
    tokenizer: Any | None = None,
    batch_size: int = 32,
) -> dict[str, Any]:
    """Choose the uncertainty threshold above which the shipped pipelines flag an input, and store
    it in ``model.config.uncertainty_threshold`` (saved with the model's config).

    Rule, on in-distribution validation ``data``:
      - without ``ood_data``: the ``quantile`` of the validation uncertainties (``"higher"``
        interpolation, so at most ``1 - quantile`` of the validation inputs are flagged: with the
        default 0.95, 95 % of in-distribution inputs pass);
      - with ``ood_data`` (out-of-distribution validation inputs): the threshold maximizing
        Youden's J = (flagged fraction of OOD inputs) - (flagged fraction of ID inputs).

    Args:
        model: a Hydra Ensemble classifier (or CLIP model returning ``member_logits_per_image``).
        data, ood_data: member probabilities ``(N, M, C)``, a list of texts, or an iterable of
            input batches (see :func:`_member_probs`).
        metric: ``"mutual_information"`` (default: the members' disagreement), ``"predictive_entropy"``
            or ``"expected_entropy"``.
        quantile: in ``(0, 1]``.

    Returns:
        The stored dict: ``metric``, ``value``, ``rule`` and the numbers that justify it.
    """
    if metric not in UNCERTAINTY_METRICS:
        raise ValueError(f"metric={metric!r} is unknown; use one of {list(UNCERTAINTY_METRICS)}")
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile <= 1:
        raise ValueError(f"quantile must be a number in (0, 1], got {quantile!r}")
    measure = getattr(metrics, metric)
    u_id = measure(_member_probs(model, data, tokenizer, batch_size)).double()  # (N,)
    if ood_data is None:
        value = float(torch.quantile(u_id, float(quantile), interpolation="higher"))
        threshold = {"metric": metric, "value": value, "rule": "id_quantile", "quantile": float(quantile),
                     "num_samples": int(u_id.numel()), "flagged_fraction": float((u_id > value).double().mean())}
    else:
        u_ood = measure(_member_probs(model, ood_data, tokenizer, batch_size)).double()  # (N_ood,)
        candidates = torch.unique(torch.cat([u_id, u_ood]))
        candidates = torch.cat([candidates, candidates.min().reshape(1) - 1])  # "flag everything" as well
        flag_id = (u_id[None, :] > candidates[:, None]).double().mean(dim=1)  # (K,)
        flag_ood = (u_ood[None, :] > candidates[:, None]).double().mean(dim=1)  # (K,)
        j = flag_ood - flag_id
        best = int(torch.argmax(j))
        value = float(candidates[best])
        threshold = {"metric": metric, "value": value, "rule": "youden", "youden_j": float(j[best]),
                     "num_samples": int(u_id.numel()), "num_ood_samples": int(u_ood.numel()),
                     "flagged_fraction": float(flag_id[best]), "flagged_ood_fraction": float(flag_ood[best])}
    model.config.uncertainty_threshold = threshold
    return threshold
