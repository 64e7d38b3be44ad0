"""Hugging Face Llama-style decoder checkpoints (Llama, Mistral, Qwen2, Qwen3; ``*Model``,
``*ForCausalLM``, ``*ForSequenceClassification``): pure functions from state dicts to one canonical member,
to the fused ``HydraEnsembleLlamaForCausalLM`` / ``...ForSequenceClassification`` state dict, and back.

Canonical member: the stock tensors under the stock names of one layer (``self_attn.q_proj.weight``,
``mlp.gate_proj.weight`` ...), the token embeddings, the final norm and the task head (``lm_head`` or
``score``). Grouped-query attention: member m keeps the query heads ``kept_heads[m][l]`` and the key/value
heads they read (``kept_kv_heads``); the fused layer stacks member blocks (see ``modeling_hydra_llama.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..masks import members_kept_kv_heads
from .fuse import average, shared_tensor
from .reader import Reader

LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TASK_HEADS = {"causal_lm": "lm_head", "sequence_classification": "score"}


@dataclass
class DecoderMember:
    """One decoder checkpoint in canonical form (stock tensor names without the ``model.`` prefix)."""

    config: dict[str, Any]
    embed_tokens: torch.Tensor  # (V, d)
    layers: list[dict[str, torch.Tensor]]  # per layer: "self_attn.q_proj.weight", "mlp.gate_proj.weight", ...
    norm: torch.Tensor  # (d,)
    lm_head: torch.Tensor | None  # (V, d): a causal LM's (the embeddings when tied)
    score: torch.Tensor | None  # (C, d): a sequence classifier's


def head_dim_of(config: dict[str, Any]) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def layer_keys(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of one stock decoder layer and its shape, as the config implies."""
    d, H, I = config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]
    Hkv = config.get("num_key_value_heads") or H
    dk = head_dim_of(config)
    keys: dict[str, tuple[int, ...]] = {f"{n}.weight": (d,) for n in LAYER_NORMS}
    keys |= {"self_attn.q_proj.weight": (H * dk, d), "self_attn.k_proj.weight": (Hkv * dk, d),
             "self_attn.v_proj.weight": (Hkv * dk, d), "self_attn.o_proj.weight": (d, H * dk)}
    attention_bias = bool(config.get("attention_bias", False))
    if attention_bias or config["model_type"] == "qwen2":
        keys |= {"self_attn.q_proj.bias": (H * dk,), "self_attn.k_proj.bias": (Hkv * dk,),
                 "self_attn.v_proj.bias": (Hkv * dk,)}
    if attention_bias:
        keys["self_attn.o_proj.bias"] = (d,)
    if config["model_type"] == "qwen3":
        keys |= {"self_attn.q_norm.weight": (dk,), "self_attn.k_norm.weight": (dk,)}
    keys |= {"mlp.gate_proj.weight": (I, d), "mlp.up_proj.weight": (I, d), "mlp.down_proj.weight": (d, I)}
    if config.get("mlp_bias", False):
        keys |= {"mlp.gate_proj.bias": (I,), "mlp.up_proj.bias": (I,), "mlp.down_proj.bias": (d,)}
    return keys


