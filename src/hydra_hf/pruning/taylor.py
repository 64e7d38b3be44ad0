"""Strategy 1 — Taylor importance of attention heads (no uncertainty validation set needed).

Paper D.1.1: in each layer, head ``h`` is scored by the mean of ``|W ⊙ dL/dW|`` over the rows of
``W_q``, ``W_k`` and ``W_v`` that belong to ``h`` (the average of the three means), accumulated over
the batches of a calibration loader (the absolute value is taken per batch, then averaged). Pruning
goes *prune–recompute*, layer by layer: score layer 0, keep its top ``K`` heads, recompute the
gradients with that layer pruned, score layer 1, ... until the budget is met.

Variants:

- ``criterion="gate"``: ``|dL/dg|`` for the head gate ``g`` (Michel et al., 2019), per batch then
  averaged;
- a global budget (``Budget(remove=N)``): heads are ranked across layers after normalizing each
  layer's scores to unit L2 norm (Michel et al.), and removed in ``rounds`` chunks with a recompute
  between chunks (``rounds=1``: one shot).

Selection is deterministic (top scores) with ``temperature=0``. With ``temperature > 0`` the kept
heads are *sampled* from the ranking with the seeded Gumbel-top-k trick on
``log(normalized score) / temperature``: heads are kept with Plackett–Luce probabilities proportional
to ``score ** (1 / temperature)``. This is how different seeds give different members.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .adapters import ModelAdapter
from .budget import Budget
from .gates import HeadGates

logger = logging.getLogger(__name__)

CRITERIA = ("weight", "gate")
_EPS = 1e-12


@dataclass
class PruneResult:
    """The outcome of pruning one member.

    Attributes:
        gates: ``(L, H)`` 0/1, 1 = kept.
        scores: ``(L, H)`` importance of each head when it was scored (higher = more important);
            for circuits, the score ``S`` of the model right after the head was removed.
        removal_order: ``[(layer, head), ...]`` in the order the heads were removed.
        metadata: method, criterion, seed, ... (saved with the member in the masks file).
    """

    gates: torch.Tensor
    scores: torch.Tensor
    removal_order: list[tuple[int, int]]
    metadata: dict[str, Any] = field(default_factory=dict)


def _head_rows_importance(weight: torch.Tensor, grad: torch.Tensor, offset: int, num_heads: int, head_dim: int) -> torch.Tensor:
    """Mean of ``|W ⊙ G|`` over each head's rows. Shape: ``(H,)``."""
    block = (weight[offset : offset + num_heads * head_dim] * grad[offset : offset + num_heads * head_dim]).abs()
    return block.reshape(num_heads, -1).mean(dim=1)  # (H,)


def taylor_scores(
    adapter: ModelAdapter,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    gates: torch.Tensor | None = None,
    criterion: str = "weight",
    tower: str | None = None,
    progress: bool = False,
    desc: str = "taylor scores",
) -> torch.Tensor:
    """Taylor importance of every head of one tower, with the heads of ``gates`` switched off.

    Args:
        adapter: the model's adapter; batches need ``labels``.
        batches: the calibration batches (iterated once).
        gates: ``(L, H)`` current 0/1 gates (``None``: all heads on).
        criterion: ``"weight"`` (``|W ⊙ dL/dW|`` on Q/K/V rows) or ``"gate"`` (``|dL/dgate|``).

    Returns:
        ``(L, H)`` scores, averaged over batches; switched-off heads score 0.
    """
    if criterion not in CRITERIA:
        raise ValueError(f"unknown Taylor criterion {criterion!r}; choose one of {list(CRITERIA)}")
    tower = adapter.resolve_tower(tower)
    layers = adapter.towers[tower]
    L, H = len(layers), layers[0].num_heads
    model = adapter.model
    was_training = model.training
    model.eval()  # dropout off: the scores describe the deterministic model
    params = [p for p in model.parameters()]
    requires = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    weights = {id(w): w for layer in layers for w, _ in layer.qkv}
    if criterion == "weight":
        for w in weights.values():
            w.requires_grad_(True)
    scores = torch.zeros(L, H)
    n_batches = 0
    try:
        with HeadGates(model, adapter=adapter, requires_grad=(criterion == "gate")) as hg:
            if gates is not None:
                hg.set(gates, tower=tower)
            gate_tensor = hg.tower_gates[tower]
            for batch in tqdm(batches, desc=desc, disable=not progress, leave=False):
                if "labels" not in batch:
                    raise ValueError("Taylor scores need labelled calibration data (a 'labels' key in every batch)")
                for w in weights.values():
                    w.grad = None
                gate_tensor.grad = None
                logits = adapter.logits(batch)
                loss = F.cross_entropy(logits, batch["labels"].to(logits.device))
                loss.backward()
                with torch.no_grad():
                    if criterion == "gate":
                        scores += gate_tensor.grad.detach().abs().cpu()
                    else:
                        for index, layer in enumerate(layers):
                            per_proj = [
                                _head_rows_importance(w, w.grad, off, H, layer.head_dim)
                                if w.grad is not None
                                else torch.zeros(H, device=w.device)
                                for w, off in layer.qkv
                            ]
                            scores[index] += torch.stack(per_proj).mean(dim=0).cpu()
                n_batches += 1
    finally:
        for p, r in zip(params, requires):
            p.requires_grad_(r)
            p.grad = None
        model.train(was_training)
    if n_batches == 0:
        raise ValueError("the calibration data is empty; give at least one labelled batch")
    scores /= n_batches
    if gates is not None:
        scores = scores * (gates.cpu() > 0.5)
    return scores


