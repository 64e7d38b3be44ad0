"""Architecture-agnostic fusion: per-member layer weights -> one fused Hydra layer, and back.

Every source reader (HF BERT, HF ViT, timm ViT, HF CLIP, open_clip) maps its checkpoint to the same
*canonical layer* dict per member, in ``nn.Linear`` layout (``weight (out, in)``):

    q.weight (H*dk, d)  q.bias   k.weight  k.bias  v.weight  v.bias
    o.weight (d, H*dk)  o.bias (d,)
    norm1.weight (d,) norm1.bias      the attention block's LayerNorm (after it in BERT, before in ViT)
    fc1.weight (I, d) fc1.bias  fc2.weight (d, I) fc2.bias
    norm2.weight norm2.bias           the MLP block's LayerNorm

``fuse_layer`` turns M of these into the parameters of ``HydraSelfAttention``, ``HydraLayerNorm`` x 2
and ``HydraMLP`` (names relative to the layer). Pure functions on tensors: nothing is loaded here.
"""

from __future__ import annotations

import torch

CANONICAL_LAYER_KEYS = (
    "q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias", "o.weight", "o.bias",
    "norm1.weight", "norm1.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "norm2.weight", "norm2.bias",
)
SHARED_POLICIES = ("error", "average", "first")


def describe_keys(keys: list[str]) -> str:
    """The first four of ``keys`` and how many more (tensor names in an error message)."""
    return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def head_rows(heads: list[int], head_dim: int) -> torch.Tensor:
    """Row indices of ``heads`` in a ``(H*dk, d)`` projection: head h owns rows ``[h*dk, (h+1)*dk)``."""
    if not heads:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in heads])


def _bias(layer: dict[str, torch.Tensor], name: str, size: int, like: torch.Tensor) -> torch.Tensor:
    bias = layer.get(f"{name}.bias")
    return torch.zeros(size, dtype=like.dtype) if bias is None else bias


def fuse_layer(
    member_layers: list[dict[str, torch.Tensor]], kept_heads: list[list[int]], head_dim: int, mlp_fusion: str
) -> dict[str, torch.Tensor]:
    """Fuse M canonical layers (one per member) keeping ``kept_heads[m]`` of member m.

    Returns the fused layer's state dict: ``attention.{qkv_weight,qkv_bias,o_weight,o_bias}``,
    ``norm1.{weight,bias}``, ``norm2.{weight,bias}``, ``mlp.{fc1_weight,fc1_bias,fc2_weight,fc2_bias}``.
    With ``mlp_fusion="average"`` the MLP weights are the members' mean; with ``"per_member"`` they
    are stacked along a leading M axis.
    """
    if len(member_layers) != len(kept_heads):
        raise ValueError(f"{len(member_layers)} member layers but {len(kept_heads)} kept-head lists")
    qkv_w, qkv_b, o_w, o_b = [], [], [], []
    for layer, heads in zip(member_layers, kept_heads):
        missing = [k for k in CANONICAL_LAYER_KEYS if k.endswith("weight") and k not in layer]
        if missing:
            raise ValueError(f"member layer is missing {missing}")
        rows = head_rows(heads, head_dim)
        w = layer["q.weight"]
        for name in ("q", "k", "v"):
            qkv_w.append(layer[f"{name}.weight"][rows])  # (k_m*dk, d)
            qkv_b.append(_bias(layer, name, w.shape[0], w)[rows])
        o_w.append(layer["o.weight"][:, rows].T)  # (k_m*dk, d): W_O's kept columns, transposed
        o_b.append(_bias(layer, "o", layer["o.weight"].shape[0], w))
    out = {
        "attention.qkv_weight": torch.cat(qkv_w).contiguous(),
        "attention.qkv_bias": torch.cat(qkv_b).contiguous(),
        "attention.o_weight": torch.cat(o_w).contiguous(),
        "attention.o_bias": torch.stack(o_b),
    }
    for norm in ("norm1", "norm2"):
        out[f"{norm}.weight"] = torch.stack([layer[f"{norm}.weight"] for layer in member_layers])
        out[f"{norm}.bias"] = torch.stack([layer[f"{norm}.bias"] for layer in member_layers])
    for fc in ("fc1", "fc2"):
        weights = torch.stack([layer[f"{fc}.weight"] for layer in member_layers])  # (M, out, in)
        biases = torch.stack(
            [_bias(layer, fc, layer[f"{fc}.weight"].shape[0], layer[f"{fc}.weight"]) for layer in member_layers]
        )
        if mlp_fusion == "average":
            weights, biases = average(weights), average(biases)
        elif mlp_fusion != "per_member":
            raise ValueError(f"mlp_fusion={mlp_fusion!r} is unknown; use 'average' or 'per_member'")
        out[f"mlp.{fc}_weight"], out[f"mlp.{fc}_bias"] = weights.contiguous(), biases.contiguous()
    return out


