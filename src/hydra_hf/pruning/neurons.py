"""MLP neurons of a stock model, seen from the pruning code (slim members).

A layer's MLP *neurons* are the input features of its down projection (the family's
:attr:`~hydra_hf.families.Family.mlp_down_proj`): an ``nn.Linear``'s input columns, a transformers ``Conv1D``'s
input rows (GPT-2). Removing neuron ``j`` of member m = zeroing that column: the reference every slim fused
member is compared with. Taylor importance gates the same features (:func:`neuron_gates`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers.pytorch_utils import Conv1D

from ..errors import HydraInputError
from ..families import Family, family_of_model
from ..families.adapters import ModelAdapter
from ..masks import HeadMasks
from .gates import HeadGates
from .taylor import scoring_mode


def num_neurons(down_proj: nn.Module) -> int:
    """The MLP width ``I`` read off a down projection."""
    weight = down_proj.weight
    return weight.shape[0] if isinstance(down_proj, Conv1D) else weight.shape[1]


def mlp_shapes(model: nn.Module, family: Family) -> dict[str, tuple[int, int]]:
    """``{tower: (num_layers, intermediate_size)}`` of a stock model (every layer of a tower has one width)."""
    out = {}
    for tower, layers in family.mlp_layers(model).items():
        widths = {num_neurons(layer) for layer in layers}
        if len(widths) != 1:
            raise ValueError(
                f"the {tower} tower's MLPs have different widths {sorted(widths)}; slim members need one width"
            )
        out[tower] = (len(layers), widths.pop())
    return out


@torch.no_grad()
def zero_removed_neurons_(model: nn.Module, family: Family, kept: Mapping[str, list[list[int]]]) -> nn.Module:
    """Zero, in place, the down-projection input of every neuron one member removes: ``kept[tower][l]`` = the
    neurons it keeps in layer ``l`` of ``tower`` (towers not named keep every neuron). Returns ``model``."""
    layers = family.mlp_layers(model)
    for tower, per_layer in kept.items():
        for layer, neurons in zip(layers[tower], per_layer):
            removed = torch.ones(num_neurons(layer), dtype=torch.bool)
            removed[list(neurons)] = False
            if isinstance(layer, Conv1D):
                layer.weight[removed, :] = 0.0  # (I, d): the neurons are rows
            else:
                layer.weight[:, removed] = 0.0  # (d, I): the neurons are columns
    return model


@contextmanager
def neuron_gates(model: nn.Module, family: Family, gates: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Multiply every layer's MLP neurons by ``gates[tower][l]`` (``(L, I)`` per tower) while inside: a forward
    pre-hook on each down projection. With ``gates`` requiring grad, ``dL/dgate`` is the Taylor importance's
    first-order term (``gate * dL/dgate`` at gate 1)."""
    hooks = []
    for tower, layers in family.mlp_layers(model).items():
        if tower not in gates:
            continue
        for layer_idx, layer in enumerate(layers):
            gate = gates[tower][layer_idx]

            def hook(module: nn.Module, args: tuple, gate: torch.Tensor = gate) -> tuple:
                return (args[0] * gate.to(args[0].dtype),) + tuple(args[1:])  # (..., I) * (I,)

            hooks.append(layer.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for handle in hooks:
            handle.remove()


def taylor_neuron_scores(
    adapter: ModelAdapter,
    family: Family,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    head_gates: Mapping[str, torch.Tensor] | None = None,
    progress: bool = False,
    desc: str = "neuron scores",
) -> dict[str, torch.Tensor]:
    """Taylor importance of every MLP neuron, ``{tower: (L, I)}``: ``|dL/dgate|`` of a gate on each neuron
    (the down projection's input), averaged over ``batches`` (labelled, as for the heads' scores), with the
    heads of ``head_gates`` (``{tower: (L, H)}`` 0/1) switched off, so that a member's neurons are scored inside
    that member."""
    model = adapter.model
    device = next(model.parameters()).device
    shapes = mlp_shapes(model, family)
    gates = {t: torch.ones(L, I, device=device, requires_grad=True) for t, (L, I) in shapes.items()}
    scores = {t: torch.zeros(L, I) for t, (L, I) in shapes.items()}
    n_batches = 0
    with scoring_mode(model):
        with HeadGates(model, adapter=adapter) as hg, neuron_gates(model, family, gates):
            if head_gates is not None:
                hg.set({t: g for t, g in head_gates.items() if t in hg.tower_gates})
            for batch in tqdm(batches, desc=desc, disable=not progress, leave=False):
                if "labels" not in batch:
                    raise ValueError(
                        "neuron Taylor scores need labelled calibration data (a 'labels' key in every batch)"
                    )
                for g in gates.values():
                    g.grad = None
                logits = adapter.logits(batch)
                F.cross_entropy(logits, batch["labels"].to(logits.device)).backward()
                with torch.no_grad():
                    for t, g in gates.items():
                        scores[t] += g.grad.detach().abs().cpu()
                n_batches += 1
    if n_batches == 0:
        raise ValueError("the calibration data is empty; give at least one labelled batch")
    return {t: s / n_batches for t, s in scores.items()}


def check_mlp_keep(mlp_keep: Any) -> float:
    """``mlp_keep`` as a float in ``(0, 1]``, else one line naming the value and the fix."""
    if (
        isinstance(mlp_keep, bool)
        or not isinstance(mlp_keep, (int, float))
        or not math.isfinite(mlp_keep)
        or not 0 < mlp_keep <= 1
    ):
        raise HydraInputError(
            f"--mlp-keep {mlp_keep!r} must be a fraction in (0, 1]: the share of each layer's MLP neurons a member "
            "keeps (e.g. 0.33 for 3 members that split the MLP)"
        )
    return float(mlp_keep)


def check_included_widths(include: HeadMasks, adapter: ModelAdapter) -> None:
    """Raise (one line naming both sizes) unless the slim towers of the included masks were made for the MLP
    widths of the model being pruned (:meth:`HeadMasks.check_mlp_width`), before anything of their width is
    built."""
    if not include.slim:
        return
    family = family_of_model(adapter.model)
    if family is None:
        raise HydraInputError(f"slim members need a registered family; {type(adapter.model).__name__} is none")
    shapes = mlp_shapes(adapter.model, family)
    for tower in include.tower_names if include.named else [None]:
        name = tower or adapter.resolve_tower(None)
        if include.intermediate_size(tower) is not None and name in shapes:
            include.check_mlp_width(tower, shapes[name][1], model="the model being pruned")


def select_neurons(scores: torch.Tensor, keep: int, taken: torch.Tensor | None = None) -> list[list[int]]:
    """Per layer, the ``keep`` highest-scoring neurons of ``scores (L, I)``, sorted; with ``taken (L, I)`` (how
    many earlier members kept each neuron) the least-taken first, the score breaking ties among equally taken
    neurons (members spread over the MLP: each neuron is kept by about ``M * keep / I`` members)."""
    out = []
    for layer, row in enumerate(scores):
        order = torch.argsort(row, descending=True, stable=True)
        if taken is not None:
            order = order[torch.argsort(taken[layer][order], stable=True)]  # least taken first, by score within
        out.append(sorted(order[:keep].tolist()))
    return out


def choose_neurons(
    adapter: ModelAdapter,
    masks: HeadMasks,
    member_batches: Callable[[int], Iterable[Mapping[str, torch.Tensor]]],
    *,
    mlp_keep: float,
    spread: bool = False,
    progress: bool = False,
) -> HeadMasks:
    """The slim members of ``masks``: member m keeps, in every layer of every pruned tower, the
    ``round(mlp_keep * I)`` MLP neurons of highest Taylor importance inside member m (its removed heads off),
    scored on ``member_batches(m)`` (the member's own data sample and seed, as its heads were). ``spread``: each
    member prefers the neurons earlier members left (:func:`select_neurons`). Returns a version-2 masks copy."""
    mlp_keep = check_mlp_keep(mlp_keep)
    model = adapter.model
    family = family_of_model(model)
    if family is None:
        raise HydraInputError(f"slim members need a registered family; {type(model).__name__} is none")
    shapes = mlp_shapes(model, family)
    towers = masks.tower_names if masks.named else [adapter.resolve_tower(None)]
    missing = [t for t in towers if t not in shapes]
    if missing:
        raise HydraInputError(f"the model has no MLP layers in tower(s) {missing}; slim members cannot be built")
    keep = {t: max(1, round(mlp_keep * shapes[t][1])) for t in towers}
    taken = {t: torch.zeros(*shapes[t]) for t in towers}
    kept: dict[str, list[list[list[int]]]] = {t: [] for t in towers}
    for m in range(masks.num_members):
        head_gates = {t: masks.tower(t).gates(m) for t in towers}
        scores = taylor_neuron_scores(
            adapter, family, member_batches(m), head_gates=head_gates, progress=progress,
            desc=f"member {m + 1}: neuron scores",
        )
        for t in towers:
            chosen = select_neurons(scores[t], keep[t], taken[t] if spread else None)
            kept[t].append(chosen)
            for layer, neurons in enumerate(chosen):
                taken[t][layer, neurons] += 1
    metadata = {**masks.metadata, "mlp_keep": mlp_keep, "mlp_spread": spread}
    if not masks.named:
        (t,) = towers
        out = HeadMasks(
            masks.kept_heads, masks.num_heads, [dict(x) for x in masks.member_metadata], metadata,
            kept_neurons=kept[t], intermediate_size=shapes[t][1],
        )
        return out
    per_tower = {
        name: HeadMasks(
            kept_heads=one.kept_heads, num_heads=one.num_heads,
            kept_neurons=kept.get(name), intermediate_size=shapes[name][1] if name in kept else None,
        )
        for name, one in masks.towers.items()
    }
    return HeadMasks(towers=per_tower, member_metadata=[dict(x) for x in masks.member_metadata], metadata=metadata)
