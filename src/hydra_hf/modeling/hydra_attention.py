# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""The fused self-attention of M pruned members, one for every family, encoders and decoders.

:class:`HydraSelfAttention` runs all members' kept heads in one attention call through
``config._attn_implementation`` (``ALL_ATTENTION_FUNCTIONS``; eager: :func:`eager_attention_forward`), with
what a family needs switched on by its arguments: a causal mask (``is_causal``), rotary position embeddings
(``position_embeddings``), a key/value cache (``cache`` and ``layer_idx``), grouped-query attention (a
member keeps the key/value heads its kept query heads read). Its Q/K/V weights are packed per member
(``qkv_weight``); :class:`HydraGroupedQueryAttention` stores them as Llama-style decoders do (``q_weight``,
``k_weight``, ``v_weight``: fewer key/value heads than query heads) and shares everything else.

Notation: M members, B batch, T tokens (S keys with a cache), d hidden size, dk head size, k_m heads kept by
member m in this layer, K = sum_m k_m (KV: the key/value heads, as many as K without grouped-query attention).

Folded path: when every member keeps the same number of heads (and key/value heads), the attention call sees
the members folded into its batch axis, ``(M*B, k, T, dk)``: a free view of the batched projections, whose
output is a free view for the batched output projection. Eager attention (the reference, and the one that
returns the weights ``(B, K, T, S)``) and a decoding step that reads a key/value cache (which keeps every
member's key/value heads side by side, ``(B, KV, S, dk)``, so that beam search reorders its batch axis) run
over all kept heads in member order, ``(B, K, T, dk)``; the first tokens written into a cache are folded.

The reference for every fused computation is the stock model with member m's removed heads zeroed in W_O
(their block of output-projection columns); ``tests/`` compare the two numerically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import is_tracing


def grouped_linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """M independent affine maps: ``out[m] = bias[m] + x[m] @ weight_t[m]`` (no bias: ``x[m] @ weight_t[m]``).

    Shape: ``x (M, N, in)``, ``weight_t (M, in, out)`` (may be a transposed view), ``bias (M, out)``
    -> ``(M, N, out)``. On accelerators one batched kernel (``baddbmm``). On CPU, in inference, one
    GEMM per member into a single output buffer: measured 10-25 % faster than ``baddbmm`` on a 2-core
    machine, where the batched kernel splits its M items unevenly over the threads while each
    member's GEMM uses every thread. Same arithmetic, same output layout. While traced (torch.export,
    ONNX export, torch.compile) the per-member GEMMs are stacked instead: writes into a shared buffer
    become scatter operators in a functional graph (20 % of an exported ViT's time in ONNX Runtime).
    """
    if bias is None:
        return torch.bmm(x, weight_t)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight_t.requires_grad or bias.requires_grad)
    # under autocast (mixed precision) the batched kernel is cast like any matrix product; the out=
    # GEMMs below are not
    if x.device.type != "cpu" or needs_grad or torch.is_autocast_enabled("cpu"):
        return torch.baddbmm(bias.unsqueeze(1), x, weight_t)
    if is_tracing(x):
        return torch.stack([torch.addmm(bias[m], x[m], weight_t[m]) for m in range(x.shape[0])])  # (M, N, out)
    out = x.new_empty(x.shape[0], x.shape[1], weight_t.shape[-1])
    for m in range(x.shape[0]):
        torch.addmm(bias[m], x[m], weight_t[m], out=out[m])
    return out