def select_top(
    keys_scores: torch.Tensor, k: int, *, temperature: float = 0.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Indices of the ``k`` entries to keep, best first.

    ``temperature == 0``: the top ``k`` scores (ties: lower index first). ``temperature > 0``:
    Gumbel-top-k on ``log(score / sum) / temperature`` (Plackett–Luce sampling ∝ score^(1/T)).

    Shape:
        keys_scores: ``(N,)`` non-negative scores; returns ``(k,)`` long.
    """
    scores = keys_scores.double().clamp_min(0)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        keys = scores
    else:
        logp = torch.log(scores / scores.sum().clamp_min(_EPS) + _EPS)
        u = torch.rand(scores.shape, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
        keys = logp / temperature - torch.log(-torch.log(u))
    # stable descending sort: equal keys keep index order
    order = torch.sort(-keys, stable=True).indices
    return order[:k]


def taylor_prune(
    adapter: ModelAdapter,
    batches: list[Mapping[str, torch.Tensor]],
    budget: Budget,
    *,
    criterion: str = "weight",
    tower: str | None = None,
    seed: int = 0,
    temperature: float = 0.0,
    rounds: int = 1,
    progress: bool = True,
) -> PruneResult:
    """Prune one member with Taylor importance.

    Args:
        adapter: the model's adapter.
        batches: labelled calibration batches (a list: it is iterated once per recompute).
        budget: ``Budget(heads_per_layer=K)`` → prune–recompute layer by layer, keeping ``K`` heads in
            each layer; ``Budget(remove=N)`` → global ranking over all layers (per-layer L2-normalized
            scores), ``N`` heads removed in ``rounds`` recompute rounds.
        criterion: ``"weight"`` (paper D.1.1) or ``"gate"`` (Michel et al.).
        seed: seeds the sampling of heads (only used when ``temperature > 0``).
        temperature: 0 = deterministic top-k; > 0 = sample the kept heads (see module docstring).

    Returns:
        :class:`PruneResult` with the gates, the scores at scoring time and the removal order.
    """
    tower = adapter.resolve_tower(tower)
    L, H = adapter.shape(tower)
    budget.check(L, H)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    generator = torch.Generator().manual_seed(seed)
    gates = torch.ones(L, H)
    scores_at_pruning = torch.zeros(L, H)
    removal: list[tuple[int, int]] = []
    if budget.heads_per_layer is not None:
        keep = budget.heads_per_layer
        for layer in tqdm(range(L), desc="taylor: layers", disable=not progress):
            scores = taylor_scores(adapter, batches, gates=gates, criterion=criterion, tower=tower, desc=f"layer {layer}")
            scores_at_pruning[layer] = scores[layer]
            kept = select_top(scores[layer], keep, temperature=temperature, generator=generator)
            dropped = [h for h in torch.sort(scores[layer], stable=True).indices.tolist() if h not in set(kept.tolist())]
            gates[layer] = 0.0
            gates[layer, kept] = 1.0
            removal.extend((layer, h) for h in dropped)
    else:
        n_remove = int(budget.remove)  # type: ignore[arg-type]
        per_round = [n_remove // rounds + (1 if r < n_remove % rounds else 0) for r in range(rounds)]
        for r, n in enumerate(tqdm(per_round, desc="taylor: rounds", disable=not progress)):
            if n == 0:
                continue
            scores = taylor_scores(adapter, batches, gates=gates, criterion=criterion, tower=tower, desc=f"round {r}")
            norm = scores / scores.norm(dim=1, keepdim=True).clamp_min(_EPS)  # (L, H) per-layer L2 normalization
            alive = torch.nonzero(gates.flatten() > 0.5).flatten()
            flat = norm.flatten()[alive]
            kept = select_top(flat, len(alive) - n, temperature=temperature, generator=generator)
            kept_set = set(alive[kept].tolist())
            dropped = [int(i) for i in alive[torch.sort(flat, stable=True).indices].tolist() if int(i) not in kept_set]
            for i in dropped:
                layer, h = divmod(i, H)
                gates[layer, h] = 0.0
                scores_at_pruning[layer, h] = norm[layer, h]
                removal.append((layer, h))
            for i in kept_set:
                layer, h = divmod(i, H)
                scores_at_pruning[layer, h] = norm[layer, h]
    method = "taylor" if criterion == "weight" else "taylor-gate"
    return PruneResult(
        gates=gates,
        scores=scores_at_pruning,
        removal_order=removal,
        metadata={"method": method, "criterion": criterion, "seed": seed, "temperature": temperature, "tower": tower},
    )
