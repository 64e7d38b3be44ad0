"""Hugging Face GPT-2 checkpoints (``GPT2Model``, ``GPT2LMHeadModel``, ``GPT2ForSequenceClassification``):
pure functions from state dicts to one canonical member, to the fused ``HydraEnsembleGPT2ForCausalLM`` /
``...ForSequenceClassification`` state dict, and back.

Canonical member: the stock tensors under the stock names of one layer (``attn.c_attn.weight``,
``mlp.c_fc.weight`` ...; GPT-2's ``Conv1D`` weights are ``(in, out)``, kept as they are), the token and
position embeddings, the final LayerNorm and the task head (``lm_head`` or ``score``). The fused layer stores
``nn.Linear``-oriented member blocks (see ``modeling_hydra_gpt2.py``): the transposes happen here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .fuse import average, shared_tensor
from .reader import Reader

LAYER_NORMS = ("ln_1", "ln_2")
TASK_HEADS = {"causal_lm": "lm_head", "sequence_classification": "score"}
# buffers of older checkpoints (the causal mask), no weights
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".crossattention.bias", ".crossattention.masked_bias")


@dataclass
class GPT2Member:
    """One GPT-2 checkpoint in canonical form (stock tensor names without the ``transformer.`` prefix)."""

    config: dict[str, Any]
    wte: torch.Tensor  # (V, d)
    wpe: torch.Tensor  # (P, d)
    layers: list[dict[str, torch.Tensor]]  # per layer: "ln_1.weight", "attn.c_attn.weight" (d, 3d), ...
    ln_f: dict[str, torch.Tensor]  # "weight", "bias" (d,)
    lm_head: torch.Tensor | None  # (V, d): a causal LM's (the token embeddings when tied)
    score: torch.Tensor | None  # (C, d): a sequence classifier's


def shape_of(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """``(num_layers, num_heads, hidden_size, inner_size)`` of a GPT-2 config dict (GPT-2's names or the aliases)."""
    d = config.get("n_embd", config.get("hidden_size"))
    inner = config.get("n_inner")
    return (
        int(config.get("n_layer", config.get("num_hidden_layers"))),
        int(config.get("n_head", config.get("num_attention_heads"))),
        int(d),
        int(inner) if inner is not None else 4 * int(d),
    )


def layer_keys(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of one stock GPT-2 block and its shape (``Conv1D``: ``(in, out)``)."""
    _, _, d, inner = shape_of(config)
    keys: dict[str, tuple[int, ...]] = {}
    for n in LAYER_NORMS:
        keys |= {f"{n}.weight": (d,), f"{n}.bias": (d,)}
    keys |= {"attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,),
             "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
             "mlp.c_fc.weight": (d, inner), "mlp.c_fc.bias": (inner,),
             "mlp.c_proj.weight": (inner, d), "mlp.c_proj.bias": (d,)}
    return keys


def gpt2_member_from_state_dict(
    state: dict[str, torch.Tensor], config: dict[str, Any], source: str = "checkpoint"
) -> GPT2Member:
    """Map a stock GPT-2 state dict (bare ``GPT2Model`` or a task model with the ``transformer.`` prefix) to
    canonical form; every tensor the config implies must be there with its shape, and none may be left over
    (the causal-mask buffers of older checkpoints, ``attn.bias`` / ``attn.masked_bias``, are ignored)."""
    if config.get("add_cross_attention"):
        raise ValueError(f"{source} has add_cross_attention=True; a Hydra Ensemble of GPT-2 fuses decoder-only models")
    prefix = "transformer." if any(k.startswith("transformer.") for k in state) else ""
    seen: set[str] = set()

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in state:
            raise ValueError(f"{source} has no tensor {name!r}; is it a GPT-2 checkpoint of this config?")
        t = state[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{source}: {name!r} has shape {tuple(t.shape)}, the config implies {tuple(shape)}")
        seen.add(name)
        return t

    num_layers, _, d, _ = shape_of(config)
    V, P = int(config["vocab_size"]), int(config.get("n_positions", config.get("max_position_embeddings")))
    wte = take(prefix + "wte.weight", (V, d))
    wpe = take(prefix + "wpe.weight", (P, d))
    keys = layer_keys(config)
    layers = [{k: take(f"{prefix}h.{i}.{k}", shape) for k, shape in keys.items()} for i in range(num_layers)]
    ln_f = {n: take(f"{prefix}ln_f.{n}", (d,)) for n in ("weight", "bias")}
    lm_head = score = None
    if "lm_head.weight" in state:
        lm_head = take("lm_head.weight", (V, d))
    elif config.get("tie_word_embeddings", True) and "score.weight" not in state:
        # a tied causal LM saves its output embedding once (OpenAI's gpt2 checkpoints: a bare GPT2Model's keys)
        lm_head = wte
    if "score.weight" in state:
        score = state["score.weight"]
        if score.dim() != 2 or score.shape[1] != d:
            raise ValueError(f"{source}: 'score.weight' has shape {tuple(score.shape)}, expected (num_labels, {d})")
        seen.add("score.weight")
    left = sorted(k for k in state if k not in seen and not k.endswith(IGNORED_SUFFIXES))
    if left:
        raise ValueError(f"{source} has tensors a GPT-2 model does not: {left[:5]}")
    return GPT2Member(dict(config), wte, wpe, layers, ln_f, lm_head, score)


def rows(heads: list[int], dk: int, offset: int = 0) -> torch.Tensor:
    """Indices of ``heads``' ``dk`` features each, from ``offset`` (GPT-2 keeps head h at ``h*dk .. (h+1)*dk``)."""
    return torch.tensor([offset + h * dk + j for h in heads for j in range(dk)], dtype=torch.long)


def fuse_gpt2(
    members: list[GPT2Member], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str = "error",
    *, task: str = "causal_lm", lm_head_fusion: str = "shared",
) -> dict[str, torch.Tensor]:
    """State dict of the fused task model (full names): the decoder under ``hydra.``, and ``lm_head.weight``
    (``(V, d)`` shared, or ``(M, V, d)`` per member) or ``score.weight (M, C, d)`` when every member has one.

    ``kept_heads[m][l]``: heads member m keeps in layer l, taken from member m's weights. The token and
    position embeddings are shared (``shared``: the members must agree, or are averaged). With one
    checkpoint for all members pass it M times.
    """
    config = members[0].config
    num_layers, H, d, _ = shape_of(config)
    dk = d // H
    out: dict[str, torch.Tensor] = {
        "hydra.wte.weight": shared_tensor("wte.weight", [m.wte for m in members], shared),
        "hydra.wpe.weight": shared_tensor("wpe.weight", [m.wpe for m in members], shared),
    }
    for i in range(num_layers):
        pre, layers = f"hydra.h.{i}.", [m.layers[i] for m in members]
        for n in LAYER_NORMS:
            for p in ("weight", "bias"):
                out[f"{pre}{n}.{p}"] = torch.stack([layer[f"{n}.{p}"] for layer in layers])
        qkv_w, qkv_b, o_w = [], [], []
        for m, layer in enumerate(layers):
            idx = torch.cat([rows(kept_heads[m][i], dk, part * d) for part in range(3)])  # [Q; K; V] of kept heads
            qkv_w.append(layer["attn.c_attn.weight"][:, idx].T)  # (3*k_m*dk, d)
            qkv_b.append(layer["attn.c_attn.bias"][idx])
            o_w.append(layer["attn.c_proj.weight"][rows(kept_heads[m][i], dk)])  # (k_m*dk, d): Conv1D rows = inputs
        out[f"{pre}attn.qkv_weight"] = torch.cat(qkv_w).contiguous()
        out[f"{pre}attn.qkv_bias"] = torch.cat(qkv_b)
        out[f"{pre}attn.o_weight"] = torch.cat(o_w).contiguous()
        out[f"{pre}attn.o_bias"] = torch.stack([layer["attn.c_proj.bias"] for layer in layers])
        mlp = {
            "fc1_weight": torch.stack([layer["mlp.c_fc.weight"].T for layer in layers]),  # (M, I, d)
            "fc1_bias": torch.stack([layer["mlp.c_fc.bias"] for layer in layers]),
            "fc2_weight": torch.stack([layer["mlp.c_proj.weight"].T for layer in layers]),  # (M, d, I)
            "fc2_bias": torch.stack([layer["mlp.c_proj.bias"] for layer in layers]),
        }
        for k, v in mlp.items():
            out[f"{pre}mlp.{k}"] = (v if mlp_fusion == "per_member" else average(v)).contiguous()
    for p in ("weight", "bias"):
        out[f"hydra.ln_f.{p}"] = torch.stack([m.ln_f[p] for m in members])
    if task == "causal_lm" and all(m.lm_head is not None for m in members):
        heads = torch.stack([m.lm_head for m in members])
        out["lm_head.weight"] = (
            heads if lm_head_fusion == "per_member" else shared_tensor("lm_head.weight", list(heads), shared)
        )
    elif task == "sequence_classification" and all(m.score is not None for m in members):
        out["score.weight"] = torch.stack([m.score for m in members])
    return out


def unfuse_gpt2(
    state: dict[str, torch.Tensor], hydra_config: Any, *, task: str = "causal_lm"
) -> list[dict[str, torch.Tensor]]:
    """Inverse of :func:`fuse_gpt2`: one stock ``GPT2LMHeadModel`` / ``GPT2ForSequenceClassification`` state
    dict per member (``transformer.`` prefix), the removed heads zero in ``c_attn``'s Q / K / V columns and in
    ``c_proj``'s rows. Loading member m's dict into a stock model reproduces the fused model's
    ``member_logits[:, m]`` (a per-member ``lm_head`` needs a stock config with ``tie_word_embeddings=False``)."""
    base = hydra_config.base_config
    num_layers, H, d, _ = shape_of(base)
    dk = d // H
    kept = hydra_config.kept_heads
    out = []
    for m in range(hydra_config.num_members):
        sd = {"transformer.wte.weight": state["hydra.wte.weight"].clone(),
              "transformer.wpe.weight": state["hydra.wpe.weight"].clone()}
        for i in range(num_layers):
            pre, new = f"hydra.h.{i}.", f"transformer.h.{i}."
            for n in LAYER_NORMS:
                for p in ("weight", "bias"):
                    sd[f"{new}{n}.{p}"] = state[f"{pre}{n}.{p}"][m].clone()
            widths = [len(member[i]) for member in kept]
            lo, w = sum(widths[:m]), widths[m]
            idx = torch.cat([rows(kept[m][i], dk, part * d) for part in range(3)])
            qkv_w, qkv_b = state[f"{pre}attn.qkv_weight"], state[f"{pre}attn.qkv_bias"]
            c_attn = qkv_w.new_zeros(d, 3 * d)
            c_attn[:, idx] = qkv_w[3 * lo * dk : 3 * (lo + w) * dk].T
            c_attn_b = qkv_b.new_zeros(3 * d)
            c_attn_b[idx] = qkv_b[3 * lo * dk : 3 * (lo + w) * dk]
            o = state[f"{pre}attn.o_weight"]
            c_proj = o.new_zeros(d, d)
            c_proj[rows(kept[m][i], dk)] = o[lo * dk : (lo + w) * dk]
            sd[f"{new}attn.c_attn.weight"], sd[f"{new}attn.c_attn.bias"] = c_attn, c_attn_b
            sd[f"{new}attn.c_proj.weight"] = c_proj
            sd[f"{new}attn.c_proj.bias"] = state[f"{pre}attn.o_bias"][m].clone()
            mlp = {k: state[f"{pre}mlp.{k}"] for k in ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")}
            if mlp["fc1_weight"].dim() == 3:  # per member
                mlp = {k: v[m] for k, v in mlp.items()}
            sd[f"{new}mlp.c_fc.weight"] = mlp["fc1_weight"].T.contiguous()
            sd[f"{new}mlp.c_fc.bias"] = mlp["fc1_bias"].clone()
            sd[f"{new}mlp.c_proj.weight"] = mlp["fc2_weight"].T.contiguous()
            sd[f"{new}mlp.c_proj.bias"] = mlp["fc2_bias"].clone()
        for p in ("weight", "bias"):
            sd[f"transformer.ln_f.{p}"] = state[f"hydra.ln_f.{p}"][m].clone()
        if task == "causal_lm":
            head = state.get("lm_head.weight", state["hydra.wte.weight"])
            sd["lm_head.weight"] = (head[m] if head.dim() == 3 else head).clone()
        elif "score.weight" in state:
            sd["score.weight"] = state["score.weight"][m].clone()
        out.append(sd)
    return out


READER = Reader(gpt2_member_from_state_dict, fuse_gpt2, unfuse_gpt2)
