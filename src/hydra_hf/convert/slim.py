"""Slim members: the MLP neurons each member keeps, applied to a fused state dict, and undone.

A family's converter fuses whole MLPs (averaged, or one per member). For slim members (masks that name
``kept_neurons``) :func:`slim_state_dict` then keeps, for every fused MLP, member m's rows of ``fc1`` and
columns of ``fc2`` (the layout of ``HydraMLPBase``); :func:`unslim_state_dict` is its inverse into one
full-width MLP per member with the removed neurons' weights zeroed (a stock member loading it computes
exactly what the slim member computes). Pure functions on state dicts, given the fused MLPs' slices, which
:func:`mlp_slices` reads off a model built from the slim config (every fused MLP knows its layer's neurons).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import HydraInputError
from ..masks import HeadMasks
from ..modeling.configuration_hydra import neurons_field
from ..modeling.hydra_layers import HydraMLPBase
from .fuse import average

MLP_TENSORS = ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


@dataclass(frozen=True)
class MLPSlice:
    """One fused MLP's slim members: ``kept_neurons[m]`` of its ``intermediate_size`` neurons; ``gated``: fc1
    computes ``[a; b]`` (``2 * intermediate_size`` rows)."""

    kept_neurons: tuple[tuple[int, ...], ...]
    intermediate_size: int
    gated: bool

    def rows(self, member: int) -> torch.Tensor:
        """fc1 rows of member ``member``'s neurons in a full-width MLP (gated: its ``a`` rows, then its ``b`` rows)."""
        idx = torch.tensor(self.kept_neurons[member], dtype=torch.long)
        return torch.cat([idx, idx + self.intermediate_size]) if self.gated else idx


def mlp_slices(model: nn.Module) -> dict[str, MLPSlice]:
    """``{prefix: MLPSlice}`` for every slim fused MLP of ``model`` (``prefix`` ends with ``"."``)."""
    return {
        f"{name}.": MLPSlice(module.kept_neurons, module.intermediate_size, module.gated)
        for name, module in model.named_modules()
        if isinstance(module, HydraMLPBase) and module.slim
    }


