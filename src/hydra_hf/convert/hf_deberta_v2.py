"""Hugging Face DeBERTa-v2 / DeBERTa-v3 checkpoints (``DebertaV2Model``, ``DebertaV2ForSequenceClassification``,
the pre-trained ``DebertaV2ForMaskedLM``): pure functions from state dicts to the canonical form and to the
fused ``HydraEnsembleDebertaV2ForSequenceClassification`` state dict, and back.

Canonical layer (see ``fuse.py``) plus, when the base has its own position projections
(``share_att_key=False``), ``pos_k.{weight,bias}`` (``pos_key_proj``, c2p) and ``pos_q.{weight,bias}``
(``pos_query_proj``, p2c), ``(H*dk, d)`` like Q and K: head h owns rows ``[h*dk, (h+1)*dk)`` of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DebertaV2Config

from ..modeling.modeling_hydra_deberta_v2 import relative_span
from .fuse import fuse_layer, head_rows, shared_tensor, unfuse_member_layers
from .reader import Reader

_LAYER_MAP = {
    "q": "attention.self.query_proj",
    "k": "attention.self.key_proj",
    "v": "attention.self.value_proj",
    "o": "attention.output.dense",
    "norm1": "attention.output.LayerNorm",
    "fc1": "intermediate.dense",
    "fc2": "output.dense",
    "norm2": "output.LayerNorm",
}
_POS_MAP = {"pos_k": "attention.self.pos_key_proj", "pos_q": "attention.self.pos_query_proj"}
_POS_FUSED = {"pos_k": "pos_key", "pos_q": "pos_query"}
_CONV_MAP = {
    "weight": "conv.weight",
    "bias": "conv.bias",
    "norm.weight": "LayerNorm.weight",
    "norm.bias": "LayerNorm.bias",
}
# heads of other tasks that a pre-trained or fine-tuned checkpoint may carry: not part of a classifier
_IGNORED_PREFIXES = ("lm_predictions.", "cls.", "mask_predictions.")


@dataclass
class DebertaV2Member:
    """One DeBERTa-v2/v3 checkpoint in canonical form."""

    config: dict[str, Any]
    embeddings: dict[str, torch.Tensor]  # DebertaV2Embeddings names, without prefix
    relative: dict[str, torch.Tensor]  # "rel_embeddings.weight" and "rel_norm.{weight,bias}" when the base has them
    layers: list[dict[str, torch.Tensor]]  # canonical layer dicts (+ pos_k / pos_q)
    conv: dict[str, torch.Tensor] | None  # "weight", "bias", "norm.weight", "norm.bias" (conv_kernel_size > 0)
    pooler: dict[str, torch.Tensor] | None  # ContextPooler dense {"weight", "bias"}
    classifier: dict[str, torch.Tensor] | None  # {"weight", "bias"}


@dataclass(frozen=True)
class _Layout:
    """Which optional tensors a DeBERTa-v2 configuration has."""

    relative: bool
    rel_norm: bool
    pos_proj: tuple[str, ...]  # canonical names of the own position projections ("pos_k", "pos_q")
    position_embeddings: bool
    token_types: bool
    embed_proj: bool
    conv: bool


def layout_of(config: dict[str, Any]) -> _Layout:
    """The optional parts of a DeBERTa-v2 model with this ``config.json`` (transformers' defaults filled in)."""
    c = DebertaV2Config.from_dict(config)
    relative = bool(getattr(c, "relative_attention", False))
    types = list(c.pos_att_type or []) if relative else []
    norm_rel = [x.strip() for x in str(getattr(c, "norm_rel_ebd", "none")).lower().split("|")]
    own = relative and not getattr(c, "share_att_key", False)
    return _Layout(
        relative=relative,
        rel_norm="layer_norm" in norm_rel,
        pos_proj=tuple(name for name, kind in (("pos_k", "c2p"), ("pos_q", "p2c")) if own and kind in types),
        position_embeddings=bool(getattr(c, "position_biased_input", True)),
        token_types=c.type_vocab_size > 0,
        embed_proj=getattr(c, "embedding_size", c.hidden_size) != c.hidden_size,
        conv=getattr(c, "conv_kernel_size", 0) > 0,
    )


def deberta_v2_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> DebertaV2Member:
    """Map a DeBERTa-v2/v3 state dict (with or without the ``deberta.`` prefix of task models) to canonical
    form. Every tensor the config implies must be present with its shape, and every tensor of the
    checkpoint must be accounted for (other task heads are ignored by name). Checkpoints of other task
    heads (token classification, QA, multiple choice) are refused by the family registry, from their
    config's ``architectures``."""
    lay = layout_of(config)
    d, L, H = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
    head_size = config.get("attention_head_size")
    if head_size is not None and head_size != d // H:
        raise ValueError(
            f"{source} has attention_head_size={head_size} != hidden_size // num_attention_heads; not supported"
        )
    top = {k: v for k, v in state.items() if not k.startswith("deberta.")}
    enc = {k[len("deberta."):]: v for k, v in state.items() if k.startswith("deberta.")}
    if not enc:  # a bare DebertaV2Model
        enc, top = top, {}
    used: set[tuple[int, str]] = set()
    missing: list[str] = []

    def take(store: dict[str, torch.Tensor], key: str) -> torch.Tensor | None:
        if key in store:
            used.add((id(store), key))
            return store[key]
        missing.append(key)
        return None

    emb_keys = ["word_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias"]
    emb_keys += ["position_embeddings.weight"] if lay.position_embeddings else []
    emb_keys += ["token_type_embeddings.weight"] if lay.token_types else []
    emb_keys += ["embed_proj.weight"] if lay.embed_proj else []
    embeddings = {k: take(enc, f"embeddings.{k}") for k in emb_keys}
    relative: dict[str, torch.Tensor] = {}
    if lay.relative:
        relative["rel_embeddings.weight"] = take(enc, "encoder.rel_embeddings.weight")
    if lay.rel_norm:
        relative["rel_norm.weight"] = take(enc, "encoder.LayerNorm.weight")
        relative["rel_norm.bias"] = take(enc, "encoder.LayerNorm.bias")
    layers = []
    for i in range(L):
        layer = {}
        for short, long in [*_LAYER_MAP.items(), *((p, _POS_MAP[p]) for p in lay.pos_proj)]:
            for p in ("weight", "bias"):
                layer[f"{short}.{p}"] = take(enc, f"encoder.layer.{i}.{long}.{p}")
        layers.append(layer)
    conv = None
    if lay.conv:
        conv = {k: take(enc, f"encoder.conv.{stock}") for k, stock in _CONV_MAP.items()}
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(f"{source} is not a complete DeBERTa-v2 checkpoint for its config: missing {shown}")
    pooler = classifier = None
    if "pooler.dense.weight" in top:
        pooler = {"weight": take(top, "pooler.dense.weight"), "bias": take(top, "pooler.dense.bias")}
    if "classifier.weight" in top:
        if pooler is None:
            raise ValueError(
                f"{source} has a classifier but no pooler (a token classification head?); hydra_hf builds DeBERTa "
                "sequence classifiers (ContextPooler + classifier)"
            )
        classifier = {"weight": take(top, "classifier.weight"), "bias": take(top, "classifier.bias")}
    if missing:
        raise ValueError(f"{source}: incomplete classification head, missing {missing}")
    ignorable = [*_IGNORED_PREFIXES]
    if not lay.position_embeddings:  # transformers ignores a position table a model does not use
        ignorable.append("embeddings.position_embeddings.")
    left = [
        k for store in (enc, top) for k in store
        if (id(store), k) not in used and not k.startswith(tuple(ignorable))
        and k != "embeddings.position_ids"  # a buffer that old checkpoints saved
    ]
    if left:
        shown = ", ".join(sorted(left)[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        raise ValueError(
            f"{source} has tensors a DeBERTa-v2 model with its config does not have: {shown}; "
            "check num_hidden_layers / relative_attention / pos_att_type / share_att_key in its config.json"
        )
    dk = d // H
    for i, layer in enumerate(layers):
        for short in ("q", "k", "v", "o", *lay.pos_proj):
            if tuple(layer[f"{short}.weight"].shape) != (H * dk, d):
                raise ValueError(
                    f"{source}: layer {i} {short} weight has shape {tuple(layer[f'{short}.weight'].shape)}, "
                    f"expected ({H * dk}, {d}) from hidden_size and num_attention_heads"
                )
    if lay.relative:
        rows = 2 * relative_span(DebertaV2Config.from_dict(config))
        if tuple(relative["rel_embeddings.weight"].shape) != (rows, d):
            raise ValueError(
                f"{source}: rel_embeddings has shape {tuple(relative['rel_embeddings.weight'].shape)}, expected "
                f"({rows}, {d}) from position_buckets / max_relative_positions"
            )
    return DebertaV2Member(config, embeddings, relative, layers, conv, pooler, classifier)


def fuse_deberta_v2(
    members: list[DebertaV2Member], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """State dict of ``HydraEnsembleDebertaV2ForSequenceClassification`` (full names): the encoder under
    ``hydra.``, and ``pooler.*`` / ``classifier.*`` ``(M, ., d)`` when every member has them.

    ``kept_heads[m][l]``: heads member m keeps in layer l, taken from member m's own weights; their rows of
    the position projections go with them. Embeddings and the relative-position table are shared (the
    members must agree, see ``shared``); the table's LayerNorm is per member. With one checkpoint for all
    members pass it M times.
    """
    config = members[0].config
    dk = config["hidden_size"] // config["num_attention_heads"]
    out: dict[str, torch.Tensor] = {}
    for k in members[0].embeddings:
        out[f"hydra.embeddings.{k}"] = shared_tensor(f"embeddings.{k}", [m.embeddings[k] for m in members], shared)
    for k in members[0].relative:  # the table is shared, its LayerNorm is per member
        tensors = [m.relative[k] for m in members]
        out[f"hydra.{k}"] = torch.stack(tensors) if k.startswith("rel_norm.") else shared_tensor(k, tensors, shared)
    for i in range(config["num_hidden_layers"]):
        member_layers = [m.layers[i] for m in members]
        heads = [kh[i] for kh in kept_heads]
        fused = fuse_layer(member_layers, heads, dk, mlp_fusion)
        for short, name in _POS_FUSED.items():
            if f"{short}.weight" in member_layers[0]:
                rows = [head_rows(h, dk) for h in heads]
                fused[f"attention.{name}_weight"] = torch.cat(
                    [l[f"{short}.weight"][r] for l, r in zip(member_layers, rows)]
                )
                fused[f"attention.{name}_bias"] = torch.cat(
                    [l[f"{short}.bias"][r] for l, r in zip(member_layers, rows)]
                )
        out.update({f"hydra.layers.{i}.{k}": v for k, v in fused.items()})
    if members[0].conv is not None:
        for k in ("weight", "bias", "norm.weight", "norm.bias"):
            out[f"hydra.conv.{k}"] = torch.stack([m.conv[k] for m in members])
    for part in ("pooler", "classifier"):
        if all(getattr(m, part) is not None for m in members):
            for p in ("weight", "bias"):
                out[f"{part}.{p}"] = torch.stack([getattr(m, part)[p] for m in members])
    return out


def unfuse_deberta_v2(state: dict[str, torch.Tensor], hydra_config) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_deberta_v2``: one stock ``DebertaV2ForSequenceClassification`` state dict per member.

    Removed heads are zero in Q/K/V, in the position projections and in W_O; under ``mlp_fusion="average"``
    every member gets the averaged MLP. Loading member m's dict into a stock model reproduces the fused
    model's ``member_logits[:, m]``.
    """
    base = hydra_config.base_config
    lay = layout_of(base)
    H, d = base["num_attention_heads"], base["hidden_size"]
    dk = d // H
    kept = hydra_config.kept_heads
    members = []
    for m in range(hydra_config.num_members):
        sd = {f"deberta.{k[len('hydra.'):]}": v.clone() for k, v in state.items() if k.startswith("hydra.embeddings.")}
        if lay.relative:
            sd["deberta.encoder.rel_embeddings.weight"] = state["hydra.rel_embeddings.weight"].clone()
        if lay.rel_norm:
            sd["deberta.encoder.LayerNorm.weight"] = state["hydra.rel_norm.weight"][m].clone()
            sd["deberta.encoder.LayerNorm.bias"] = state["hydra.rel_norm.bias"][m].clone()
        for i, canon in enumerate(unfuse_member_layers(state, "hydra.layers.", kept, H, dk, m)):
            for short, long in _LAYER_MAP.items():
                for p in ("weight", "bias"):
                    sd[f"deberta.encoder.layer.{i}.{long}.{p}"] = canon[f"{short}.{p}"]
            widths = [len(kh[i]) for kh in kept]
            start, rows = sum(widths[:m]), head_rows(kept[m][i], dk)
            for short in lay.pos_proj:
                name = _POS_FUSED[short]
                fused_w = state[f"hydra.layers.{i}.attention.{name}_weight"]  # (K*dk, d), member-major
                fused_b = state[f"hydra.layers.{i}.attention.{name}_bias"]
                block = slice(dk * start, dk * (start + widths[m]))
                weight = torch.zeros(H * dk, d, dtype=fused_w.dtype)
                bias = torch.zeros(H * dk, dtype=fused_b.dtype)
                weight[rows], bias[rows] = fused_w[block], fused_b[block]
                sd[f"deberta.encoder.layer.{i}.{_POS_MAP[short]}.weight"] = weight
                sd[f"deberta.encoder.layer.{i}.{_POS_MAP[short]}.bias"] = bias
        if lay.conv:
            for k, stock in _CONV_MAP.items():
                sd[f"deberta.encoder.conv.{stock}"] = state[f"hydra.conv.{k}"][m].clone()
        for part, stock in (("pooler", "pooler.dense"), ("classifier", "classifier")):
            if f"{part}.weight" in state:
                sd[f"{stock}.weight"] = state[f"{part}.weight"][m].clone()
                sd[f"{stock}.bias"] = state[f"{part}.bias"][m].clone()
        members.append(sd)
    return members


READER = Reader(deberta_v2_member_from_state_dict, fuse_deberta_v2, unfuse_deberta_v2)