def unfuse_layer(
    fused: dict[str, torch.Tensor], kept_heads: list[list[int]], num_heads: int, head_dim: int, member: int
) -> dict[str, torch.Tensor]:
    """Inverse of ``fuse_layer`` for one member: its canonical layer with removed heads zeroed.

    Removed heads get zero Q/K/V rows and zero W_O columns, so a stock model loading these weights
    computes exactly member ``member`` (with the averaged MLP when the MLP was averaged).
    """
    M = len(kept_heads)
    widths = [len(h) for h in kept_heads]
    d = fused["attention.o_bias"].shape[-1]
    dk = head_dim
    start = sum(widths[:member])
    qkv_w = fused["attention.qkv_weight"][3 * dk * start : 3 * dk * (start + widths[member])]
    qkv_b = fused["attention.qkv_bias"][3 * dk * start : 3 * dk * (start + widths[member])]
    o_w = fused["attention.o_weight"][dk * start : dk * (start + widths[member])]
    rows = head_rows(kept_heads[member], dk)
    out: dict[str, torch.Tensor] = {}
    n = widths[member] * dk
    for i, name in enumerate(("q", "k", "v")):
        weight = torch.zeros(num_heads * dk, d, dtype=qkv_w.dtype)
        bias = torch.zeros(num_heads * dk, dtype=qkv_w.dtype)
        weight[rows] = qkv_w[i * n : (i + 1) * n]
        bias[rows] = qkv_b[i * n : (i + 1) * n]
        out[f"{name}.weight"], out[f"{name}.bias"] = weight, bias
    o_full = torch.zeros(d, num_heads * dk, dtype=o_w.dtype)
    o_full[:, rows] = o_w.T
    out["o.weight"], out["o.bias"] = o_full, fused["attention.o_bias"][member].clone()
    for norm in ("norm1", "norm2"):
        out[f"{norm}.weight"] = fused[f"{norm}.weight"][member].clone()
        out[f"{norm}.bias"] = fused[f"{norm}.bias"][member].clone()
    per_member = fused["mlp.fc1_weight"].dim() == 3
    for fc in ("fc1", "fc2"):
        w, b = fused[f"mlp.{fc}_weight"], fused[f"mlp.{fc}_bias"]
        out[f"{fc}.weight"] = (w[member] if per_member else w).clone()
        out[f"{fc}.bias"] = (b[member] if per_member else b).clone()
    if M != len(widths):  # pragma: no cover - defensive
        raise ValueError("kept_heads does not match the fused layer")
    return out


def unfuse_member_layers(
    state: dict[str, torch.Tensor], prefix: str, kept_heads: list[list[list[int]]], num_heads: int,
    head_dim: int, member: int,
) -> list[dict[str, torch.Tensor]]:
    """Every layer of ``member`` in canonical form, from a fused state dict whose layer ``i`` lives
    under ``f"{prefix}{i}."`` (``kept_heads[m][l]`` as in the config; one entry per layer)."""
    layers = []
    for i in range(len(kept_heads[0])):
        pre = f"{prefix}{i}."
        fused = {k[len(pre):]: v for k, v in state.items() if k.startswith(pre)}
        layers.append(unfuse_layer(fused, [kh[i] for kh in kept_heads], num_heads, head_dim, member))
    return layers

def average(tensors: torch.Tensor) -> torch.Tensor:
    """Mean over the leading member axis, computed in float64 and cast back."""
    return tensors.double().mean(dim=0).to(tensors.dtype)


def shared_tensor(name: str, tensors: list[torch.Tensor], policy: str = "error", atol: float = 0.0) -> torch.Tensor:
    """One tensor for a part that all members share (e.g. the embeddings).

    ``policy="error"``: the members must agree (within ``atol``), else ``ValueError`` with the largest
    difference and the fix; ``"average"``: their mean; ``"first"``: the first member's.
    """
    if policy not in SHARED_POLICIES:
        raise ValueError(f"shared-weights policy {policy!r} is unknown; use one of {list(SHARED_POLICIES)}")
    first = tensors[0]
    for i, t in enumerate(tensors[1:], start=1):
        if t.shape != first.shape:
            raise ValueError(f"{name}: member {i} has shape {tuple(t.shape)}, member 0 has {tuple(first.shape)}")
    if policy == "first" or len(tensors) == 1 or all(t is first for t in tensors[1:]):
        return first  # (the last: one base checkpoint passed once per member, nothing to compare)
    if policy == "average":
        return average(torch.stack(tensors))
    worst = max(float((t.double() - first.double()).abs().max()) for t in tensors[1:]) if first.numel() else 0.0
    if worst > atol:
        raise ValueError(
            f"{name} differs between members (max abs difference {worst:.3g}) but a Hydra Ensemble shares it; "
            "fine-tune members with it frozen, or pass shared='average' (--shared-weights average) to average it"
        )
    return first
