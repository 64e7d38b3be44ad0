"""Hugging Face text encoders with post-LN layers (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA,
DistilBERT, ALBERT) <-> canonical members, described by one :class:`TextLayout` per family.

A layout names, in a *task model's* checkpoint (``roberta.encoder.layer.0...``, ``classifier...``):
the tensors every member shares (embeddings, input projections), where layer ``i``'s attention, MLP
and LayerNorms live (``fuse.py``'s canonical layer), and the per-member head groups (pooler,
classifier), each with the name it has in the fused model. A bare encoder's checkpoint (saved without
the ``roberta.`` prefix) is read the same way. Pure functions on state dicts: nothing is loaded here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .fuse import describe_keys, fuse_layer, shared_tensor, unfuse_member_layers
from .hf_vit import check_layer_shapes
from .reader import Reader

LAYER_PREFIX = "hydra.layers."  # fused layer i lives under f"{LAYER_PREFIX}{i}." in the task model


@dataclass(frozen=True)
class TextLayout:
    """Where one family's task model keeps its tensors (full checkpoint names).

    Attributes:
        family: the family name (for messages).
        prefix: the encoder's prefix in a task model (``"roberta."``).
        layer: ``(i, config) -> name prefix of layer i`` (e.g. ``"roberta.encoder.layer.3."``).
        layer_map: canonical layer name (``q``, ``k``, ``v``, ``o``, ``norm1``, ``fc1``, ``fc2``,
            ``norm2``) -> module path inside the layer.
        shared: fused name -> checkpoint name of the tensors all members share.
        optional_shared: fused names in ``shared`` that a checkpoint may lack (e.g. ELECTRA's
            ``embeddings_project`` when ``embedding_size == hidden_size``).
        heads: group -> {fused name -> checkpoint name}: per-member tensors, stacked over M in the
            fused model; each group is all there or all absent (then newly initialised). The group
            ``"classifier"`` is the trained classifier.
        num_labels_key: the fused classifier weight whose rows are the classes (``(M, C, d)``).
        ignored: checkpoint-name prefixes that are read and dropped (LM / pre-training heads, buffers).
    """

    family: str
    prefix: str
    layer: Callable[[int, dict[str, Any]], str]
    layer_map: dict[str, str]
    shared: dict[str, str]
    heads: dict[str, dict[str, str]]
    num_labels_key: str
    optional_shared: tuple[str, ...] = ()
    ignored: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class TextMember:
    """One text checkpoint in canonical form (fused-model names for everything but the layers)."""

    config: dict[str, Any]  # the base config dict (with hidden_size, num_hidden_layers, num_attention_heads)
    shared: dict[str, torch.Tensor]  # fused name -> tensor, identical in every member
    layers: list[dict[str, torch.Tensor]]  # canonical layer dicts (see fuse.py)
    heads: dict[str, dict[str, torch.Tensor]]  # group -> fused name -> this member's tensor (groups present)


def with_prefix(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """A bare encoder's state dict (no ``prefix`` on any key) in task-model names; others unchanged."""
    if any(k.startswith(prefix) for k in state):
        return state
    return {f"{prefix}{k}": v for k, v in state.items()}


