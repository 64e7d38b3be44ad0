"""Strategy 1 — Taylor importance of attention heads (no uncertainty validation set needed).

Paper D.1.1: in each layer, head ``h`` is scored by the mean of ``|W ⊙ dL/dW|`` over the rows of
``W_q``, ``W_k`` and ``W_v`` that belong to ``h`` (the average of the three means), accumulated over
the batches of a calibration loader (the absolute value is taken per batch, then averaged). Pruning
goes *prune–recompute*, layer by layer: score layer 0, keep its top ``K`` heads, recompute the
gradients with that layer pruned, score layer 1, ... until the budget is met.

Variants:

- ``criterion="gate"``: ``|dL/dg|`` for the head gate ``g`` (Michel et al., 2019), per batch then
  averaged;
- a per-layer budget recomputed in fewer rounds (``rounds=R``): the layers in ``R`` consecutive groups,
  each group scored in one recompute (:func:`depth_groups`): ``R`` gradient passes instead of one per layer;
- a global budget (``Budget(remove=N)``): heads are ranked across layers after normalizing each
  layer's scores to unit L2 norm (Michel et al.), and removed in ``rounds`` chunks with a recompute
  between chunks (``rounds=1``: one shot);
- both towers of a CLIP model at once (``tower="joint"``): per-layer budgets prune every tower's
  layers depth by depth; a global budget ranks the heads of both towers after the per-layer
  normalisation of :func:`normalize_layer_scores` (see :func:`taylor_prune` for why).

Selection is deterministic (top scores) with ``temperature=0``. With ``temperature > 0`` the kept
heads are *sampled* from the ranking with the seeded Gumbel-top-k trick on
``log(normalized score) / temperature``: heads are kept with Plackett–Luce probabilities proportional
to ``score ** (1 / temperature)``. This is how different seeds give different members.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..families.adapters import AttentionLayer, ModelAdapter
from .budget import Budget
from .gates import HeadGates
from .layout import HeadLayout

logger = logging.getLogger(__name__)

CRITERIA = ("weight", "gate")
_EPS = 1e-12


@dataclass
class PruneResult:
    """The outcome of pruning one member.

    Attributes:
        gates: ``(L, H)`` 0/1, 1 = kept; ``{tower: (L_t, H_t)}`` for a joint two-tower search.
        scores: ``(L, H)`` importance of each head when it was scored (higher = more important);
            for circuits, the score ``S`` of the model right after the head was removed
            (``{tower: (L_t, H_t)}`` for a joint search).
        removal_order: ``[(layer, head), ...]`` in the order the heads were removed
            (``(tower, layer, head)`` for a joint search).
        metadata: method, criterion, seed, ... (saved with the member in the masks file).
    """

    gates: torch.Tensor | dict[str, torch.Tensor]
    scores: torch.Tensor | dict[str, torch.Tensor]
    removal_order: list[tuple[int, int]] | list[tuple[str, int, int]]
    metadata: dict[str, Any] = field(default_factory=dict)


def _head_rows_importance(
    weight: torch.Tensor, grad: torch.Tensor, offset: int, num_heads: int, head_dim: int, transposed: bool = False
) -> torch.Tensor:
    """Mean of ``|W ⊙ G|`` over each head's rows (``transposed``: its columns, ``Conv1D`` weights). Shape: ``(H,)``."""
    if transposed:
        weight, grad = weight.T, grad.T
    block = (weight[offset : offset + num_heads * head_dim] * grad[offset : offset + num_heads * head_dim]).abs()
    return block.reshape(num_heads, -1).mean(dim=1)  # (H,)


