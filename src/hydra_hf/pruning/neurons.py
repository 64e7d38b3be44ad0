"""MLP neurons of a stock model, seen from the pruning code (slim members).

A layer's MLP *neurons* are the input features of its down projection (the family's
:attr:`~hydra_hf.families.Family.mlp_down_proj`): an ``nn.Linear``'s input columns, a transformers ``Conv1D``'s
input rows (GPT-2). Removing neuron ``j`` of member m = zeroing that column: the reference every slim fused
member is compared with. Taylor importance gates the same features (:func:`neuron_gates`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from ..families import Family


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
            raise ValueError(f"the {tower} tower's MLPs have different widths {sorted(widths)}; slim members need one width")
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
