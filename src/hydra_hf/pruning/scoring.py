"""The score ``S`` that circuit search maximises, and the batch type both circuit evaluators read.

Shared by :mod:`.circuits` (the search and the plain :class:`~hydra_hf.pruning.circuits.GatedEvaluator`)
and :mod:`.cached_bert` (the cached evaluator), so neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

SCORES = ("acc", "ood", "avg")
Batch = Mapping[str, torch.Tensor]


def auroc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Area under the ROC curve of ``pos`` (positives) against ``neg`` (negatives), ties counted 1/2.

    The Mann–Whitney statistic with average ranks, identical to ``sklearn.metrics.roc_auc_score``.

    Shape:
        pos: ``(P,)``, neg: ``(N,)``.
    """
    if pos.numel() == 0 or neg.numel() == 0:
        raise ValueError(f"AUROC needs positives and negatives, got {pos.numel()} and {neg.numel()}")
    x = torch.cat([pos.double(), neg.double()])
    sorted_x, order = torch.sort(x)
    _, inverse, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    avg_rank = ends - (counts.double() - 1) / 2  # 1-based average rank of each tie group
    ranks = torch.empty_like(x)
    ranks[order] = avg_rank[inverse]
    P, N = pos.numel(), neg.numel()
    return float((ranks[:P].sum() - P * (P + 1) / 2) / (P * N))


def circuit_score(
    id_logits: torch.Tensor, id_labels: torch.Tensor, ood_logits: torch.Tensor | None, score: str
) -> float:
    """The score ``S`` of Algorithm 1.

    Shape:
        id_logits: ``(N_id, C)``; id_labels: ``(N_id,)``; ood_logits: ``(N_ood, C)``.
    """
    if score not in SCORES:
        raise ValueError(f"unknown circuit score {score!r}; choose one of {list(SCORES)}")
    acc = float((id_logits.argmax(-1) == id_labels).double().mean()) if score in ("acc", "avg") else 0.0
    if score == "acc":
        return acc
    if ood_logits is None:
        raise ValueError(f"the circuit score {score!r} needs OOD data (--ood-data)")
    msp_id = id_logits.double().softmax(-1).amax(-1)
    msp_ood = ood_logits.double().softmax(-1).amax(-1)
    ood = auroc(msp_id, msp_ood)
    return ood if score == "ood" else (acc + ood) / 2


def batch_labels(batches: Sequence[Batch]) -> torch.Tensor:
    """The ``labels`` of every batch, concatenated. ``(N,)``.

    Raises:
        ValueError: a batch has no ``labels`` (circuit search needs labelled ID data).
    """
    if any("labels" not in b for b in batches):
        raise ValueError("circuit search needs labelled ID data (a 'labels' key in every batch; --label-column)")
    return torch.cat([b["labels"] for b in batches])