def _layer_weight_importance(layer: AttentionLayer) -> torch.Tensor:
    """``|W ⊙ dL/dW|`` importance of each (query) head of one layer: the mean over Q, K and V of the mean
    over the head's rows. Under grouped-query attention a query head takes the K and V rows of its
    key/value group (K/V head ``h // (H / H_kv)``). Shape: ``(H,)``."""
    H = layer.num_heads
    per_proj = []
    for index, (w, off) in enumerate(layer.qkv):
        if w.grad is None:
            per_proj.append(torch.zeros(H, device=w.device))
            continue
        heads = layer.proj_heads(index)
        imp = _head_rows_importance(w, w.grad, off, heads, layer.head_dim, layer.transposed)  # (heads,)
        per_proj.append(imp.repeat_interleave(H // heads))  # (H,)
    return torch.stack(per_proj).mean(dim=0)


@contextmanager
def scoring_mode(model: nn.Module) -> Iterator[nn.Module]:
    """While inside: ``model`` in eval mode (dropout off: the scores describe the deterministic model) with every
    parameter frozen (the caller unfreezes what it scores); afterwards its mode and ``requires_grad`` flags as
    they were, and no gradient left on a parameter."""
    was_training = model.training
    params = list(model.parameters())
    requires = [p.requires_grad for p in params]
    model.eval()
    for p in params:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, r in zip(params, requires):
            p.requires_grad_(r)
            p.grad = None
        model.train(was_training)


def taylor_scores(
    adapter: ModelAdapter,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    gates: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
    criterion: str = "weight",
    tower: str | None = None,
    progress: bool = False,
    desc: str = "taylor scores",
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Taylor importance of every head of one tower (or of both, ``tower="joint"``), with the heads of
    ``gates`` switched off.

    Args:
        adapter: the model's adapter; batches need ``labels``.
        batches: the calibration batches (iterated once).
        gates: ``(L, H)`` current 0/1 gates of ``tower`` (``None``: all heads on); with
            ``tower="joint"``, ``{tower: (L_t, H_t)}``.
        criterion: ``"weight"`` (``|W ⊙ dL/dW|`` on Q/K/V rows; under grouped-query attention a query
            head's K/V rows are those of its key/value group) or ``"gate"`` (``|dL/dgate|``).
        tower: a tower name (``None``: the only one) or ``"joint"`` (every tower, one backward pass
            per batch).

    Returns:
        ``(L, H)`` scores, averaged over batches; switched-off heads score 0. With ``tower="joint"``,
        ``{tower: (L_t, H_t)}`` raw scores (not comparable across towers; see :func:`taylor_prune`).
    """
    layout = HeadLayout.of(adapter, tower)
    if gates is not None and not isinstance(gates, Mapping):
        gates = {layout.names[0]: gates}
    scores = _tower_scores(adapter, batches, layout.names, gates, criterion, progress, desc)
    return scores if layout.joint else scores[layout.names[0]]


def _tower_scores(
    adapter: ModelAdapter,
    batches: Iterable[Mapping[str, torch.Tensor]],
    towers: list[str],
    gates: Mapping[str, torch.Tensor] | None,
    criterion: str,
    progress: bool,
    desc: str,
) -> dict[str, torch.Tensor]:
    """Raw Taylor scores ``{tower: (L_t, H_t)}`` of ``towers``, accumulated in one pass over ``batches``."""
    if criterion not in CRITERIA:
        raise ValueError(f"unknown Taylor criterion {criterion!r}; choose one of {list(CRITERIA)}")
    model = adapter.model
    weights = {id(w): w for t in towers for layer in adapter.towers[t] for w, _ in layer.qkv}
    scores = {t: torch.zeros(*adapter.shape(t)) for t in towers}
    n_batches = 0
    with scoring_mode(model):
        if criterion == "weight":
            for w in weights.values():
                w.requires_grad_(True)
        with HeadGates(model, adapter=adapter, requires_grad=(criterion == "gate")) as hg:
            if gates is not None:
                hg.set(gates)
            for batch in tqdm(batches, desc=desc, disable=not progress, leave=False):
                if "labels" not in batch:
                    raise ValueError("Taylor scores need labelled calibration data (a 'labels' key in every batch)")
                for w in weights.values():
                    w.grad = None
                for t in towers:
                    hg.tower_gates[t].grad = None
                logits = adapter.logits(batch)
                loss = F.cross_entropy(logits, batch["labels"].to(logits.device))
                loss.backward()
                with torch.no_grad():
                    for t in towers:
                        if criterion == "gate":
                            scores[t] += hg.tower_gates[t].grad.detach().abs().cpu()
                            continue
                        for index, layer in enumerate(adapter.towers[t]):
                            scores[t][index] += _layer_weight_importance(layer).cpu()
                n_batches += 1
    if n_batches == 0:
        raise ValueError("the calibration data is empty; give at least one labelled batch")
    for t in towers:
        scores[t] /= n_batches
        if gates is not None and t in gates:
            scores[t] = scores[t] * (torch.as_tensor(gates[t]).cpu() > 0.5)
    return scores


def normalize_layer_scores(scores: torch.Tensor, heads_in_row: list[int] | None = None) -> torch.Tensor:
    """Per-layer normalisation of Taylor scores before a ranking across layers (and towers).

    Each row (layer) is divided by its L2 norm (Michel et al., 2019; Molchanov et al., 2017 normalise
    per layer too), so that no layer dominates the ranking by the raw scale of its gradients. With
    ``heads_in_row`` (the joint two-tower ranking), row ``r`` is further multiplied by
    ``sqrt(heads_in_row[r])``: its mean *squared* score becomes 1 whatever the layer's head count, so
    that a tower with fewer heads per layer (open_clip ViT-B/32: 8 text vs 12 vision heads) is not
    favoured by the bare L2 normalisation (which gives a uniform layer of ``H`` heads scores
    ``1/sqrt(H)``). Padding cells must be 0 and stay 0.

    Shape:
        scores: ``(R, H_max)`` non-negative; returns ``(R, H_max)``.
    """
    norm = scores / scores.norm(dim=1, keepdim=True).clamp_min(_EPS)  # (R, H_max)
    if heads_in_row is not None:
        norm = norm * torch.tensor(heads_in_row, dtype=norm.dtype).sqrt().unsqueeze(1)
    return norm


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
    if not math.isfinite(temperature) or temperature < 0:  # nan passes `< 0`
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if temperature == 0:
        keys = scores
    else:
        logp = torch.log(scores / scores.sum().clamp_min(_EPS) + _EPS)
        u = torch.rand(scores.shape, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
        keys = logp / temperature - torch.log(-torch.log(u))
    # stable descending sort: equal keys keep index order
    order = torch.sort(-keys, stable=True).indices
    return order[:k]


def depth_groups(depths: int, rounds: int) -> list[list[int]]:
    """The depths ``0 .. depths-1`` in ``min(rounds, depths)`` consecutive groups whose sizes differ by at most
    one (the larger ones first): the prune-recompute schedule of a per-layer budget in ``rounds`` recomputes."""
    count = min(rounds, depths)
    sizes = [depths // count + (1 if g < depths % count else 0) for g in range(count)]
    starts = [sum(sizes[:g]) for g in range(count)]
    return [list(range(start, start + size)) for start, size in zip(starts, sizes)]


def taylor_prune(
    adapter: ModelAdapter,
    batches: list[Mapping[str, torch.Tensor]],
    budget: Budget,
    *,
    criterion: str = "weight",
    tower: str | None = None,
    seed: int = 0,
    temperature: float = 0.0,
    rounds: int | None = None,
    progress: bool = True,
) -> PruneResult:
    """Prune one member with Taylor importance.

    Args:
        adapter: the model's adapter.
        batches: labelled calibration batches (a list: it is iterated once per recompute).
        budget: ``Budget(heads_per_layer=K)`` → prune–recompute by depth, keeping ``K`` heads in each
            layer; ``Budget(remove=N)`` → global ranking over all layers (per-layer L2-normalized
            scores), ``N`` heads removed in ``rounds`` recompute rounds.
        criterion: ``"weight"`` (paper D.1.1) or ``"gate"`` (Michel et al.).
        tower: a tower name (``None``: the only one) or ``"joint"``: both towers of a CLIP model.
        seed: seeds the sampling of heads (only used when ``temperature > 0``).
        temperature: 0 = deterministic top-k; > 0 = sample the kept heads (see module docstring).
        rounds: recomputes. ``None``: the paper's schedule -- a per-layer budget recomputes after every
            layer (``L`` gradient passes), a global budget ranks once. With a per-layer budget, ``R`` splits
            the depths into ``R`` consecutive groups of (nearly) equal size, each group's layers scored in one
            recompute with the groups before it pruned (``R >= L``: layer by layer; ``1``: every layer from
            one gradient pass): ``R`` passes instead of ``L``, the cost knob of deep models (30 layers of a
            135M decoder are 30 backward passes per member).

    Both towers (``tower="joint"``), how raw scores of different towers are compared:

    - ``Budget(heads_per_layer=K)`` needs no comparison: every layer keeps its own top ``K``.
      Prune–recompute goes by depth: step ``d`` scores layer ``d`` of *every* tower in one
      recompute (with the layers above ``d`` of both towers already pruned) and prunes each.
    - ``Budget(remove=N)`` ranks the heads of both towers together after normalising every layer
      of every tower (:func:`normalize_layer_scores`: unit L2 norm, times ``sqrt(H_t)``). Raw
      ``|W ⊙ dL/dW|`` differ between towers by the scale of their weights and gradients (the image
      tower's gradients reach the loss through the image embedding, the text tower's through the
      class prompts); after the normalisation each layer, in either tower, brings the same total
      importance, and a head is ranked by its share of its layer's importance. This is the
      cross-layer normalisation of Michel et al. / Molchanov et al. applied to layers of two towers;
      the result does not change when one tower's raw scores are scaled by any constant. How the
      ``N`` heads split between the towers is left to the scores (not fixed in proportion to head
      counts).

    Returns:
        :class:`PruneResult` with the gates, the scores at scoring time and the removal order (with
        ``tower="joint"``: ``{tower: (L_t, H_t)}`` gates and scores, ``(tower, layer, head)`` triples).
    """
    layout = HeadLayout.of(adapter, tower)
    layout.check(budget)
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
        raise ValueError(f"rounds must be a positive integer or None (the paper's schedule), got {rounds!r}")
    given_rounds = rounds
    generator = torch.Generator().manual_seed(seed)
    gates = layout.ones()  # (R, H_max): one tower's (L, H), or the towers stacked (padding 0)
    R, H_max = gates.shape
    heads_in_row = layout.heads_in_row()
    scores_at_pruning = torch.zeros(R, H_max)
    removal: list[tuple[int, int] | tuple[str, int, int]] = []

    def score(desc: str) -> torch.Tensor:  # (R, H_max) raw scores with the current gates
        raw = _tower_scores(adapter, batches, layout.names, layout.split(gates), criterion, False, desc)
        return layout.stack(raw)

    if budget.heads_per_layer is not None:
        keep = budget.heads_per_layer
        depths = max(L for _, L, _ in layout.towers)
        groups = depth_groups(depths, depths if rounds is None else rounds)
        for g, group in enumerate(tqdm(groups, desc="taylor: layers", disable=not progress)):
            scores = score(f"layers {group[0]}-{group[-1]}" if len(group) > 1 else f"layer {group[0]}")
            rows = [r for r, (_, layer) in enumerate(layout.rows) if layer in group]
            for row in rows:
                row_scores = scores[row, : heads_in_row[row]]  # (H_t,)
                scores_at_pruning[row] = scores[row]
                kept = select_top(row_scores, keep, temperature=temperature, generator=generator)
                dropped = [
                    h for h in torch.sort(row_scores, stable=True).indices.tolist() if h not in set(kept.tolist())
                ]
                gates[row] = 0.0
                gates[row, kept] = 1.0
                removal.extend(layout.label(row, h) for h in dropped)
    else:
        n_remove = int(budget.remove)  # type: ignore[arg-type]
        rounds = 1 if rounds is None else rounds
        per_round = [n_remove // rounds + (1 if r < n_remove % rounds else 0) for r in range(rounds)]
        for r, n in enumerate(tqdm(per_round, desc="taylor: rounds", disable=not progress)):
            if n == 0:
                continue
            scores = score(f"round {r}")
            norm = normalize_layer_scores(scores, heads_in_row if layout.joint else None)  # (R, H_max)
            alive = torch.nonzero(gates.flatten() > 0.5).flatten()
            flat = norm.flatten()[alive]
            kept = select_top(flat, len(alive) - n, temperature=temperature, generator=generator)
            kept_set = set(alive[kept].tolist())
            dropped = [int(i) for i in alive[torch.sort(flat, stable=True).indices].tolist() if int(i) not in kept_set]
            for i in dropped:
                row, h = divmod(i, H_max)
                gates[row, h] = 0.0
                scores_at_pruning[row, h] = norm[row, h]
                removal.append(layout.label(row, h))
            for i in kept_set:
                row, h = divmod(i, H_max)
                scores_at_pruning[row, h] = norm[row, h]
    method = "taylor" if criterion == "weight" else "taylor-gate"
    return PruneResult(
        gates=layout.unstack(gates),
        scores=layout.unstack(scores_at_pruning),
        removal_order=removal,
        metadata={
            "method": method, "criterion": criterion, "seed": seed, "temperature": temperature,
            **({"rounds": given_rounds} if given_rounds is not None and budget.heads_per_layer is not None else {}),
            "tower": "joint" if layout.joint else layout.names[0],
        },
    )
