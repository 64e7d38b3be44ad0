"""Hugging Face BERT-family checkpoints (``BertModel``, ``BertForSequenceClassification``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..masks import HeadMasks
from ..modeling.configuration_hydra import HydraEnsembleConfig
from ..modeling.modeling_hydra_bert import HydraEnsembleForSequenceClassification
from .build import SHAPE_KEYS, base_config_dict, check_same_architecture, label_arguments, load_fused
from .fuse import fuse_layer, shared_tensor, unfuse_member_layers
from .io import read_config, read_state_dict, strip_prefix

_LAYER_MAP = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "norm1": "attention.output.LayerNorm",
    "fc1": "intermediate.dense",
    "fc2": "output.dense",
    "norm2": "output.LayerNorm",
}
EMBEDDING_KEYS = (
    "word_embeddings.weight",
    "position_embeddings.weight",
    "token_type_embeddings.weight",
    "LayerNorm.weight",
    "LayerNorm.bias",
)


@dataclass
class BertMember:
    """One BERT checkpoint in canonical form."""

    config: dict[str, Any]
    embeddings: dict[str, torch.Tensor]  # BertEmbeddings names, without prefix
    layers: list[dict[str, torch.Tensor]]  # canonical layer dicts (see fuse.py)
    pooler: dict[str, torch.Tensor] | None  # {"weight", "bias"} or None
    classifier: dict[str, torch.Tensor] | None  # {"weight", "bias"} or None


def _legacy_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Old TF-converted checkpoints name LayerNorm parameters gamma/beta."""
    out = {}
    for k, v in state.items():
        if k.endswith("LayerNorm.gamma"):
            k = k[: -len("gamma")] + "weight"
        elif k.endswith("LayerNorm.beta"):
            k = k[: -len("beta")] + "bias"
        out[k] = v
    return out