def keeper_average(
    w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None, sl: MLPSlice
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """The averaged MLP of slim members' own MLPs (``(M, g*I, d)`` ...): each neuron's weights are the mean over
    the members that keep it (a member's removed neurons are zero in its checkpoint and must not dilute the
    mean), the output bias the mean over every member. Computed in float64, cast back."""
    M, inner, g = len(sl.kept_neurons), sl.intermediate_size, 2 if sl.gated else 1
    keep = torch.zeros(M, inner, dtype=torch.float64)
    for m, neurons in enumerate(sl.kept_neurons):
        keep[m, list(neurons)] = 1.0
    count = keep.sum(0).clamp(min=1.0)  # (I,): a neuron no member keeps is never read
    rows = keep.repeat(1, g)  # (M, g*I): the fc1 rows of each neuron
    rows_count = count.repeat(g)
    mean_w1 = ((w1.double() * rows[:, :, None]).sum(0) / rows_count[:, None]).to(w1.dtype)  # (g*I, d)
    mean_w2 = ((w2.double() * keep[:, None, :]).sum(0) / count).to(w2.dtype)  # (d, I)
    mean_b1 = None if b1 is None else ((b1.double() * rows).sum(0) / rows_count).to(b1.dtype)  # (g*I,)
    mean_b2 = None if b2 is None else b2.double().mean(0).to(b2.dtype)  # (d,)
    return mean_w1, mean_b1, mean_w2, mean_b2


def slim_state_dict(
    state: dict[str, torch.Tensor], slices: dict[str, MLPSlice], *, average: bool = False
) -> dict[str, torch.Tensor]:
    """A fused state dict with whole MLPs (shared ``(I, d)`` or per member ``(M, I, d)``) -> the slim layout.

    Member m takes its kept neurons' fc1 rows (and biases) and fc2 columns from its own MLP, or from the shared
    one; its fc2 bias is its own (or the shared one). ``average`` with per-member MLPs: member m takes its slice
    of the members' averaged MLP, each neuron averaged over the members that keep it (:func:`keeper_average`).
    Other tensors are returned as they are.
    """
    out = dict(state)
    for prefix, sl in slices.items():
        w1, w2 = state[f"{prefix}fc1_weight"], state[f"{prefix}fc2_weight"]
        b1, b2 = state.get(f"{prefix}fc1_bias"), state.get(f"{prefix}fc2_bias")
        per_member = w1.dim() == 3
        if average and per_member:
            w1, b1, w2, b2 = keeper_average(w1, b1, w2, b2, sl)
            per_member = False
        rows = (2 if sl.gated else 1) * sl.intermediate_size
        if w1.shape[-2] != rows:
            raise HydraInputError(
                f"{prefix}fc1_weight has {w1.shape[-2]} rows but the masks' MLP has {sl.intermediate_size} neurons"
                f"{' (gated: 2 x)' if sl.gated else ''}; use masks made for this model"
            )
        pick = lambda t, m: t[m] if per_member else t  # noqa: E731 - member m's own tensor, or the shared one
        M = len(sl.kept_neurons)
        idx = [torch.tensor(n, dtype=torch.long) for n in sl.kept_neurons]
        out[f"{prefix}fc1_weight"] = torch.cat([pick(w1, m)[sl.rows(m)] for m in range(M)]).contiguous()  # (g*K, d)
        out[f"{prefix}fc2_weight"] = torch.cat(
            [pick(w2, m)[:, idx[m]] for m in range(M)], dim=1
        ).contiguous()  # (d, K)
        if b1 is not None:
            out[f"{prefix}fc1_bias"] = torch.cat([pick(b1, m)[sl.rows(m)] for m in range(M)]).contiguous()  # (g*K,)
        if b2 is not None:
            out[f"{prefix}fc2_bias"] = torch.stack([pick(b2, m) for m in range(M)]).contiguous()  # (M, d)
    return out


def unslim_state_dict(state: dict[str, torch.Tensor], slices: dict[str, MLPSlice]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`slim_state_dict` into one full-width MLP per member (``(M, I, d)`` ...), the
    removed neurons' fc1 rows, fc1 biases and fc2 columns zero: member m computes exactly its slim MLP."""
    out = dict(state)
    for prefix, sl in slices.items():
        w1, w2 = state[f"{prefix}fc1_weight"], state[f"{prefix}fc2_weight"]
        b1, b2 = state.get(f"{prefix}fc1_bias"), state.get(f"{prefix}fc2_bias")
        M, d = len(sl.kept_neurons), w2.shape[0]
        g, inner = 2 if sl.gated else 1, sl.intermediate_size
        full_w1 = w1.new_zeros(M, g * inner, d)
        full_w2 = w2.new_zeros(M, d, inner)
        full_b1 = None if b1 is None else b1.new_zeros(M, g * inner)
        lo = 0
        for m, neurons in enumerate(sl.kept_neurons):
            k = len(neurons)
            idx = torch.tensor(neurons, dtype=torch.long)
            full_w1[m, sl.rows(m)] = w1[g * lo : g * (lo + k)]
            full_w2[m][:, idx] = w2[:, lo : lo + k]
            if full_b1 is not None:
                full_b1[m, sl.rows(m)] = b1[g * lo : g * (lo + k)]
            lo += k
        out[f"{prefix}fc1_weight"], out[f"{prefix}fc2_weight"] = full_w1, full_w2
        if full_b1 is not None:
            out[f"{prefix}fc1_bias"] = full_b1
        if b2 is not None:
            out[f"{prefix}fc2_bias"] = b2.clone()  # (M, d) already
    return out


def slim_config(config: Any, kept_neurons: dict[str, list[list[list[int]]]]) -> Any:
    """A copy of a Hydra ``config`` whose members keep ``kept_neurons[field]`` (``field`` a kept-heads field:
    ``"kept_heads"``, ``"vision_kept_heads"`` ...)."""
    out = copy.deepcopy(config)
    for field, neurons in kept_neurons.items():
        setattr(out, neurons_field(field), [[list(n) for n in member] for member in neurons])
    out.validate_hydra()
    return out


def full_config(config: Any) -> Any:
    """A copy of a slim Hydra ``config`` with whole MLPs, one per member (the layout :func:`unslim_state_dict`
    gives)."""
    out = copy.deepcopy(config)
    for name in ("kept_neurons", "vision_kept_neurons", "text_kept_neurons"):
        if hasattr(out, name):
            setattr(out, name, [])
    out.mlp_fusion = "per_member"
    return out


def slim_model(
    model: nn.Module, kept_neurons: dict[str, list[list[list[int]]]], mlp_fusion: str | None = None
) -> nn.Module:
    """The fused ``model`` (whole MLPs) with its members keeping only ``kept_neurons[field]``: a new model of the
    same class built from the slim config, loaded strictly with the sliced weights, in ``model``'s mode.
    ``mlp_fusion="average"`` on a model with per-member MLPs: each member's slice of the members' average, every
    neuron averaged over the members that keep it (default: ``model``'s own fusion)."""
    config = slim_config(model.config, kept_neurons)
    config.mlp_fusion = mlp_fusion or config.mlp_fusion
    config.validate_hydra()
    out = type(model)(config)
    slices = mlp_slices(out)
    state = slim_state_dict(model.state_dict(), slices, average=config.mlp_fusion == "average")
    for name, module in out.named_modules():  # a tower whose members keep whole MLPs, fused per member first
        if isinstance(module, HydraMLPBase) and not module.slim and not module.per_member:
            for tensor in MLP_TENSORS:
                key = f"{name}.{tensor}"
                if state.get(key) is not None and state[key].dim() == getattr(module, tensor).dim() + 1:
                    state[key] = average(state[key])  # the members' mean, as the family's own averaged fusion
    out.load_state_dict(state, strict=True)
    out.to(next(model.parameters()).dtype)
    out.train(model.training)
    return out


def slices_of_config(model_class: type, config: Any) -> dict[str, MLPSlice]:
    """:func:`mlp_slices` of a model of ``model_class`` built from ``config`` on the meta device (no memory)."""
    with torch.device("meta"):
        return mlp_slices(model_class(config))


def unslim(state: dict[str, torch.Tensor], config: Any, model_class: type) -> tuple[dict[str, torch.Tensor], Any]:
    """``(state, config)`` of a slim fused model -> the same members with whole per-member MLPs (removed neurons
    zeroed), which every family's ``unfuse`` reads. A config without slim members is returned as it is."""
    if not getattr(config, "slim", False):
        return state, config
    return unslim_state_dict(state, located(slices_of_config(model_class, config), state)), full_config(config)


def located(slices: dict[str, MLPSlice], state: dict[str, torch.Tensor]) -> dict[str, MLPSlice]:
    """``slices`` read off a bare encoder (``"layers.0.mlp."``) re-keyed to where ``state`` holds them (a task
    model's ``"hydra.layers.0.mlp."``): the one state prefix that ends with each slice's prefix."""
    out = {}
    for prefix, sl in slices.items():
        found = [k[: -len("fc1_weight")] for k in state if k.endswith(f"{prefix}fc1_weight")]
        found = [p for p in found if p == prefix or p.endswith(f".{prefix}")]
        if len(found) != 1:
            raise HydraInputError(
                f"the state dict holds {len(found)} MLPs named like {prefix!r}; pass the state dict of this config's "
                "model"
            )
        out[found[0]] = sl
    return out


def slim_fields(masks: HeadMasks) -> dict[str, str | None]:
    """``{kept-heads field of the config: tower of the masks}`` of the slim towers of ``masks`` (``None``: the one
    tower of one-tower masks)."""
    if not masks.slim:
        return {}
    if not masks.named:
        return {"kept_heads": None}
    return {f"{t}_kept_heads": t for t in masks.tower_names if masks.intermediate_size(t) is not None}


def mlp_width(model: nn.Module, field: str) -> int:
    """The MLP width (neurons per layer) of the tower of the kept-heads ``field`` of a fused Hydra ``model``, read
    off a model of its config whose members keep no neuron, built on the meta device (no memory, no weights)."""
    empty = [[[] for _ in member] for member in getattr(model.config, field)]
    widths = {sl.intermediate_size for sl in slices_of_config(type(model), slim_config(model.config, {field: empty}))
              .values()}
    if len(widths) != 1:
        raise HydraInputError(f"the {field} tower's MLPs have widths {sorted(widths)}; slim members need one width")
    return widths.pop()


def check_slim_widths(masks: HeadMasks, model: nn.Module, *, name: str = "the model") -> None:
    """Raise (one line naming both sizes) unless every slim tower of ``masks`` was made for the MLP width of
    ``model``'s tower (:meth:`HeadMasks.check_mlp_width`); before :func:`neurons_by_field` lists any neuron."""
    for field, tower in slim_fields(masks).items():
        masks.check_mlp_width(tower, mlp_width(model, field), model=name)


def neurons_by_field(masks: HeadMasks) -> dict[str, list[list[list[int]]]]:
    """The slim towers of ``masks`` as config fields: ``{"kept_heads": kept_neurons}`` for a one-tower file,
    ``{"vision_kept_heads": ..., ...}`` for named towers (only towers whose members keep neuron subsets)."""
    return {field: masks.kept_neurons(tower) for field, tower in slim_fields(masks).items()}