def decoder_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> DecoderMember:
    """Map a stock decoder state dict (bare ``*Model`` or a task model with the ``model.`` prefix) to
    canonical form; every tensor the config implies must be there with its shape, and none may be left over."""
    prefix = "model." if any(k.startswith("model.") for k in state) else ""
    seen: set[str] = set()

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in state:
            raise ValueError(
                f"{source} has no tensor {name!r}; is it a {config['model_type']} checkpoint of this config?"
            )
        t = state[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{source}: {name!r} has shape {tuple(t.shape)}, the config implies {tuple(shape)}")
        seen.add(name)
        return t

    V, d = config["vocab_size"], config["hidden_size"]
    embed = take(prefix + "embed_tokens.weight", (V, d))
    keys = layer_keys(config)
    layers = [
        {k: take(f"{prefix}layers.{i}.{k}", shape) for k, shape in keys.items()}
        for i in range(config["num_hidden_layers"])
    ]
    norm = take(prefix + "norm.weight", (d,))
    lm_head = score = None
    if "lm_head.weight" in state:
        lm_head = take("lm_head.weight", (V, d))
    elif prefix and config.get("tie_word_embeddings") and "score.weight" not in state:
        lm_head = embed  # a tied causal LM saves its output embedding once
    if "score.weight" in state:
        score = state["score.weight"]
        if score.dim() != 2 or score.shape[1] != d:
            raise ValueError(f"{source}: 'score.weight' has shape {tuple(score.shape)}, expected (num_labels, {d})")
        seen.add("score.weight")
    left = sorted(k for k in state if k not in seen and not k.endswith("rotary_emb.inv_freq"))
    if left:
        raise ValueError(f"{source} has tensors a {config['model_type']} decoder does not: {left[:5]}")
    return DecoderMember(dict(config), embed, layers, norm, lm_head, score)


def rows(heads: list[int], dk: int) -> torch.Tensor:
    """Row indices of ``heads`` in a per-head projection of head size ``dk``."""
    return torch.tensor([h * dk + j for h in heads for j in range(dk)], dtype=torch.long)


def fuse_decoder(
    members: list[DecoderMember], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error",
    *, task: str = "causal_lm", lm_head_fusion: str = "shared",
) -> dict[str, torch.Tensor]:
    """State dict of the fused task model (full names): the decoder under ``hydra.``, and ``lm_head.weight``
    (``(V, d)`` shared, or ``(M, V, d)`` per member) or ``score.weight (M, C, d)`` when every member has one.

    ``kept_heads[m][l]``: query heads member m keeps in layer l, taken from member m's weights, with the
    key/value heads they read. The token embeddings are shared (``shared``: the members must agree, or are
    averaged). With one checkpoint for all members pass it M times.
    """
    config = members[0].config
    H = config["num_attention_heads"]
    Hkv = config.get("num_key_value_heads") or H
    dk = head_dim_of(config)
    kv_heads = members_kept_kv_heads(kept_heads, H, Hkv)
    out: dict[str, torch.Tensor] = {
        "hydra.embed_tokens.weight": shared_tensor("embed_tokens.weight", [m.embed_tokens for m in members], shared)
    }
    for i in range(config["num_hidden_layers"]):
        pre, layers = f"hydra.layers.{i}.", [m.layers[i] for m in members]
        for n in LAYER_NORMS:
            out[f"{pre}{n}.weight"] = torch.stack([layer[f"{n}.weight"] for layer in layers])
        for proj, kept in (("q", kept_heads), ("k", kv_heads), ("v", kv_heads)):
            w = [layer[f"self_attn.{proj}_proj.weight"][rows(kept[m][i], dk)] for m, layer in enumerate(layers)]
            out[f"{pre}self_attn.{proj}_weight"] = torch.cat(w)
            if f"self_attn.{proj}_proj.bias" in layers[0]:
                b = [layer[f"self_attn.{proj}_proj.bias"][rows(kept[m][i], dk)] for m, layer in enumerate(layers)]
                out[f"{pre}self_attn.{proj}_bias"] = torch.cat(b)
        o = [layer["self_attn.o_proj.weight"][:, rows(kept_heads[m][i], dk)].T for m, layer in enumerate(layers)]
        out[f"{pre}self_attn.o_weight"] = torch.cat(o)
        if "self_attn.o_proj.bias" in layers[0]:
            out[f"{pre}self_attn.o_bias"] = torch.stack([layer["self_attn.o_proj.bias"] for layer in layers])
        if "self_attn.q_norm.weight" in layers[0]:
            for n in ("q_norm", "k_norm"):
                out[f"{pre}self_attn.{n}"] = torch.stack([layer[f"self_attn.{n}.weight"] for layer in layers])
        fc1 = torch.stack(
            [torch.cat([layer["mlp.gate_proj.weight"], layer["mlp.up_proj.weight"]]) for layer in layers]
        )
        fc2 = torch.stack([layer["mlp.down_proj.weight"] for layer in layers])
        mlp = {"fc1_weight": fc1, "fc2_weight": fc2}
        if "mlp.gate_proj.bias" in layers[0]:
            mlp["fc1_bias"] = torch.stack(
                [torch.cat([layer["mlp.gate_proj.bias"], layer["mlp.up_proj.bias"]]) for layer in layers]
            )
            mlp["fc2_bias"] = torch.stack([layer["mlp.down_proj.bias"] for layer in layers])
        for k, v in mlp.items():
            out[f"{pre}mlp.{k}"] = v if mlp_fusion == "per_member" else average(v)
    out["hydra.norm.weight"] = torch.stack([m.norm for m in members])
    if task == "causal_lm" and all(m.lm_head is not None for m in members):
        heads = torch.stack([m.lm_head for m in members])
        out["lm_head.weight"] = (
            heads if lm_head_fusion == "per_member" else shared_tensor("lm_head.weight", list(heads), shared)
        )
    elif task == "sequence_classification" and all(m.score is not None for m in members):
        out["score.weight"] = torch.stack([m.score for m in members])
    return out


def unfuse_decoder(
    state: dict[str, torch.Tensor], hydra_config: Any, *, task: str = "causal_lm"
) -> list[dict[str, torch.Tensor]]:
    """Inverse of :func:`fuse_decoder`: one stock ``*ForCausalLM`` / ``*ForSequenceClassification`` state dict
    per member, the removed query heads zero in ``q_proj`` and in ``o_proj``'s columns, key/value heads no
    kept query head reads zero in ``k_proj`` / ``v_proj``. Loading member m's dict into a stock model
    reproduces the fused model's ``member_logits[:, m]``."""
    base = hydra_config.base_config
    H = base["num_attention_heads"]
    Hkv = base.get("num_key_value_heads") or H
    dk, d = head_dim_of(base), base["hidden_size"]
    kept, kv = hydra_config.kept_heads, members_kept_kv_heads(hydra_config.kept_heads, H, Hkv)
    M = hydra_config.num_members
    out = []
    for m in range(M):
        sd = {"model.embed_tokens.weight": state["hydra.embed_tokens.weight"].clone()}
        for i in range(base["num_hidden_layers"]):
            pre, new = f"hydra.layers.{i}.", f"model.layers.{i}."
            for n in LAYER_NORMS:
                sd[f"{new}{n}.weight"] = state[f"{pre}{n}.weight"][m].clone()
            for proj, heads, total in (("q", kept, H), ("k", kv, Hkv), ("v", kv, Hkv)):
                widths = [len(h[i]) for h in heads]
                lo = sum(widths[:m]) * dk
                block = slice(lo, lo + widths[m] * dk)
                w = state[f"{pre}self_attn.{proj}_weight"]
                full = w.new_zeros(total * dk, d)
                full[rows(heads[m][i], dk)] = w[block]
                sd[f"{new}self_attn.{proj}_proj.weight"] = full
                if f"{pre}self_attn.{proj}_bias" in state:
                    b = state[f"{pre}self_attn.{proj}_bias"]
                    full_b = b.new_zeros(total * dk)
                    full_b[rows(heads[m][i], dk)] = b[block]
                    sd[f"{new}self_attn.{proj}_proj.bias"] = full_b
            widths = [len(h[i]) for h in kept]
            lo = sum(widths[:m]) * dk
            o = state[f"{pre}self_attn.o_weight"]
            o_full = o.new_zeros(d, H * dk)
            o_full[:, rows(kept[m][i], dk)] = o[lo : lo + widths[m] * dk].T
            sd[f"{new}self_attn.o_proj.weight"] = o_full
            if f"{pre}self_attn.o_bias" in state:
                sd[f"{new}self_attn.o_proj.bias"] = state[f"{pre}self_attn.o_bias"][m].clone()
            for n in ("q_norm", "k_norm"):
                if f"{pre}self_attn.{n}" in state:
                    sd[f"{new}self_attn.{n}.weight"] = state[f"{pre}self_attn.{n}"][m].clone()
            fc1, fc2 = state[f"{pre}mlp.fc1_weight"], state[f"{pre}mlp.fc2_weight"]
            per_member = fc1.dim() == 3
            fc1, fc2 = (fc1[m], fc2[m]) if per_member else (fc1, fc2)
            inner = fc2.shape[-1]
            sd[f"{new}mlp.gate_proj.weight"], sd[f"{new}mlp.up_proj.weight"] = fc1[:inner].clone(), fc1[inner:].clone()
            sd[f"{new}mlp.down_proj.weight"] = fc2.clone()
            if f"{pre}mlp.fc1_bias" in state:
                b1, b2 = state[f"{pre}mlp.fc1_bias"], state[f"{pre}mlp.fc2_bias"]
                b1, b2 = (b1[m], b2[m]) if per_member else (b1, b2)
                sd[f"{new}mlp.gate_proj.bias"], sd[f"{new}mlp.up_proj.bias"] = b1[:inner].clone(), b1[inner:].clone()
                sd[f"{new}mlp.down_proj.bias"] = b2.clone()
        sd["model.norm.weight"] = state["hydra.norm.weight"][m].clone()
        if task == "causal_lm":
            head = state.get("lm_head.weight", state["hydra.embed_tokens.weight"])
            sd["lm_head.weight"] = (head[m] if head.dim() == 3 else head).clone()
        elif "score.weight" in state:
            sd["score.weight"] = state["score.weight"][m].clone()
        out.append(sd)
    return out


READER = Reader(decoder_member_from_state_dict, fuse_decoder, unfuse_decoder)