def bert_member_from_state_dict(state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint") -> BertMember:
    """Map a BERT state dict (with or without the ``bert.`` prefix of task models) to canonical form.

    Checks that every expected tensor is present with the shape the config implies.
    """
    state = _legacy_names(state)
    classifier = None
    if "classifier.weight" in state:
        classifier = {"weight": state["classifier.weight"], "bias": state["classifier.bias"]}
    state = strip_prefix(state, ("bert.",))
    d, L = config["hidden_size"], config["num_hidden_layers"]
    missing = [f"embeddings.{k}" for k in EMBEDDING_KEYS if f"embeddings.{k}" not in state]
    layers = []
    for i in range(L):
        layer = {}
        for short, long in _LAYER_MAP.items():
            for p in ("weight", "bias"):
                key = f"encoder.layer.{i}.{long}.{p}"
                if key in state:
                    layer[f"{short}.{p}"] = state[key]
                else:
                    missing.append(key)
        layers.append(layer)
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(f"{source} is not a complete BERT checkpoint: missing {shown}")
    if any(k.startswith(f"encoder.layer.{L}.") for k in state):
        raise ValueError(f"{source} has more layers than its config's num_hidden_layers={L}")
    wrong = [
        f"{k} {tuple(t.shape)}"
        for layer in layers
        for k, t in layer.items()
        if k.endswith("weight") and k.split(".")[0] in ("q", "k", "v", "o") and tuple(t.shape) != (d, d)
    ]
    if wrong:
        raise ValueError(f"{source}: attention weights do not have shape ({d}, {d}) from hidden_size: {wrong[:3]}")
    pooler = None
    if "pooler.dense.weight" in state:
        pooler = {"weight": state["pooler.dense.weight"], "bias": state["pooler.dense.bias"]}
    embeddings = {k: state[f"embeddings.{k}"] for k in EMBEDDING_KEYS}
    return BertMember(config=config, embeddings=embeddings, layers=layers, pooler=pooler, classifier=classifier)


def fuse_bert(
    members: list[BertMember], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error"
) -> dict[str, torch.Tensor]:
    """Fused state dict of ``HydraEnsembleModel`` (keys without the ``hydra.`` prefix) plus, when every
    member has one, ``classifier.{weight,bias}`` of shape ``(M, C, d)`` / ``(M, C)``.

    ``kept_heads[m][l]``: heads member m keeps in layer l, taken from member m's own weights. With
    one checkpoint for all members pass the same ``BertMember`` M times.
    """
    config = members[0].config
    dk = config["hidden_size"] // config["num_attention_heads"]
    out: dict[str, torch.Tensor] = {}
    for k in EMBEDDING_KEYS:
        out[f"embeddings.{k}"] = shared_tensor(f"embeddings.{k}", [m.embeddings[k] for m in members], shared)
    for i in range(config["num_hidden_layers"]):
        fused = fuse_layer([m.layers[i] for m in members], [kh[i] for kh in kept_heads], dk, mlp_fusion)
        out.update({f"layers.{i}.{k}": v for k, v in fused.items()})
    if all(m.pooler is not None for m in members):
        out["pooler.weight"] = torch.stack([m.pooler["weight"] for m in members])
        out["pooler.bias"] = torch.stack([m.pooler["bias"] for m in members])
    if all(m.classifier is not None for m in members):
        out["classifier.weight"] = torch.stack([m.classifier["weight"] for m in members])
        out["classifier.bias"] = torch.stack([m.classifier["bias"] for m in members])
    return out


def unfuse_bert(state: dict[str, torch.Tensor], hydra_config) -> list[dict[str, torch.Tensor]]:
    """Inverse of ``fuse_bert``: one stock ``BertForSequenceClassification`` state dict per member.

    ``state`` is a ``HydraEnsembleForSequenceClassification`` state dict. Removed heads are zero in
    Q/K/V and W_O; under ``mlp_fusion="average"`` every member gets the averaged MLP. Loading member
    m's dict into a stock BERT reproduces the fused model's ``member_logits[:, m]``.
    """
    state = strip_prefix(state, ("hydra.",))
    base = hydra_config.base_config
    H, dk = base["num_attention_heads"], base["hidden_size"] // base["num_attention_heads"]
    members = []
    for m in range(hydra_config.num_members):
        sd = {f"bert.embeddings.{k}": state[f"embeddings.{k}"].clone() for k in EMBEDDING_KEYS}
        for i, canon in enumerate(unfuse_member_layers(state, "layers.", hydra_config.kept_heads, H, dk, m)):
            for short, long in _LAYER_MAP.items():
                for p in ("weight", "bias"):
                    sd[f"bert.encoder.layer.{i}.{long}.{p}"] = canon[f"{short}.{p}"]
        if "pooler.weight" in state:
            sd["bert.pooler.dense.weight"] = state["pooler.weight"][m].clone()
            sd["bert.pooler.dense.bias"] = state["pooler.bias"][m].clone()
        if "classifier.weight" in state:
            sd["classifier.weight"] = state["classifier.weight"][m].clone()
            sd["classifier.bias"] = state["classifier.bias"][m].clone()
        members.append(sd)
    return members


def build_bert(
    folders: list[Path], masks: HeadMasks, *, mlp_fusion: str = "average", shared: str = "error",
    num_labels: int | None = None, id2label: dict[int, str] | None = None, seed: int = 0,
) -> HydraEnsembleForSequenceClassification:
    """BERT checkpoint folders (one base, or one per member) + masks -> ``HydraEnsembleForSequenceClassification``.

    A bare encoder gets new per-member poolers and classifiers (``num_labels`` / ``id2label``, seeded by
    ``seed``), with a warning naming them.
    """
    configs = [read_config(f) for f in folders]
    check_same_architecture(folders, configs, SHAPE_KEYS)
    base_cfg = configs[0]
    masks.check_compatible(base_cfg["num_hidden_layers"], base_cfg["num_attention_heads"], model=repr(str(folders[0])))
    loaded = [bert_member_from_state_dict(read_state_dict(f), cfg, source=repr(str(f))) for f, cfg in zip(folders, configs)]
    member_weights = loaded * masks.num_members if len(loaded) == 1 else loaded
    state = fuse_bert(member_weights, masks.kept_heads, mlp_fusion, shared)
    labels = label_arguments(state, "classifier.weight", base_cfg, num_labels, id2label)
    config = HydraEnsembleConfig(
        base_model_type="bert",
        base_config=base_config_dict(base_cfg),
        kept_heads=masks.kept_heads,
        mlp_fusion=mlp_fusion,
        member_metadata=masks.member_metadata,
        **labels,
    )
    torch.manual_seed(seed)  # the per-member classifiers of a bare encoder are initialised from this seed
    model = HydraEnsembleForSequenceClassification(config)
    state = {k if k.startswith("classifier.") else f"hydra.{k}": v for k, v in state.items()}
    allowed = {"classifier.weight", "classifier.bias", "hydra.pooler.weight", "hydra.pooler.bias"}
    return load_fused(model, state, allowed, folders[0], seed)
