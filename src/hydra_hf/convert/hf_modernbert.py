"""Hugging Face ModernBERT checkpoints (``ModernBertModel``, ``ModernBertForSequenceClassification``, the
pre-trained ``ModernBertForMaskedLM``): pure functions from state dicts to the canonical form and to the
fused ``HydraEnsembleModernBertForSequenceClassification`` state dict, and back.

Canonical layer (see ``fuse.py``): ``q``/``k``/``v`` are the three row blocks of the fused ``Wqkv``
``(3*H*dk, d)`` (Q rows first, head h owning rows ``[h*dk, (h+1)*dk)`` of each block), ``o`` is ``Wo``,
``norm1`` the attention LayerNorm (absent in layer 0, where it is the identity), ``fc1`` the gated
``Wi`` ``(2*I, d)`` (input rows then gate rows), ``fc2`` the MLP's ``Wo`` and ``norm2`` the MLP LayerNorm.
Biases are present only where the config has them (``attention_bias``, ``mlp_bias``, ``norm_bias``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import ModernBertConfig

from .fuse import fuse_layer, shared_tensor, unfuse_member_layers
from .reader import Reader

# heads of other tasks that a pre-trained checkpoint may carry: not part of a classifier
_IGNORED_PREFIXES = ("decoder.",)


@dataclass
class ModernBertMember:
    """One ModernBERT checkpoint in canonical form."""

    config: dict[str, Any]
    embeddings: dict[str, torch.Tensor]  # ModernBertEmbeddings names: tok_embeddings.weight, norm.weight[, norm.bias]
    layers: list[dict[str, torch.Tensor]]  # canonical layer dicts
    final_norm: dict[str, torch.Tensor]  # "weight"[, "bias"]
    head: dict[str, torch.Tensor] | None  # "dense.weight"[, "dense.bias"], "norm.weight"[, "norm.bias"]
    classifier: dict[str, torch.Tensor] | None  # {"weight", "bias"}


@dataclass(frozen=True)
class _Biases:
    attention: bool
    mlp: bool
    norm: bool
    classifier: bool


def _biases(config: dict[str, Any]) -> _Biases:
    c = ModernBertConfig.from_dict(config)
    return _Biases(bool(c.attention_bias), bool(c.mlp_bias), bool(c.norm_bias), bool(c.classifier_bias))


def modernbert_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> ModernBertMember:
    """Map a ModernBERT state dict (with or without the ``model.`` prefix of task models) to canonical form.
    Every tensor the config implies must be present with its shape, and every tensor of the checkpoint must
    be accounted for (the masked-LM decoder is ignored by name). Checkpoints of other task heads (token
    classification, QA, multiple choice), whose tensors look like a classifier's, are refused by the family
    registry from their config's ``architectures``."""
    b = _biases(config)
    d, L, H = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
    inner = config["intermediate_size"]
    top = {k: v for k, v in state.items() if not k.startswith("model.")}
    enc = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    if not enc:  # a bare ModernBertModel
        enc, top = top, {}
    used: set[tuple[int, str]] = set()
    missing: list[str] = []

    def take(store: dict[str, torch.Tensor], key: str) -> torch.Tensor | None:
        if key in store:
            used.add((id(store), key))
            return store[key]
        missing.append(key)
        return None

    def linear(store: dict[str, torch.Tensor], name: str, bias: bool) -> dict[str, torch.Tensor]:
        out = {"weight": take(store, f"{name}.weight")}
        if bias:
            out["bias"] = take(store, f"{name}.bias")
        return out

    embeddings = {"tok_embeddings.weight": take(enc, "embeddings.tok_embeddings.weight")}
    embeddings.update({f"norm.{k}": v for k, v in linear(enc, "embeddings.norm", b.norm).items()})
    layers = []
    for i in range(L):
        pre = f"layers.{i}."
        qkv = linear(enc, pre + "attn.Wqkv", b.attention)
        layer: dict[str, torch.Tensor] = {}
        if qkv["weight"] is not None:
            if tuple(qkv["weight"].shape) != (3 * d, d):
                raise ValueError(
                    f"{source}: layer {i} Wqkv has shape {tuple(qkv['weight'].shape)}, expected ({3 * d}, {d}) "
                    "from hidden_size"
                )
            for name, w in zip("qkv", qkv["weight"].chunk(3)):  # [Q rows; K rows; V rows]
                layer[f"{name}.weight"] = w
            if b.attention:
                for name, bias in zip("qkv", qkv["bias"].chunk(3)):
                    layer[f"{name}.bias"] = bias
        parts = {"o": "attn.Wo", "fc1": "mlp.Wi", "fc2": "mlp.Wo", "norm2": "mlp_norm"}
        if i > 0:
            parts["norm1"] = "attn_norm"
        for short, long in parts.items():
            bias = {"o": b.attention, "fc1": b.mlp, "fc2": b.mlp}.get(short, b.norm)
            for p, t in linear(enc, pre + long, bias).items():
                layer[f"{short}.{p}"] = t
        layers.append(layer)
    final_norm = linear(enc, "final_norm", b.norm)
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(f"{source} is not a complete ModernBERT checkpoint for its config: missing {shown}")
    head = classifier = None
    if "head.dense.weight" in top:
        head = {f"dense.{k}": v for k, v in linear(top, "head.dense", b.classifier).items()}
        head.update({f"norm.{k}": v for k, v in linear(top, "head.norm", b.norm).items()})
    if "classifier.weight" in top:
        classifier = linear(top, "classifier", True)
    if missing:
        raise ValueError(f"{source}: incomplete prediction head, missing {missing}")
    left = [
        k for store in (enc, top) for k in store if (id(store), k) not in used and not k.startswith(_IGNORED_PREFIXES)
    ]
    if left:
        shown = ", ".join(sorted(left)[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        raise ValueError(
            f"{source} has tensors a ModernBERT model with its config does not have: {shown}; check "
            "num_hidden_layers and attention_bias / mlp_bias / norm_bias / classifier_bias in its config.json"
        )
    for i, layer in enumerate(layers):
        for short, shape in (("o", (d, d)), ("fc1", (2 * inner, d)), ("fc2", (d, inner))):
            if tuple(layer[f"{short}.weight"].shape) != shape:
                raise ValueError(
                    f"{source}: layer {i} {short} weight has shape {tuple(layer[f'{short}.weight'].shape)}, expected "
                    f"{shape} from hidden_size / intermediate_size"
                )
    if d % H:
        raise ValueError(f"{source}: hidden_size={d} is not a multiple of num_attention_heads={H}")
    return ModernBertMember(config, embeddings, layers, final_norm, head, classifier)


def _with_placeholders(layer: dict[str, torch.Tensor], d: int) -> dict[str, torch.Tensor]:
    """``fuse_layer`` needs both LayerNorms with biases: layer 0's identity ``norm1`` and missing norm
    biases get placeholders, dropped again from the fused result."""
    out = dict(layer)
    like = layer["o.weight"]
    out.setdefault("norm1.weight", torch.ones(d, dtype=like.dtype))
    for norm in ("norm1", "norm2"):
        out.setdefault(f"{norm}.bias", torch.zeros(d, dtype=like.dtype))
    return out


def fuse_modernbert(
    members: list[ModernBertMember], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """State dict of ``HydraEnsembleModernBertForSequenceClassification`` (full names): the encoder under
    ``hydra.``, and ``head.*`` / ``classifier.*`` with a leading member axis when every member has them.

    ``kept_heads[m][l]``: heads member m keeps in layer l, taken from member m's own weights. The embeddings
    are shared (the members must agree, see ``shared``). With one checkpoint for all members pass it M times.
    """
    config = members[0].config
    d = config["hidden_size"]
    dk = d // config["num_attention_heads"]
    b = _biases(config)
    out: dict[str, torch.Tensor] = {}
    for k in members[0].embeddings:
        out[f"hydra.embeddings.{k}"] = shared_tensor(f"embeddings.{k}", [m.embeddings[k] for m in members], shared)
    for i in range(config["num_hidden_layers"]):
        fused = fuse_layer(
            [_with_placeholders(m.layers[i], d) for m in members], [kh[i] for kh in kept_heads], dk, mlp_fusion
        )
        drop = set()
        if i == 0:
            drop |= {"norm1.weight", "norm1.bias"}
        if not b.norm:
            drop |= {"norm1.bias", "norm2.bias"}
        if not b.attention:
            drop |= {"attention.qkv_bias", "attention.o_bias"}
        if not b.mlp:
            drop |= {"mlp.fc1_bias", "mlp.fc2_bias"}
        out.update({f"hydra.layers.{i}.{k}": v for k, v in fused.items() if k not in drop})
    for k in members[0].final_norm:
        out[f"hydra.final_norm.{k}"] = torch.stack([m.final_norm[k] for m in members])
    if all(m.head is not None for m in members):
        for k in members[0].head:
            out[f"head.{k}"] = torch.stack([m.head[k] for m in members])
    if all(m.classifier is not None for m in members):
        for k in ("weight", "bias"):
            out[f"classifier.{k}"] = torch.stack([m.classifier[k] for m in members])
    return out


def unfuse_modernbert(state: dict[str, torch.Tensor], hydra_config) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_modernbert``: one stock ``ModernBertForSequenceClassification`` state dict per member.

    Removed heads are zero in ``Wqkv`` and in ``Wo``'s columns; under ``mlp_fusion="average"`` every member
    gets the averaged MLP. Loading member m's dict into a stock model reproduces the fused model's
    ``member_logits[:, m]``.
    """
    base = hydra_config.base_config
    b = _biases(base)
    d, H = base["hidden_size"], base["num_attention_heads"]
    dk = d // H
    L = base["num_hidden_layers"]
    # complete the fused layers with the placeholders of fuse_modernbert, so that unfuse_layer applies
    full = dict(state)
    M = hydra_config.num_members
    like = state["hydra.layers.0.attention.qkv_weight"]
    for i in range(L):
        pre = f"hydra.layers.{i}."
        full.setdefault(
            pre + "attention.qkv_bias", torch.zeros(state[pre + "attention.qkv_weight"].shape[0], dtype=like.dtype)
        )
        full.setdefault(pre + "attention.o_bias", torch.zeros(M, d, dtype=like.dtype))
        full.setdefault(pre + "norm1.weight", torch.ones(M, d, dtype=like.dtype))
        for norm in ("norm1", "norm2"):
            full.setdefault(pre + f"{norm}.bias", torch.zeros(M, d, dtype=like.dtype))
        per_member = state[pre + "mlp.fc1_weight"].dim() == 3
        for fc in ("fc1", "fc2"):
            rows = state[pre + f"mlp.{fc}_weight"].shape[:-1]
            full.setdefault(pre + f"mlp.{fc}_bias", torch.zeros(rows if per_member else rows[-1:], dtype=like.dtype))
    members = []
    for m in range(M):
        sd = {f"model.{k[len('hydra.'):]}": v.clone() for k, v in state.items() if k.startswith("hydra.embeddings.")}
        for i, canon in enumerate(unfuse_member_layers(full, "hydra.layers.", hydra_config.kept_heads, H, dk, m)):
            pre = f"model.layers.{i}."
            sd[pre + "attn.Wqkv.weight"] = torch.cat([canon["q.weight"], canon["k.weight"], canon["v.weight"]])
            parts = {"attn.Wo": "o", "mlp.Wi": "fc1", "mlp.Wo": "fc2", "mlp_norm": "norm2"}
            if i > 0:
                parts["attn_norm"] = "norm1"
            for long, short in parts.items():
                sd[pre + f"{long}.weight"] = canon[f"{short}.weight"]
            if b.attention:
                sd[pre + "attn.Wqkv.bias"] = torch.cat([canon["q.bias"], canon["k.bias"], canon["v.bias"]])
                sd[pre + "attn.Wo.bias"] = canon["o.bias"]
            if b.mlp:
                sd[pre + "mlp.Wi.bias"], sd[pre + "mlp.Wo.bias"] = canon["fc1.bias"], canon["fc2.bias"]
            if b.norm:
                sd[pre + "mlp_norm.bias"] = canon["norm2.bias"]
                if i > 0:
                    sd[pre + "attn_norm.bias"] = canon["norm1.bias"]
        for k in ("weight", "bias"):
            if f"hydra.final_norm.{k}" in state:
                sd[f"model.final_norm.{k}"] = state[f"hydra.final_norm.{k}"][m].clone()
        for k, v in state.items():
            if k.startswith(("head.", "classifier.")):
                sd[k] = v[m].clone()
        members.append(sd)
    return members


READER = Reader(modernbert_member_from_state_dict, fuse_modernbert, unfuse_modernbert)