def legacy_layer_norm_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the LayerNorm parameters of old TF-converted checkpoints (``LayerNorm.gamma`` /
    ``LayerNorm.beta``) under their current names (``weight`` / ``bias``)."""
    legacy = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
    out = {}
    for key, value in state.items():
        for old, new in legacy.items():
            if key.endswith(old):
                key = key[: -len(old)] + new
        out[key] = value
    return out


def read_text_member(
    state: dict[str, torch.Tensor], config: dict[str, Any], layout: TextLayout, source: str = "checkpoint"
) -> TextMember:
    """Map a checkpoint of ``layout``'s family to canonical form.

    Checks key counts and shapes: a missing tensor, a tensor the layout does not know (more layers
    than ``num_hidden_layers``, another architecture) or a wrong shape raises ``ValueError``.
    """
    state = with_prefix(legacy_layer_norm_names(state), layout.prefix)
    d, L = int(config["hidden_size"]), int(config["num_hidden_layers"])
    used: set[str] = set()
    missing: list[str] = []

    def take(key: str, required: bool = True) -> torch.Tensor | None:
        if key in state:
            used.add(key)
            return state[key]
        if required:
            missing.append(key)
        return None

    shared = {}
    for fused, name in layout.shared.items():
        tensor = take(name, required=fused not in layout.optional_shared)
        if tensor is not None:
            shared[fused] = tensor
    layers = []
    for i in range(L):
        pre = layout.layer(i, config)
        layer = {}
        for short, long in layout.layer_map.items():
            for p in ("weight", "bias"):
                tensor = take(f"{pre}{long}.{p}")
                if tensor is not None:
                    layer[f"{short}.{p}"] = tensor
        layers.append(layer)
    if missing:
        raise ValueError(f"{source} is not a complete {layout.family} checkpoint: missing {describe_keys(missing)}")
    heads: dict[str, dict[str, torch.Tensor]] = {}
    for group, names in layout.heads.items():
        found = {fused: state[name] for fused, name in names.items() if name in state}
        used.update(name for name in names.values() if name in state)
        if found and len(found) != len(names):
            absent = [name for name in names.values() if name not in state]
            raise ValueError(
                f"{source} has part of a {group}: missing {describe_keys(absent)}; pass a complete checkpoint"
            )
        if found:
            heads[group] = found
    unknown = sorted(k for k in state if k not in used and not k.startswith(layout.ignored))
    if unknown:
        raise ValueError(
            f"{source} has tensors the {layout.family} layout does not know: {describe_keys(unknown)} (more layers "
            f"than num_hidden_layers={L}, or another architecture); pass a stock {layout.family} checkpoint"
        )
    check_layer_shapes(layers, d, config.get("intermediate_size"), source)
    return TextMember(config=config, shared=shared, layers=layers, heads=heads)


def fuse_text(
    members: list[TextMember], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """State dict of the fused task model (``hydra.*`` and the per-member heads) from M members.

    ``kept_heads[m][l]``: heads member m keeps in layer l, taken from member m's own weights. A head
    group (pooler, classifier) is kept when every member has it, stacked as ``(M, ...)``.
    """
    config = members[0].config
    dk = int(config["hidden_size"]) // int(config["num_attention_heads"])
    out: dict[str, torch.Tensor] = {}
    for name in members[0].shared:
        out[name] = shared_tensor(name, [m.shared[name] for m in members], shared)
    for i in range(len(members[0].layers)):
        fused = fuse_layer([m.layers[i] for m in members], [kh[i] for kh in kept_heads], dk, mlp_fusion)
        out.update({f"{LAYER_PREFIX}{i}.{k}": v for k, v in fused.items()})
    for group in members[0].heads:
        if all(group in m.heads for m in members):
            out.update(
                {name: torch.stack([m.heads[group][name] for m in members]) for name in members[0].heads[group]}
            )
    return out


def unfuse_text(
    state: dict[str, torch.Tensor], hydra_config: Any, layout: TextLayout, member_config: dict[str, Any] | None = None
) -> list[dict[str, torch.Tensor]]:
    """Inverse of :func:`fuse_text`: one task-model state dict per member (checkpoint names).

    Removed heads are zero in Q/K/V and W_O; under ``mlp_fusion="average"`` every member gets the
    averaged MLP. ``member_config``: the config the layer names follow (default the base config;
    ALBERT passes its untied config, one layer group per layer).
    """
    base = member_config or hydra_config.base_config
    H = int(base["num_attention_heads"])
    dk = int(base["hidden_size"]) // H
    members = []
    for m in range(hydra_config.num_members):
        sd = {name: state[fused].clone() for fused, name in layout.shared.items() if fused in state}
        for i, canon in enumerate(unfuse_member_layers(state, LAYER_PREFIX, hydra_config.kept_heads, H, dk, m)):
            pre = layout.layer(i, base)
            for short, long in layout.layer_map.items():
                for p in ("weight", "bias"):
                    sd[f"{pre}{long}.{p}"] = canon[f"{short}.{p}"]
        for names in layout.heads.values():
            sd.update({name: state[fused][m].clone() for fused, name in names.items() if fused in state})
        members.append(sd)
    return members


def text_reader(layout: TextLayout) -> Reader:
    """The :class:`~hydra_hf.convert.reader.Reader` of the family ``layout`` describes."""
    return Reader(
        functools.partial(read_text_member, layout=layout), fuse_text, functools.partial(unfuse_text, layout=layout)
    )


def bert_layer_map() -> dict[str, str]:
    """BERT's layer layout, shared by RoBERTa, XLM-RoBERTa, CamemBERT and ELECTRA."""
    return {
        "q": "attention.self.query",
        "k": "attention.self.key",
        "v": "attention.self.value",
        "o": "attention.output.dense",
        "norm1": "attention.output.LayerNorm",
        "fc1": "intermediate.dense",
        "fc2": "output.dense",
        "norm2": "output.LayerNorm",
    }
