"""Table-driven checkpoint readers: a family says where its checkpoint keeps each tensor (a ``Layout``);
reading, fusing and unfusing are then the same three pure functions for every family.

A ``Layout`` maps the fused Hydra model's names to the stock checkpoint's (saved-file) names:

- ``shared``: one tensor for all members (embeddings...), agreed on by ``fuse.shared_tensor``'s policy;
- ``per_member``: stacked along a leading M axis (final LayerNorms, classifiers, heads...);
- ``towers``: the transformer layers, read into the canonical layer dicts of ``fuse.py`` (``q.weight``,
  ``o.bias``, ``norm1.weight``, ``fc1.weight``...), plus two kinds of per-layer extras:

  - ``member.<name>``: a per-layer tensor every member keeps (layer scale): fused ``<name> (M, ...)``;
  - ``heads.<name>``: a per-layer tensor whose *last* axis is the heads (BEiT's relative position bias
    table ``(R, H)``): fused ``<name> (..., K)``, the columns of the heads each member keeps, in member order.

Nothing is dropped silently: a tensor the layout does not name (and no ``ignored`` pattern matches) is
an error, and so is a missing one (unless ``optional``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

from .fuse import describe_keys, fuse_layer, shared_tensor, unfuse_layer

CANONICAL_BASE = ("q", "k", "v", "o", "norm1", "norm2", "fc1", "fc2")


@dataclass(frozen=True)
class Tower:
    """The layers of one transformer tower.

    Attributes:
        fused_prefix: the fused model's layer list (``"hydra.layers"``); layer i under ``f"{fused_prefix}.{i}."``.
        checkpoint_prefix: the checkpoint's layer list (``"deit.encoder.layer"``).
        num_layers, num_heads, hidden_size: the tower's shape; ``intermediate_size`` is checked when given.
        keys: canonical key (``"q.weight"``, ``"member.lambda_1"``, ``"heads.relative_position_bias_table"``)
            -> name inside layer i of the checkpoint. A key left out (e.g. BEiT's ``k.bias``) is zero in
            the fused model and not written back.
    """

    fused_prefix: str
    checkpoint_prefix: str
    num_layers: int
    num_heads: int
    hidden_size: int
    keys: dict[str, str]
    intermediate_size: int | None = None


@dataclass(frozen=True)
class Layout:
    """Where one family's checkpoint keeps each tensor, under the fused model's names (see the module docstring)."""

    family: str
    shared: dict[str, str]
    per_member: dict[str, str]
    towers: tuple[Tower, ...]
    optional: frozenset[str] = frozenset()  # fused names that may be missing (a bare encoder has no classifier)
    ignored: tuple[str, ...] = ()  # regexes of checkpoint names that are read and dropped

    def tower(self, fused_prefix: str) -> Tower:
        for t in self.towers:
            if t.fused_prefix == fused_prefix:
                return t
        raise KeyError(fused_prefix)


@dataclass
class Member:
    """One stock checkpoint in canonical form (fused model names; canonical layer dicts per tower)."""

    layout: Layout
    config: dict[str, Any]
    shared: dict[str, torch.Tensor]
    per_member: dict[str, torch.Tensor]
    towers: dict[str, list[dict[str, torch.Tensor]]] = field(default_factory=dict)


def read_member(
    state: dict[str, torch.Tensor], layout: Layout, config: dict[str, Any], source: str = "checkpoint"
) -> Member:
    """Map a stock checkpoint's state dict (saved-file names) to canonical form.

    Checks key counts (every named tensor present, none left over) and the layer shapes the tower's
    sizes imply; raises ``ValueError`` naming the checkpoint, the tensors and the fix.
    """
    used: set[str] = set()
    missing: list[str] = []

    def take(name: str, fused: str | None = None) -> torch.Tensor | None:
        if name in state:
            used.add(name)
            return state[name]
        if fused is None or fused not in layout.optional:
            missing.append(name)
        return None

    shared = {k: take(v, k) for k, v in layout.shared.items()}
    per_member = {k: take(v, k) for k, v in layout.per_member.items()}
    towers = {}
    for tower in layout.towers:
        towers[tower.fused_prefix] = [
            {key: take(f"{tower.checkpoint_prefix}.{i}.{name}") for key, name in tower.keys.items()}
            for i in range(tower.num_layers)
        ]
    if missing:
        raise ValueError(
            f"{source} is not a complete {layout.family} checkpoint: missing {describe_keys(missing)}; pass a stock "
            f"{layout.family} checkpoint saved with save_pretrained"
        )
    ignored = [re.compile(p) for p in layout.ignored]
    unknown = sorted(k for k in state if k not in used and not any(p.search(k) for p in ignored))
    if unknown:
        raise ValueError(
            f"{source} has tensors this {layout.family} layout does not know: {describe_keys(unknown)} (more layers "
            "than its config, another task head, or another architecture); pass a stock checkpoint of a supported task"
        )
    for tower in layout.towers:
        _check_tower_shapes(towers[tower.fused_prefix], tower, source)
    return Member(
        layout=layout,
        config=config,
        shared={k: v for k, v in shared.items() if v is not None},
        per_member={k: v for k, v in per_member.items() if v is not None},
        towers=towers,
    )


def _check_tower_shapes(layers: list[dict[str, torch.Tensor]], tower: Tower, source: str) -> None:
    d, H = tower.hidden_size, tower.num_heads
    expected: dict[str, tuple[int, ...]] = {
        "q.weight": (d, d),
        "k.weight": (d, d),
        "v.weight": (d, d),
        "o.weight": (d, d),
        "q.bias": (d,),
        "k.bias": (d,),
        "v.bias": (d,),
        "o.bias": (d,),
        "norm1.weight": (d,),
        "norm1.bias": (d,),
        "norm2.weight": (d,),
        "norm2.bias": (d,),
    }
    if tower.intermediate_size is not None:
        inner = tower.intermediate_size
        expected.update({"fc1.weight": (inner, d), "fc1.bias": (inner,), "fc2.weight": (d, inner), "fc2.bias": (d,)})
    wrong = []
    for i, layer in enumerate(layers):
        for key, tensor in layer.items():
            shape = tuple(tensor.shape)
            if key in expected and shape != expected[key]:
                wrong.append(f"layer {i} {key} {shape} (expected {expected[key]})")
            elif key.startswith("heads.") and shape[-1] != H:
                wrong.append(f"layer {i} {key} {shape} (expected {H} heads on the last axis)")
    if wrong:
        raise ValueError(f"{source}: tensors do not have the shapes its config implies: {wrong[:3]}")


def _fuse_extras(member_layers: list[dict[str, torch.Tensor]], kept_heads: list[list[int]]) -> dict[str, torch.Tensor]:
    out = {}
    for key in member_layers[0]:
        if key.startswith("member."):
            out[key.removeprefix("member.")] = torch.stack([layer[key] for layer in member_layers])  # (M, ...)
        elif key.startswith("heads."):
            columns = [layer[key][..., heads] for layer, heads in zip(member_layers, kept_heads)]  # (..., k_m)
            out[key.removeprefix("heads.")] = torch.cat(columns, dim=-1).contiguous()  # (..., K)
    return out


def fuse_members(
    members: list[Member], kept_heads: dict[str, list[list[list[int]]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """The fused model's state dict from M members (pass the same ``Member`` M times for one checkpoint).

    ``kept_heads[fused_prefix][m][l]``: heads member m keeps in layer l of that tower.
    """
    layout = members[0].layout
    out: dict[str, torch.Tensor] = {}
    for part in ("shared", "per_member"):
        names = [set(getattr(m, part)) for m in members]
        if any(n != names[0] for n in names[1:]):
            odd = sorted(set.union(*names) - set.intersection(*names))
            raise ValueError(f"members differ in {odd[:4]}: give every member the same architecture and task head")
    for name in members[0].shared:
        out[name] = shared_tensor(name, [m.shared[name] for m in members], shared)
    for name in members[0].per_member:
        out[name] = torch.stack([m.per_member[name] for m in members])  # (M, ...)
    for tower in layout.towers:
        dk = tower.hidden_size // tower.num_heads
        kept = kept_heads[tower.fused_prefix]
        for i in range(tower.num_layers):
            layers = [m.towers[tower.fused_prefix][i] for m in members]
            heads = [k[i] for k in kept]
            fused = fuse_layer(layers, heads, dk, mlp_fusion)
            fused.update(_fuse_extras(layers, heads))
            out.update({f"{tower.fused_prefix}.{i}.{k}": v for k, v in fused.items()})
    return out


def unfuse_members(
    state: dict[str, torch.Tensor], layout: Layout, kept_heads: dict[str, list[list[list[int]]]], num_members: int
) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_members``: one stock state dict (saved-file names) per member.

    Removed heads are zero in Q/K/V, W_O and ``heads.*`` tensors; under ``mlp_fusion="average"`` every
    member gets the averaged MLP. Write a member's dict with safetensors beside the base's
    ``config.json`` and ``from_pretrained`` reproduces the fused model's member m.
    """
    members = []
    for m in range(num_members):
        sd = {layout.shared[k]: state[k].clone() for k in layout.shared if k in state}
        sd.update({layout.per_member[k]: state[k][m].clone() for k in layout.per_member if k in state})
        for tower in layout.towers:
            H, dk = tower.num_heads, tower.hidden_size // tower.num_heads
            kept = kept_heads[tower.fused_prefix]
            for i in range(tower.num_layers):
                pre = f"{tower.fused_prefix}.{i}."
                fused = {k[len(pre):]: v for k, v in state.items() if k.startswith(pre)}
                heads = [k[i] for k in kept]
                canon = unfuse_layer(fused, heads, H, dk, m)
                offset = sum(len(h) for h in heads[:m])
                for key, name in tower.keys.items():
                    if key.startswith("member."):
                        value = fused[key.removeprefix("member.")][m].clone()
                    elif key.startswith("heads."):
                        columns = fused[key.removeprefix("heads.")][..., offset : offset + len(heads[m])]
                        value = torch.zeros(*columns.shape[:-1], H, dtype=columns.dtype)
                        value[..., heads[m]] = columns
                    else:
                        value = canon[key]
                    sd[f"{tower.checkpoint_prefix}.{i}.{name}"] = value
        members.append(sd)
    return members


def check_fused_shapes(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``ValueError`` naming the tensor unless every fused tensor has the shape the model expects (a
    checkpoint whose config does not match its weights), before ``load_state_dict`` would raise."""
    expected = model.state_dict()
    wrong = [
        f"{k} {tuple(v.shape)} (expected {tuple(expected[k].shape)})"
        for k, v in state.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    if wrong:
        raise ValueError(f"{source}: tensors do not have the shapes its config implies: {wrong[:3]}")


def to_module_names(
    stock_model: torch.nn.Module, checkpoints: list[dict[str, torch.Tensor]]
) -> list[dict[str, torch.Tensor]]:
    """Saved-file names -> the installed transformers' module names (``model.state_dict()``), through
    ``from_pretrained``'s own key conversion (renames, DINOv2's ``weights_in`` split into gate/up...).

    ``stock_model`` gives the class and config; ``ValueError`` if a tensor is missing or left over.
    """
    cls, config = type(stock_model), stock_model.config
    out = []
    for sd in checkpoints:
        model, info = cls.from_pretrained(None, config=config, state_dict=sd, output_loading_info=True)
        problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if problems:
            raise ValueError(f"the unfused member does not load into a stock {cls.__name__}: {problems}")
        out.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return out