@dataclass(frozen=True)
class HydraLayerSpec:
    """Everything one fused transformer layer needs: the base layer's sizes and the members' heads.

    ``kept_heads[m]`` = sorted head indices member m keeps in this layer (may be empty).
    ``kept_neurons[m]`` = sorted MLP intermediate neurons member m keeps in this layer (slim members: may be
    empty), or None for every member keeping the whole MLP (the paper's members).
    ``head_size``: the base's head size where it is not ``hidden_size // num_heads`` (Qwen3's ``head_dim``).
    """

    hidden_size: int
    num_heads: int
    kept_heads: tuple[tuple[int, ...], ...]
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    attention_dropout: float
    hidden_dropout: float
    mlp_fusion: str
    kept_neurons: tuple[tuple[int, ...], ...] | None = None
    head_size: int | None = None

    @property
    def num_members(self) -> int:
        return len(self.kept_heads)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def widths(self) -> tuple[int, ...]:
        """Heads kept per member, ``(k_1, ..., k_M)``."""
        return tuple(len(h) for h in self.kept_heads)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention over all members' kept heads at once.

    Shape:
        query: ``(B, K, T, dk)``; key, value: ``(B, K, S, dk)``; attention_mask: additive, broadcastable to
        ``(B, K, T, S)``. Returns the context ``(B, T, K, dk)`` and the attention weights ``(B, K, T, S)``.
    """
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, K, T, S)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1)
    weights = F.dropout(weights, p=dropout, training=module.training)
    context = torch.matmul(weights, value)  # (B, K, T, dk)
    return context.transpose(1, 2).contiguous(), weights


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (rotary position embeddings)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, upcast: bool = False) -> torch.Tensor:
    """Rotary position embeddings on ``x (N, heads, T, dk)`` with ``cos`` / ``sin`` ``(N or 1, 1, T, dk)``, as
    transformers' Llama (in ``x``'s dtype) or, ``upcast``, its ModernBERT (in float32, cast back)."""
    if upcast:
        return (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)
    return x * cos + rotate_half(x) * sin


def rms_norm_heads(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of every head's vector, ``x (..., dk)``, scaled by ``weight`` (broadcast to ``x``), as
    transformers' ``LlamaRMSNorm`` (normalised in float32, scaled after casting back): Qwen3's q/k norms."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class HydraSelfAttention(nn.Module):
    """Self-attention of M pruned members computed jointly.

    Member m projects its own residual stream with the Q, K, V rows of its kept heads only (grouped
    projections), attention runs over all members' kept heads in one call (heads never mix: each
    head has its own Q, K, V), and member m's output projection uses the W_O columns of its kept
    heads plus its own output bias. When all members keep ``k`` heads the projections are single batched
    products (``baddbmm`` over M) and, on the folded path (see the module doc), the attention call sees the
    members folded into its batch axis, ``(M*B, k, T, dk)``; otherwise one product per member (never one per
    head, and never padded to equal widths, which would waste multiply-adds).

    Parameters (member-major packing, member m owns rows ``[3*dk*o_m, 3*dk*(o_m+k_m))`` of
    ``qkv_weight`` with ``o_m = k_1 + ... + k_{m-1}``, as [its Q rows; its K rows; its V rows]):
        qkv_weight ``(3*K*dk, d)``, qkv_bias ``(3*K*dk,)``,
        o_weight ``(K*dk, d)`` = member blocks of ``W_O[:, kept columns].T`` stacked,
        o_bias ``(M, d)`` (None in a subclass whose base has no output bias).

    Args:
        config: the Hydra config (``_attn_implementation`` picks the attention function).
        spec: the layer's sizes and the members' kept heads.
        is_causal: a causal mask (decoders, CLIP's text tower) when the caller passes none.
        layer_idx: this layer's entry in a key/value cache (decoders).
        kept_kv_heads: ``kept_kv_heads[m]`` the key/value heads member m keeps (grouped-query attention: query
            head ``h`` reads key/value head ``h // (H / H_kv)``); None: every query head has its own.
        num_key_value_heads: ``H_kv`` of the base, with ``kept_kv_heads``.

    Eager attention never folds the members into the batch axis: its weights ``(B, K, T, S)`` over all kept
    heads in member order are the very tensor the context is computed from (``retain_grad()`` on them
    receives gradients).
    """

    packed_qkv = True  # the parameters above; False: the subclass makes its own projections
    rotary_in_float32 = False  # rotary position embeddings in float32 (ModernBERT), else in the inputs' dtype

    def __init__(
        self, config, spec: HydraLayerSpec, is_causal: bool = False, layer_idx: int | None = None,
        kept_kv_heads: tuple[tuple[int, ...], ...] | None = None, num_key_value_heads: int | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.spec = spec
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.num_members = M = spec.num_members
        self.head_dim = spec.head_dim
        self.widths = spec.widths
        self.total_heads = sum(self.widths)
        self.offsets = [sum(self.widths[:m]) for m in range(M)]
        self.kept_kv = spec.kept_heads if kept_kv_heads is None else tuple(tuple(k) for k in kept_kv_heads)
        self.kv_widths = tuple(len(k) for k in self.kept_kv)
        self.kv_offsets = [sum(self.kv_widths[:m]) for m in range(M)]
        # grouped-query attention: which of member m's kept key/value heads each of its kept query heads reads
        # (plain lists, not buffers: from_pretrained builds modules on the meta device and would leave
        # non-persistent buffers unset; index tensors are made on the inputs' device)
        group = spec.num_heads // (num_key_value_heads or spec.num_heads)
        self.kv_local = [[self.kept_kv[m].index(h // group) for h in spec.kept_heads[m]] for m in range(M)]
        self.kv_index = [self.kv_offsets[m] + i for m in range(M) for i in self.kv_local[m]]
        self.expands_kv = self.kv_index != list(range(self.total_heads))
        self.num_key_value_groups = 1  # for transformers' SDPA: the key/value heads are expanded here
        self.uniform = self.total_heads > 0 and len(set(self.widths)) == 1 and len(set(self.kv_widths)) == 1
        self.scaling = self.head_dim**-0.5
        self.dropout = spec.attention_dropout
        if self.packed_qkv:
            d, kd = spec.hidden_size, self.total_heads * self.head_dim
            self.qkv_weight = nn.Parameter(torch.empty(3 * kd, d))
            self.qkv_bias = nn.Parameter(torch.empty(3 * kd))
            self.o_weight = nn.Parameter(torch.empty(kd, d))
            self.o_bias = nn.Parameter(torch.empty(M, d))

    # -------------------------------------------------------------------------------- helpers
    def folds_members(self) -> bool:
        """Whether this call may fold the members into the batch axis: equal widths, and not eager attention
        (whose weights are returned over all kept heads, ``(B, K, T, T)``). ``forward`` also needs no cache."""
        return self.uniform and self.config._attn_implementation != "eager"

    def _member_rows(self, m: int, per_head: int) -> slice:
        size = per_head * self.head_dim
        return slice(size * self.offsets[m], size * (self.offsets[m] + self.widths[m]))

    def project(self, hidden: torch.Tensor, folded: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Grouped Q, K, V projections of ``qkv_weight``.

        Returns query, key, value, each ``(M*B, k, T, dk)`` when every member keeps ``k`` heads and ``folded``
        (members folded into the batch axis: a free view of the batched product, no copy), else
        ``(B, K, T, dk)`` with the heads in member order.
        """
        M, dk, K = self.num_members, self.head_dim, self.total_heads
        shared = hidden.dim() == 3  # the same input for every member (the first layer)
        B, T = hidden.shape[-3], hidden.shape[-2]
        if self.uniform:
            k = K // M
            if shared:  # one product for all members
                qkv = F.linear(hidden, self.qkv_weight, self.qkv_bias)  # (B, T, M*3*k*dk)
                qkv = qkv.view(B, T, M, 3, k, dk).permute(3, 2, 0, 4, 1, 5)  # (3, M, B, k, T, dk)
            else:
                d = hidden.shape[-1]
                x = hidden.reshape(M, B * T, d)  # (M, BT, d)
                w = self.qkv_weight.view(M, 3 * k * dk, d)  # (M, 3k*dk, d)
                qkv = grouped_linear(x, w.transpose(1, 2), self.qkv_bias.view(M, 3 * k * dk))  # (M, BT, 3k*dk)
                qkv = qkv.view(M, B, T, 3, k, dk).permute(3, 0, 1, 4, 2, 5)  # (3, M, B, k, T, dk), strided view
            if folded:
                return qkv.reshape(3, M * B, k, T, dk).unbind(
                    0
                )  # after the grouped product, merging M and B is a view
            return qkv.transpose(1, 2).reshape(3, B, K, T, dk).unbind(0)  # heads in member order
        if shared:
            qkv = F.linear(hidden, self.qkv_weight, self.qkv_bias)  # (B, T, 3*K*dk): one product for all members
            chunks = qkv.split([3 * w * dk for w in self.widths], dim=-1)  # per member (B, T, 3*k_m*dk)
        else:
            chunks = []
            for m in range(M):
                rows = self._member_rows(m, 3)
                chunks.append(F.linear(hidden[m], self.qkv_weight[rows], self.qkv_bias[rows]))  # (B, T, 3*k_m*dk)
        parts = [
            c.view(B, T, 3, w, dk).permute(2, 0, 3, 1, 4)  # (3, B, k_m, T, dk)
            for c, w in zip(chunks, self.widths)
            if w > 0
        ]
        return torch.cat(parts, dim=2).unbind(0)  # (3, B, K, T, dk)

    def rotate(
        self, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, folded: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary position embeddings, ``cos`` / ``sin`` ``(B or 1, T, dk)``, on every kept head's queries and keys."""
        if folded and cos.shape[0] > 1:  # members folded into the batch axis, member-major
            cos, sin = cos.repeat(self.num_members, 1, 1), sin.repeat(self.num_members, 1, 1)  # (M*B, T, dk)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
        upcast = self.rotary_in_float32
        return apply_rotary(query, cos, sin, upcast), apply_rotary(key, cos, sin, upcast)

    def expand_kv(self, key: torch.Tensor, value: torch.Tensor, folded: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Grouped-query attention: one key/value head per kept query head (``(B, KV, S, dk)`` -> ``(B, K, S, dk)``,
        folded ``(M*B, kv, S, dk)`` -> ``(M*B, k, S, dk)``); as they are without grouped-query attention."""
        if not self.expands_kv:
            return key, value
        if not folded:
            index = torch.tensor(self.kv_index, dtype=torch.long, device=key.device)
            return key.index_select(1, index), value.index_select(1, index)
        M, k = self.num_members, self.total_heads // self.num_members
        if all(local == self.kv_local[0] for local in self.kv_local):  # the same heads in every member
            index = torch.tensor(self.kv_local[0], dtype=torch.long, device=key.device)
            return key.index_select(1, index), value.index_select(1, index)
        index = torch.tensor(self.kv_local, dtype=torch.long, device=key.device)  # (M, k)
        out = []
        for x in (key, value):
            x = x.view(M, -1, *x.shape[1:])  # (M, B, kv, S, dk)
            expanded = index.view(M, 1, k, 1, 1).expand(M, x.shape[1], k, x.shape[3], x.shape[4])
            out.append(x.gather(2, expanded).flatten(0, 1))  # (M*B, k, S, dk)
        return out[0], out[1]

    def unfold(self, x: torch.Tensor) -> torch.Tensor:
        """Folded heads ``(M*B, w, T, dk)`` -> ``(B, M*w, T, dk)``, every member's heads in member order (a copy)."""
        M = self.num_members
        return x.view(M, -1, *x.shape[1:]).transpose(0, 1).flatten(1, 2)

    def _output_bias(self, batch: int, length: int, like: torch.Tensor) -> torch.Tensor:
        """The attention block's output where a member keeps no head: its output bias (or zeros), ``(M, B, T, d)``."""
        d = self.o_weight.shape[-1]
        if self.o_bias is None:
            return like.new_zeros(self.num_members, batch, length, d)
        return self.o_bias[:, None, None, :].expand(self.num_members, batch, length, d)

    def _project_out(self, context: torch.Tensor, batch: int, folded: bool = True) -> torch.Tensor:
        """Grouped output projection. ``context`` is ``(M*B, T, k, dk)`` (equal widths, ``folded``) or
        ``(B, T, K, dk)``. Returns ``(M, B, T, d)``."""
        M, dk = self.num_members, self.head_dim
        d = self.o_weight.shape[-1]
        T = context.shape[1]
        if self.uniform and folded:
            k = self.total_heads // M
            x = context.reshape(M, batch * T, k * dk)  # a view of the attention output
            out = grouped_linear(x, self.o_weight.view(M, k * dk, d), self.o_bias)  # (M, BT, d)
            return out.view(M, batch, T, d)
        outs = []
        for m in range(M):
            if self.widths[m] == 0:  # no head left: the attention block adds only its output bias
                outs.append(self._output_bias(batch, T, context)[m])
                continue
            lo = self.offsets[m]
            x = context[:, :, lo : lo + self.widths[m]].reshape(batch * T, self.widths[m] * dk)  # (BT, k_m*dk)
            rows = self.o_weight[self._member_rows(m, 1)]  # (k_m*dk, d)
            out = x @ rows if self.o_bias is None else torch.addmm(self.o_bias[m], x, rows)
            outs.append(out.view(batch, T, d))
        return torch.stack(outs)  # (M, B, T, d)

    def fold_mask(self, attention_mask: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """The additive (or boolean) mask in the layout of the attention call.

        ``attention_mask`` is 4-D and broadcasts to ``(B, K, T, S)``: ``(1 or B, 1, 1 or T, S)`` (the same for
        every head) or ``(1 or B, K, T, S)`` (one per kept head in member order, e.g. BEiT's relative position
        bias). When every member keeps ``k`` heads the attention runs over ``(M*B, k, T, S)`` (member-major
        batch), so a mask that depends on the batch or on the head is laid out that way.
        """
        if attention_mask is None or not self.uniform:
            return attention_mask
        b, h = attention_mask.shape[0], attention_mask.shape[1]
        if b == 1 and h == 1:  # the same for every member, sample and head: broadcasts as it is
            return attention_mask
        M, k = self.num_members, self.total_heads // self.num_members
        rows, cols = attention_mask.shape[2], attention_mask.shape[3]
        per_head = h != 1
        mask = attention_mask.reshape(b, M if per_head else 1, k if per_head else 1, rows, cols).transpose(0, 1)
        mask = mask.expand(M, batch, mask.shape[2], rows, cols)  # (M, B, k or 1, T, S)
        return mask.reshape(M * batch, mask.shape[2], rows, cols)

    # -------------------------------------------------------------------------------- forward
    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, output_attentions: bool = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, cache: Cache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """
        Args:
            hidden: ``(M, B, T, d)`` member streams, or ``(B, T, d)`` when all members share the input.
            attention_mask: additive (or, from transformers' mask functions, boolean) mask broadcastable to
                ``(B, K, T, S)`` (see ``fold_mask``), or None (with ``is_causal``: causal).
            output_attentions: passed to the attention function, as in transformers' models (sdpa warns
                that it returns no weights).
            position_embeddings: rotary ``(cos, sin)``, each ``(B or 1, T, dk)``, or None.
            cache: the shared key/value cache (entry ``layer_idx`` holds ``(B, KV, S, dk)``: every member's
                kept key/value heads in member order), or None.
        Returns:
            the attention block's output per member ``(M, B, T, d)`` (before dropout and residual), and
            the attention weights ``(B, K, T, S)`` over all kept heads in member order (eager only; None
            with the other implementations).
        """
        B, T = hidden.shape[-3], hidden.shape[-2]
        eager = self.config._attn_implementation == "eager"
        if self.total_heads == 0:  # every member removed every head of this layer: only the output bias
            S = T
            if cache is not None:  # the cache still counts this layer's tokens
                empty = hidden.new_zeros(B, 0, T, self.head_dim)
                S = cache.update(empty, empty, self.layer_idx)[0].shape[-2]
            return self._output_bias(B, T, hidden), (hidden.new_zeros(B, 0, T, S) if eager else None)
        # the members fold into the batch axis unless the cache holds earlier tokens (it keeps every member's
        # key/value heads side by side, (B, KV, S, dk): a decoding step attends over them in that layout)
        folded = self.folds_members() and (cache is None or cache.get_seq_length(self.layer_idx) == 0)
        query, key, value = self.project(hidden, folded)  # (M*B, k, T, dk) or (B, K, T, dk); key, value: KV heads
        if position_embeddings is not None:
            query, key = self.rotate(query, key, *position_embeddings, folded)
        if cache is not None and folded:  # the first tokens: stored in member order, attended to folded
            keys, values = cache.update(self.unfold(key), self.unfold(value), self.layer_idx)  # (B, KV, S, dk)
            if keys.shape[-2] != key.shape[-2]:  # a cache of fixed length (static): attend over all of it
                folded, query, key, value = False, self.unfold(query), keys, values
        elif cache is not None:
            key, value = cache.update(key, value, self.layer_idx)  # (B, KV, S, dk)
        key, value = self.expand_kv(key, value, folded)  # one key/value head per query head
        if folded:
            attention_mask = self.fold_mask(attention_mask, B)
        context, weights = self.attend(
            query, key, value, attention_mask, B, folded, is_causal=self.is_causal and attention_mask is None,
            output_attentions=output_attentions,
        )  # context (M*B, T, k, dk) or (B, T, K, dk)
        return self._project_out(context, B, folded), weights

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
        batch: int, folded: bool, is_causal: bool = False, **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention call of ``config._attn_implementation`` (eager: ``eager_attention_forward``) over
        the projected ``query`` (``(M*B, k, T, dk)`` when ``folded``, else ``(B, K, T, dk)``), ``key`` and
        ``value`` (one per query head, ``S`` keys) and the mask in the same layout (or None); ``kwargs`` go to
        the attention function (``output_attentions``).

        Returns the context ``(M*B, T, k, dk)`` or ``(B, T, K, dk)`` and the weights ``(B, K, T, S)`` over all
        kept heads in member order (None where the implementation returns none).
        """
        attention_interface: Callable = eager_attention_forward
        if self.config._attn_implementation != "eager":
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
        context, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            is_causal=is_causal,
            **kwargs,
        )
        if weights is not None and folded:  # another implementation's weights: report (B, K, T, S) (a copy)
            M, T, S = self.num_members, query.shape[-2], key.shape[-2]
            k = self.total_heads // M
            weights = weights.view(M, batch, k, T, S).transpose(0, 1).reshape(batch, self.total_heads, T, S)
        return context, weights


class HydraGroupedQueryAttention(HydraSelfAttention):
    """``HydraSelfAttention`` with the projections of a Llama-style decoder (Llama, Mistral, Qwen2, Qwen3):
    separate Q, K, V weights, since with grouped-query attention a member keeps fewer key/value heads than
    query heads (a key/value head stays while any of its query heads is kept).

    Parameters (member-major: member m's rows follow member m-1's):
        q_weight ``(K*dk, d)``: the Q rows of every member's kept query heads; k_weight, v_weight
        ``(KV*dk, d)``: the K / V rows of every member's kept key/value heads; o_weight ``(K*dk, d)``: member
        blocks of ``W_O[:, kept columns].T``; q_bias / k_bias / v_bias (``qkv_bias``: the base's
        ``attention_bias``, or Qwen2's Q/K/V biases), o_bias ``(M, d)`` (``o_bias``: the base's
        ``attention_bias``); q_norm / k_norm ``(M, dk)`` (``qk_norm_eps``: Qwen3's per-head RMSNorm of
        queries and keys, every member its own).
    """

    packed_qkv = False

    def __init__(
        self, config, spec: HydraLayerSpec, layer_idx: int, kept_kv_heads: tuple[tuple[int, ...], ...],
        num_key_value_heads: int, *, qkv_bias: bool, o_bias: bool, qk_norm_eps: float | None = None,
    ) -> None:
        super().__init__(config, spec, is_causal=True, layer_idx=layer_idx, kept_kv_heads=kept_kv_heads,
                         num_key_value_heads=num_key_value_heads)
        M, d, dk = self.num_members, spec.hidden_size, self.head_dim
        K, KV = self.total_heads, sum(self.kv_widths)
        self.q_weight = nn.Parameter(torch.empty(K * dk, d))
        self.k_weight = nn.Parameter(torch.empty(KV * dk, d))
        self.v_weight = nn.Parameter(torch.empty(KV * dk, d))
        self.o_weight = nn.Parameter(torch.empty(K * dk, d))
        self.q_bias = nn.Parameter(torch.empty(K * dk)) if qkv_bias else None
        self.k_bias = nn.Parameter(torch.empty(KV * dk)) if qkv_bias else None
        self.v_bias = nn.Parameter(torch.empty(KV * dk)) if qkv_bias else None
        self.o_bias = nn.Parameter(torch.empty(M, d)) if o_bias else None
        self.norm_eps = qk_norm_eps
        self.q_norm = nn.Parameter(torch.ones(M, dk)) if qk_norm_eps is not None else None
        self.k_norm = nn.Parameter(torch.ones(M, dk)) if qk_norm_eps is not None else None

    def _heads(
        self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, widths, offsets, folded: bool
    ) -> torch.Tensor:
        """Member m's rows of ``weight`` (its ``widths[m]`` heads) on its stream ``hidden[m] (B, T, d)`` ->
        ``(M*B, w, T, dk)`` (equal widths w, ``folded``) or ``(B, sum widths, T, dk)`` in member order."""
        M, B, T, d = hidden.shape
        dk = self.head_dim
        if self.uniform:
            w = widths[0]
            x = hidden.reshape(M, B * T, d)  # (M, BT, d)
            bias = None if bias is None else bias.view(M, w * dk)
            out = grouped_linear(x, weight.view(M, w * dk, d).transpose(1, 2), bias)  # (M, BT, w*dk)
            out = out.view(M, B, T, w, dk).permute(0, 1, 3, 2, 4)  # (M, B, w, T, dk), a strided view
            if folded:
                return out.reshape(M * B, w, T, dk)  # merging M and B is a view
            return out.transpose(0, 1).reshape(B, M * w, T, dk)  # heads in member order
        parts = []
        for m, (w, o) in enumerate(zip(widths, offsets)):
            if w == 0:
                continue
            rows = slice(o * dk, (o + w) * dk)
            out = F.linear(hidden[m], weight[rows], None if bias is None else bias[rows])  # (B, T, w*dk)
            parts.append(out.view(B, T, w, dk).transpose(1, 2))
        if not parts:
            return hidden.new_zeros(B, 0, T, dk)
        return torch.cat(parts, dim=1)

    def _norm_heads(self, x: torch.Tensor, weight: torch.Tensor, widths, folded: bool) -> torch.Tensor:
        """Every member's own per-head RMSNorm (``weight (M, dk)``) of ``x`` in the layout ``_heads`` returns."""
        if folded:
            M = self.num_members
            per_member = x.view(M, -1, *x.shape[1:])  # (M, B, w, T, dk)
            return rms_norm_heads(per_member, weight[:, None, None, None, :], self.norm_eps).flatten(0, 1)
        member = torch.tensor([m for m, w in enumerate(widths) for _ in range(w)], dtype=torch.long, device=x.device)
        return rms_norm_heads(x, weight[member][None, :, None, :], self.norm_eps)

    def project(self, hidden: torch.Tensor, folded: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query ``(M*B, k, T, dk)`` / ``(B, K, T, dk)``, key and value ``(M*B, kv, T, dk)`` / ``(B, KV, T, dk)``
        (each member's kept key/value heads), Qwen3's q/k norms applied."""
        query = self._heads(hidden, self.q_weight, self.q_bias, self.widths, self.offsets, folded)
        key = self._heads(hidden, self.k_weight, self.k_bias, self.kv_widths, self.kv_offsets, folded)
        value = self._heads(hidden, self.v_weight, self.v_bias, self.kv_widths, self.kv_offsets, folded)
        if self.q_norm is not None:
            query = self._norm_heads(query, self.q_norm, self.widths, folded)
            key = self._norm_heads(key, self.k_norm, self.kv_widths, folded)
        return query, key, value
