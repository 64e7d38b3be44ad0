"""The score ``S`` that circuit search maximises (its AUROC: :func:`hydra_hf.metrics.ood_auroc`, the package's one),
and the batch type both circuit evaluators read.

Shared by :mod:`.circuits` (the search and the plain :class:`~hydra_hf.pruning.circuits.GatedEvaluator`)
and :mod:`.cached_bert` (the cached evaluator), so neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..metrics import ood_auroc

CIRCUIT_SCORES = ("acc", "ood", "avg")
Batch = Mapping[str, torch.Tensor]


def circuit_score(
    id_logits: torch.Tensor, id_labels: torch.Tensor, ood_logits: torch.Tensor | None, score: str
) -> float:
    """The score ``S`` of Algorithm 1.

    Shape:
        id_logits: ``(N_id, C)``; id_labels: ``(N_id,)``; ood_logits: ``(N_ood, C)``.
    """
    if score not in CIRCUIT_SCORES:
        raise ValueError(f"unknown circuit score {score!r}; choose one of {list(CIRCUIT_SCORES)}")
    acc = float((id_logits.argmax(-1) == id_labels).double().mean()) if score in ("acc", "avg") else 0.0
    if score == "acc":
        return acc
    if ood_logits is None:
        raise ValueError(f"the circuit score {score!r} needs OOD data (--ood-data)")
    msp_id = id_logits.double().softmax(-1).amax(-1)
    msp_ood = ood_logits.double().softmax(-1).amax(-1)
    ood = ood_auroc(msp_id, msp_ood)
    return ood if score == "ood" else (acc + ood) / 2


def batch_labels(batches: Sequence[Batch]) -> torch.Tensor:
    """The ``labels`` of every batch, concatenated. ``(N,)``.

    Raises:
        ValueError: a batch has no ``labels`` (circuit search needs labelled ID data).
    """
    if any("labels" not in b for b in batches):
        raise ValueError("circuit search needs labelled ID data (a 'labels' key in every batch; --label-column)")
    return torch.cat([b["labels"] for b in batches])
