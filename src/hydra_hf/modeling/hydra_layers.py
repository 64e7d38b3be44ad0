# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library,
# torch, transformers and sibling files.
"""Fused building blocks of a Hydra Ensemble, shared by every architecture.

The fused layers (LayerNorms, MLPs, member-wise linear maps, the post-LN and pre-LN layers, the
per-member classification head), the ensemble's outputs and the pre-trained base class. The fused
attention is in ``hydra_attention.py``; the encoder, classifier and tower *skeletons* built from these
layers, which the family modeling files subclass, are in ``hydra_skeletons.py`` (this file does not import it).

Notation: M members, B batch, T tokens, d hidden size, H heads of the base, dk = d // H head size,
k_m heads kept by member m in this layer, K = sum_m k_m.

Inside the model the residual streams are stored member-major, ``(M, B, T, d)``, so that member m's
stream ``hidden[m]`` is contiguous and the grouped projections are batched matrix products over M
without copies. The models transpose to the public ``(B, M, T, d)`` layout of the ``member_`` outputs;
the standard outputs (``last_hidden_state (B, T, d)``, ...) are the members' mean.

The reference for every fused computation is the stock model with member m's removed heads zeroed in
W_O (their block of output-projection columns); see ``tests/`` for the numerical comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import ModelOutput, is_tracing

from .hydra_attention import (  # noqa: F401  the attention's names, also this module's (older siblings import them here)
    HydraGroupedQueryAttention,
    HydraLayerSpec,
    HydraSelfAttention,
    eager_attention_forward,
    grouped_linear,
)
from .hydra_formulas import ensemble_log_probs, ensemble_sigmoid_logits


@dataclass
class HydraModelOutput(ModelOutput):
    """Output of a fused encoder (every Hydra family).

    The standard fields have the shapes transformers' models give them, so that every client reading them
    (pipelines, sentence-transformers, generation) sees one model: the ensemble's value of a member-wise
    output is the members' mean. Every member's own stream is in the ``member_`` fields.

    Args:
        last_hidden_state: ``(B, T, d)`` the members' mean of ``member_last_hidden_state``.
        pooler_output: ``(B, d)`` the members' mean of ``member_pooler_output`` (None where the stock model
            has no pooler, e.g. ViT, DeBERTa-v2, ModernBERT).
        hidden_states: per layer (embeddings first) ``(B, T, d)``, with ``output_hidden_states``:
            ``hidden_states[0]`` is the shared embeddings, the tensor every member reads (``retain_grad()`` on
            it receives the sum of the members' gradients); ``hidden_states[l]`` for ``l >= 1`` is the members'
            mean of ``member_hidden_states[l]``, computed for the output only (the members do not read it).
            ``hidden_states[-1]`` is ``last_hidden_state`` where transformers' model ties them (ModernBERT and
            the decoders, after the final norm); the ViT-like and CLIP/SigLIP towers return the last layer's
            output before their final LayerNorm, as transformers' do.
        attentions: per layer ``(B, K_l, T, T)`` over the K_l heads all members keep in layer l, with
            ``output_attentions`` and eager attention: the member axis is folded into the head axis, member
            0's kept heads first (ascending), then member 1's, ... (``kept_heads[m][l]`` says which); a layer
            where no member keeps a head has ``K_l = 0``. They are the softmax weights the layer multiplies
            the values with (``retain_grad()`` works). transformers' models have ``H`` heads here instead.
        member_last_hidden_state: ``(B, M, T, d)`` every member's final hidden states (after the final
            LayerNorm for ViT and CLIP's text tower; before it for CLIP's vision tower, as in transformers' CLIP).
        member_pooler_output: ``(B, M, d)`` every member's pooled output (BERT pooler, CLIP towers; None for ViT).
        member_hidden_states: per layer (embeddings first) ``(B, M, T, d)``, with
            ``output_member_hidden_states=True`` (a Hydra flag: ``output_hidden_states`` adds only the standard
            ``hidden_states``, as transformers' contract has it): ``member_hidden_states[l][:, m]`` is member m's
            stream. ``member_hidden_states[0]`` is the shared
            embeddings expanded over the members (a stride-0 view); ``member_hidden_states[l]`` for ``l >= 1``
            is layer l's output. Each is a view of the tensor the next computation reads, so ``retain_grad()``
            on it receives member m's gradient in slot ``[:, m]``.
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    member_last_hidden_state: torch.Tensor | None = None
    member_pooler_output: torch.Tensor | None = None
    member_hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class HydraClassifierOutput(ModelOutput):
    """Output of a fused classifier (text or image).

    Args:
        loss: mean over members of each member's loss, when ``labels`` are given.
        logits: ``(B, C)`` log of the mean of the members' softmaxes (ensemble prediction).
        member_logits: ``(B, M, C)`` every member's own logits.
        hidden_states, attentions, member_hidden_states: as in ``HydraModelOutput`` (``hidden_states[l]``
            ``(B, T, d)``, the members' mean, with ``output_hidden_states``; ``member_hidden_states[l]``
            ``(B, M, T, d)``, with ``output_member_hidden_states``).
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    member_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    member_hidden_states: tuple[torch.Tensor, ...] | None = None


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; on CPU in inference, an input of 2 or 3 rows is padded to 4 rows.

    The CPU GEMM takes one matrix-vector pass per row below 4 rows, so 3 rows cost 3 times one row while 4
    rows cost about 2 (measured, 2 threads: a ``(r, 512) x (512, 32000)`` product 6.4 / 13.6 / 21.2 / 12.0 ms
    for r = 1 / 2 / 3 / 4). A fused decoder's decoding step with M = 3 members at batch 1 sends exactly 3 rows
    through the shared MLP and language-model head (``bench/bench_decoder.py``). The real rows' values are
    unchanged up to float rounding (the GEMM sums in another order: relative differences ~2e-7).
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if 2 <= rows <= 3 and x.device.type == "cpu" and not torch.is_grad_enabled() and not is_tracing(x):
        flat = x.reshape(rows, x.shape[-1])
        padded = torch.cat([flat, flat.new_zeros(4 - rows, flat.shape[-1])])
        return F.linear(padded, weight, bias)[:rows].view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


class HydraLayerNorm(nn.Module):
    """One LayerNorm per member over the last dimension: ``weight``/``bias`` of shape ``(M, d)``.

    Input ``(M, ..., d)``, or ``(..., d)`` shared by all members (then the output gains the M axis).
    """

    def __init__(self, num_members: int, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_members, hidden_size))
        self.bias = nn.Parameter(torch.zeros(num_members, hidden_size))

    def forward(self, x: torch.Tensor, shared: bool = False) -> torch.Tensor:
        d = x.shape[-1]
        x = F.layer_norm(x, (d,), eps=self.eps)
        extra = x.dim() - (0 if shared else 1) - 1  # dimensions between M and d
        shape = (self.weight.shape[0],) + (1,) * extra + (d,)
        return torch.addcmul(self.bias.view(shape), x, self.weight.view(shape))  # bias + x * weight, one pass


def check_layer_neurons(kept_neurons: tuple[tuple[int, ...], ...], num_members: int, intermediate_size: int) -> None:
    """Raise ``ValueError`` unless ``kept_neurons`` has one entry per member, each a sorted list of unique neuron
    indices in ``[0, intermediate_size)`` (the range a layer's MLP knows; the config checks the rest)."""
    if len(kept_neurons) != num_members:
        raise ValueError(
            f"kept_neurons lists {len(kept_neurons)} members for a layer of {num_members}; give one per member"
        )
    for m, neurons in enumerate(kept_neurons):
        bad = [n for n in neurons if not 0 <= n < intermediate_size]
        if bad:
            raise ValueError(
                f"kept_neurons[{m}] has neuron indices {bad[:5]} outside [0, {intermediate_size}); this layer's MLP "
                f"has {intermediate_size} intermediate neurons: use masks made for this model"
            )


class HydraMLPBase(nn.Module):
    """What the fused MLPs share: the row chunking of ``forward`` and the *slim* layout.

    Full members (``spec.kept_neurons`` None): ``mlp_fusion="average"`` keeps one MLP for all members (no
    leading M axis), ``"per_member"`` one per member (a leading M axis); the subclass defines the parameters.

    Slim members (``spec.kept_neurons`` given: member m keeps ``k_m`` of the ``I`` intermediate neurons, 0
    allowed): member m's MLP is its own (with ``"average"``: its slice of the members' averaged MLP) over its
    kept neurons only, so multiply-adds and parameters follow ``K = k_1 + ... + k_M``. Packing, member-major
    as in ``HydraSelfAttention`` (``o_m = k_1 + ... + k_{m-1}``; ``g = 2`` for a gated MLP, else 1):
        fc1_weight ``(g*K, d)``: member m owns rows ``[g*o_m, g*(o_m + k_m))`` (gated: its ``k_m`` first-half
            rows, then its ``k_m`` second-half rows), fc1_bias ``(g*K,)``;
        fc2_weight ``(d, K)``: member m owns columns ``[o_m, o_m + k_m)``; fc2_bias ``(M, d)``.
    A member with no neuron adds only its output bias. Equal widths run as batched products over M; otherwise
    one product per member (never padded).
    Every subclass defines ``_mlp``, the full members' computation: shared MLP on ``(N, d)`` rows, or
    per-member MLP on ``(M, N, d)``.
    """

    # Rows per pass: beyond about this many rows the (rows, I) intermediate no longer stays in the CPU
    # cache between the two products and the activation (measured: -10 % time at 3072 rows).
    chunk_rows = 1024
    gated: bool = False  # fc1 computes [a; b] and the MLP is fc2(act(a) * b)

    def _init_parameters(self, spec: HydraLayerSpec, intermediate_size: int, bias: bool) -> None:
        """The parameters of ``intermediate_size`` neurons: slim (``spec.kept_neurons`` given), else one MLP
        (``mlp_fusion="average"``) or one per member (a leading M axis)."""
        self.slim = False
        if spec.kept_neurons is not None:
            self._init_slim(spec, intermediate_size, bias)
            return
        self.per_member = spec.mlp_fusion == "per_member"
        d, g = spec.hidden_size, 2 if self.gated else 1
        lead = (spec.num_members,) if self.per_member else ()
        self.fc1_weight = nn.Parameter(torch.empty(*lead, g * intermediate_size, d))
        self.fc1_bias = nn.Parameter(torch.empty(*lead, g * intermediate_size)) if bias else None
        self.fc2_weight = nn.Parameter(torch.empty(*lead, d, intermediate_size))
        self.fc2_bias = nn.Parameter(torch.empty(*lead, d)) if bias else None

    def _init_slim(self, spec: HydraLayerSpec, intermediate_size: int, bias: bool) -> None:
        """The slim parameters (see the class docstring) of ``spec.kept_neurons``."""
        M, d = spec.num_members, spec.hidden_size
        check_layer_neurons(spec.kept_neurons, M, intermediate_size)
        self.slim = True
        self.per_member = True
        self.kept_neurons = tuple(tuple(n) for n in spec.kept_neurons)
        self.intermediate_size = intermediate_size
        self.neuron_widths = tuple(len(n) for n in spec.kept_neurons)
        self.neuron_offsets = tuple(sum(self.neuron_widths[:m]) for m in range(M))
        K, g = sum(self.neuron_widths), 2 if self.gated else 1
        self.fc1_weight = nn.Parameter(torch.empty(g * K, d))
        self.fc1_bias = nn.Parameter(torch.empty(g * K)) if bias else None
        self.fc2_weight = nn.Parameter(torch.empty(d, K))
        self.fc2_bias = nn.Parameter(torch.empty(M, d)) if bias else None

    def _activate(self, x: torch.Tensor) -> torch.Tensor:
        """The intermediate activation: ``act(x)``, or ``act(a) * b`` with ``[a, b] = x`` for a gated MLP."""
        if not self.gated:
            return self.act(x)
        a, b = x.chunk(2, dim=-1)
        return self.act(a) * b

    def _slim_mlp(self, x: torch.Tensor) -> torch.Tensor:
        """Every member's MLP over its kept neurons: ``(M, N, d)`` -> ``(M, N, d)``."""
        M, N, d = x.shape
        widths, g = self.neuron_widths, 2 if self.gated else 1
        if widths[0] > 0 and len(set(widths)) == 1:  # equal widths: batched products over M
            k = widths[0]
            w1 = self.fc1_weight.view(M, g * k, d).transpose(1, 2)  # (M, d, g*k), a view
            b1 = None if self.fc1_bias is None else self.fc1_bias.view(M, g * k)
            h = self._drop(self._activate(_grouped(x, w1, b1)))  # (M, N, k)
            w2 = self.fc2_weight.view(d, M, k).permute(1, 2, 0)  # (M, k, d), a view
            return _grouped(h, w2, self.fc2_bias)  # (M, N, d)
        outs = []
        for m in range(M):
            lo, k = self.neuron_offsets[m], widths[m]
            bias = None if self.fc2_bias is None else self.fc2_bias[m]
            if k == 0:  # no neuron left: the MLP adds only its output bias
                outs.append(x.new_zeros(N, d) if bias is None else bias.expand(N, d))
                continue
            b1 = None if self.fc1_bias is None else self.fc1_bias[g * lo : g * (lo + k)]
            h = self._drop(self._activate(F.linear(x[m], self.fc1_weight[g * lo : g * (lo + k)], b1)))  # (N, k)
            outs.append(F.linear(h, self.fc2_weight[:, lo : lo + k], bias))  # (N, d)
        return torch.stack(outs)  # (M, N, d)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(M, B, T, d)`` -> ``(M, B, T, d)``. The averaged MLP sees all members' tokens in one
        product (its weights are read once for all members)."""
        M, d = hidden.shape[0], hidden.shape[-1]
        x = hidden.reshape(M, -1, d) if self.per_member else hidden.reshape(-1, d)  # (M, BT, d) or (M*BT, d)
        rows = x.shape[-2]
        mlp = self._slim_mlp if self.slim else self._mlp
        # one pass under torch.compile / torch.export: the row count depends on the (dynamic) batch and
        # sequence sizes, and a branch on it would pin them (a guard) in the compiled graph
        if is_tracing(hidden) or rows <= self.chunk_rows:
            return mlp(x).view(hidden.shape)
        out = torch.empty_like(x)
        for start in range(0, rows, self.chunk_rows):
            out[..., start : start + self.chunk_rows, :] = mlp(x[..., start : start + self.chunk_rows, :])
        return out.view(hidden.shape)


def _grouped(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``grouped_linear`` that also takes no bias: ``(M, N, in) x (M, in, out) [+ (M, out)]`` -> ``(M, N, out)``."""
    if bias is None:
        return torch.bmm(x, weight_t)
    return grouped_linear(x, weight_t, bias)


class HydraMLP(HydraMLPBase):
    """The feed-forward block: ``fc2(act(fc1(x)))``.

    ``mlp_fusion="average"``: one MLP shared by all members, its weights the members' average
    (``fc1_weight (I, d)``, ``fc1_bias (I,)``, ``fc2_weight (d, I)``, ``fc2_bias (d,)``).
    ``mlp_fusion="per_member"``: one MLP per member, the same names with a leading M axis, computed as
    batched products over M. Slim members (``spec.kept_neurons``): see ``HydraMLPBase``.
    """

    def __init__(self, spec: HydraLayerSpec) -> None:
        super().__init__()
        self.act = ACT2FN[spec.hidden_act]
        self._init_parameters(spec, spec.intermediate_size, bias=True)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """Shared MLP on ``(N, d)`` rows, or per-member MLP on ``(M, N, d)``."""
        if not self.per_member:
            return rows_linear(
                self.act(rows_linear(x, self.fc1_weight, self.fc1_bias)), self.fc2_weight, self.fc2_bias
            )
        x = self.act(grouped_linear(x, self.fc1_weight.transpose(1, 2), self.fc1_bias))  # (M, N, I)
        return grouped_linear(x, self.fc2_weight.transpose(1, 2), self.fc2_bias)  # (M, N, d)


class HydraGatedMLP(HydraMLPBase):
    """A gated MLP: ``fc2(drop(act(x A^T) * (x B^T)))`` where ``fc1_weight (2I, d)`` stacks ``[A; B]`` and
    ``fc2_weight (d, I)`` is the down projection: ModernBERT's GLU (``[W_in; W_gate]``, the rows of ``Wi``;
    ``Wo``), Llama's SwiGLU (``[gate_proj; up_proj]``; ``down_proj``).

    ``mlp_fusion="average"``: one MLP shared by all members, its weights the members' average;
    ``"per_member"``: the same names with a leading M axis, batched products over M. Biases only when the
    base has ``mlp_bias=True``. Slim members (``spec.kept_neurons``, indices of the ``I`` neurons): see
    ``HydraMLPBase``.
    """

    gated = True

    def __init__(self, spec: HydraLayerSpec, bias: bool, dropout: float) -> None:
        super().__init__()
        self.act = ACT2FN[spec.hidden_act]
        self.drop = nn.Dropout(dropout)
        self._init_parameters(spec, spec.intermediate_size, bias)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if not self.per_member:
            return rows_linear(x, weight, bias)  # (N, out)
        return _grouped(x, weight.transpose(1, 2), bias)  # (M, N, out)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """Shared MLP on ``(N, d)`` rows, or per-member MLP on ``(M, N, d)``."""
        h = self._linear(x, self.fc1_weight, self.fc1_bias)  # (..., 2I)
        return self._linear(self.drop(self._activate(h)), self.fc2_weight, self.fc2_bias)


class HydraMemberLinear(nn.Module):
    """M independent linear maps applied member-wise: ``weight (M, out, in)``, ``bias (M, out)``.

    Used for the per-member poolers, classifiers and projections. Input ``(M, ..., in)``.
    """

    def __init__(self, num_members: int, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_members, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(num_members, out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        M, n_in = x.shape[0], x.shape[-1]
        flat = x.reshape(M, -1, n_in)  # (M, N, in)
        if self.bias is None:
            out = torch.bmm(flat, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), flat, self.weight.transpose(1, 2))  # (M, N, out)
        return out.view(*x.shape[:-1], self.weight.shape[1])


# ------------------------------------------------------------------ layer specs, pre-LN layers (ViT family)
def layer_spec(
    kept_heads: list[list[list[int]]], layer_idx: int, *, hidden_size: int, num_heads: int, intermediate_size: int,
    hidden_act: str, layer_norm_eps: float, attention_dropout: float, hidden_dropout: float, mlp_fusion: str,
    kept_neurons: list[list[list[int]]] | None = None, head_size: int | None = None,
) -> HydraLayerSpec:
    """The spec of fused layer ``layer_idx`` from the members' ``kept_heads[m][l]``, their
    ``kept_neurons[m][l]`` (slim members; None or empty: every member keeps the whole MLP) and the base's sizes
    (``head_size``: where it is not ``hidden_size // num_heads``)."""
    return HydraLayerSpec(
        head_size=head_size,
        kept_neurons=tuple(tuple(member[layer_idx]) for member in kept_neurons) if kept_neurons else None,
        hidden_size=hidden_size,
        num_heads=num_heads,
        kept_heads=tuple(tuple(member[layer_idx]) for member in kept_heads),
        intermediate_size=intermediate_size,
        hidden_act=hidden_act,
        layer_norm_eps=layer_norm_eps,
        attention_dropout=attention_dropout,
        hidden_dropout=hidden_dropout,
        mlp_fusion=mlp_fusion,
    )


def base_layer_specs(config, base) -> list[HydraLayerSpec]:
    """Every fused layer's spec from a base config that uses BERT's names (``hidden_size``,
    ``num_attention_heads``, ``intermediate_size``, ``hidden_act``, ``layer_norm_eps``,
    ``attention_probs_dropout_prob``, ``hidden_dropout_prob``, ``num_hidden_layers``): BERT, RoBERTa,
    ELECTRA, ALBERT, ViT, DeiT, BEiT, DINOv2 and DeBERTa-v2."""
    return [
        layer_spec(
            config.kept_heads, i, hidden_size=base.hidden_size, num_heads=base.num_attention_heads,
            intermediate_size=base.intermediate_size, hidden_act=base.hidden_act, layer_norm_eps=base.layer_norm_eps,
            attention_dropout=base.attention_probs_dropout_prob, hidden_dropout=base.hidden_dropout_prob,
            mlp_fusion=config.mlp_fusion, kept_neurons=config.kept_neurons,
        )
        for i in range(base.num_hidden_layers)
    ]


class HydraPreLNLayer(GradientCheckpointingLayer):
    """A pre-LN transformer layer for M members (ViT, CLIP towers):
    ``h = h + Attn(LN1_m(h)); h = h + MLP(LN2_m(h))``, with member m's own LayerNorms and heads."""

    def __init__(self, config, spec: HydraLayerSpec, is_causal: bool = False) -> None:
        super().__init__()
        self.norm1 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.attention = HydraSelfAttention(config, spec, is_causal=is_causal)
        self.norm2 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.mlp = HydraMLP(spec)
        self.dropout = nn.Dropout(spec.hidden_dropout)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)``. Checkpointed (recomputed in the
        backward pass) after ``model.gradient_checkpointing_enable()``."""
        normed = self.norm1(hidden, shared=hidden.dim() == 3)  # (M, B, T, d): member m's own LayerNorm
        attn, weights = self.attention(normed, attention_mask, output_attentions)  # (M, B, T, d)
        hidden = hidden + self.dropout(attn)  # broadcasts a shared input over M
        hidden = hidden + self.dropout(self.mlp(self.norm2(hidden)))
        return hidden, weights


def drop_path(x: torch.Tensor, drop_prob: float, training: bool) -> torch.Tensor:
    """Stochastic depth for member streams ``x (M, B, ...)``: every (member, sample) drops its residual
    branch with probability ``drop_prob`` in training (scaled by ``1 / (1 - p)``), as each stock member
    would on its own. Identity in eval or when ``drop_prob`` is 0."""
    if drop_prob == 0.0 or not training:
        return x
    keep = 1.0 - drop_prob
    shape = x.shape[:2] + (1,) * (x.dim() - 2)  # (M, B, 1, 1)
    mask = torch.floor(torch.rand(shape, dtype=x.dtype, device=x.device) + keep)
    return x.div(keep) * mask


class HydraLayerScalePreLNLayer(HydraPreLNLayer):
    """A pre-LN layer with per-member layer scale and stochastic depth (BEiT, DINOv2):
    ``h = h + DropPath(lambda_1[m] * Attn(LN1_m(h))); h = h + DropPath(lambda_2[m] * MLP(LN2_m(h)))``.

    Args:
        layer_scale: keep ``lambda_1``, ``lambda_2`` of shape ``(M, d)`` (every member its own); False for
            a base without layer scale (BEiT with ``layer_scale_init_value == 0``).
        drop_path: the stochastic-depth probability of this layer (training only).
        mlp: a replacement for the ``HydraMLP`` the spec describes (e.g. DINOv2's SwiGLU MLP).
    """

    def __init__(
        self, config, spec: HydraLayerSpec, *, layer_scale: bool, drop_path: float = 0.0, mlp: nn.Module | None = None
    ) -> None:
        super().__init__(config, spec)
        if mlp is not None:
            self.mlp = mlp
        M, d = spec.num_members, spec.hidden_size
        self.lambda_1 = nn.Parameter(torch.ones(M, d)) if layer_scale else None
        self.lambda_2 = nn.Parameter(torch.ones(M, d)) if layer_scale else None
        self.drop_path = drop_path

    def _branch(self, x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """``(M, B, T, d)`` residual branch -> dropout, layer scale, stochastic depth."""
        x = self.dropout(x)
        if scale is not None:
            x = x * scale[:, None, None, :]  # member m's own lambda
        return drop_path(x, self.drop_path, self.training)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)``."""
        normed = self.norm1(hidden, shared=hidden.dim() == 3)  # (M, B, T, d)
        attn, weights = self.attention(normed, attention_mask, output_attentions)  # (M, B, T, d)
        hidden = hidden + self._branch(attn, self.lambda_1)  # broadcasts a shared input over M
        hidden = hidden + self._branch(self.mlp(self.norm2(hidden)), self.lambda_2)
        return hidden, weights


class LayerOutputs:
    """The hidden states and attention weights of one pass through the fused layers, collected so that
    every returned tensor is one the computation reads (as in transformers' models, ``retain_grad()`` on
    a returned hidden state or attention map receives its gradient). Every family's layer loop uses it::

        outs = LayerOutputs(embeddings, M, output_hidden_states or output_member_hidden_states, output_attentions)
        for layer in layers:
            outs.add(*layer(outs.input, mask))  # each layer returns (streams (M, B, T, d), weights)
        hidden = outs.streams()  # (M, B, T, d); after the final norm (if any), transposed to (B, M, T, d):
        fields = outs.output_fields(member_last, hidden_states=output_hidden_states,
                                    member_hidden_states=output_member_hidden_states)  # the output's fields

    ``input`` is the next layer's input: the shared embeddings ``(B, T, d)`` for the first layer, or the
    members' streams ``(M, B, T, d)``. With ``output_hidden_states`` the first layer reads
    ``member_hidden_states[0]`` (the embeddings expanded over the members, a stride-0 view) member by member,
    so member m's gradient lands in its own slot; the result equals the shared computation. Layer l's
    output is returned as ``member_hidden_states[l + 1] (B, M, T, d)``, and the next layer reads a view of it.
    ``attentions`` keeps the weights each layer returns (None, as sdpa gives, is left out).
    """

    def __init__(
        self, embeddings: torch.Tensor, num_members: int, output_hidden_states: bool, output_attentions: bool
    ) -> None:
        self.num_members = num_members
        self.embeddings = embeddings  # (B, T, d): the public hidden_states[0]
        self.input = embeddings  # shared until the first layer gives every member its own stream
        self.member_hidden_states: tuple[torch.Tensor, ...] | None = None  # (B, M, T, d) each
        self.attentions: tuple[torch.Tensor, ...] | None = () if output_attentions else None
        if output_hidden_states:
            B, T, d = embeddings.shape
            first = embeddings.unsqueeze(1).expand(B, num_members, T, d)  # (B, M, T, d), a view
            self.member_hidden_states = (first,)
            self.input = first.transpose(0, 1)  # (M, B, T, d): member m reads slot m

    def add(self, hidden: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Record a layer's output ``hidden (M, B, T, d)`` and ``weights (B, K, T, T)`` (or None)."""
        if self.attentions is not None and weights is not None:
            self.attentions += (weights,)
        if self.member_hidden_states is not None:
            public = hidden.transpose(0, 1)  # (B, M, T, d), a view
            self.member_hidden_states += (public,)
            hidden = public.transpose(0, 1)  # the next computation reads the returned tensor (a view)
        self.input = hidden

    def streams(self) -> torch.Tensor:
        """The members' streams after the last layer, ``(M, B, T, d)`` (a view of the last hidden state)."""
        hidden = self.input
        if hidden.dim() == 3:  # a tower with no layers
            hidden = hidden.unsqueeze(0).expand(self.num_members, *hidden.shape)
        return hidden

    def output_fields(
        self, member_last: torch.Tensor, tie_last: bool = False, hidden_states: bool = True,
        member_hidden_states: bool = False,
    ) -> dict[str, torch.Tensor | tuple | None]:
        """The hidden-state fields of a model's output (see ``HydraModelOutput``) from every member's final
        hidden states ``member_last (B, M, T, d)``: ``last_hidden_state (B, T, d)``, their mean, and of the
        per-layer streams this record holds (built with ``output_hidden_states``) the ones asked for:
        ``hidden_states`` (the call's ``output_hidden_states``): the per-layer ``hidden_states (B, T, d)`` (the
        shared embeddings, then the members' mean after every layer); ``member_hidden_states`` (the call's
        ``output_member_hidden_states``): every member's ``member_hidden_states (B, M, T, d)``. The standard
        flag adds only the standard field, as transformers' contract has it. ``tie_last``: the last hidden
        state is the final one (after the final norm), as transformers' ModernBERT and language models
        return it."""
        last = member_last.mean(dim=1)  # (B, T, d): the ensemble's choice, the members' mean
        fields = {"last_hidden_state": last, "member_last_hidden_state": member_last}
        member_hidden = self.member_hidden_states
        if member_hidden is not None:
            means = tuple(h.mean(dim=1) for h in member_hidden[1:])  # (B, T, d) after every layer
            hidden = (self.embeddings,) + means
            if tie_last:  # the same tensors, as transformers returns them
                member_hidden, hidden = member_hidden[:-1] + (member_last,), hidden[:-1] + (last,)
            if hidden_states:
                fields["hidden_states"] = hidden
            if member_hidden_states:
                fields["member_hidden_states"] = member_hidden
        return fields


def may_mask(attention_mask: torch.Tensor | None) -> bool:
    """Whether a ``(B, T)`` 1/0 padding mask has to be applied: False for None or (in eager mode) all ones.

    As transformers' own masking utilities do (``_ignore_bidirectional_mask_sdpa``): an all-ones mask is
    dropped so that SDPA can run its mask-free kernels, but never while ``torch.compile`` /
    ``torch.export`` trace the model, where looking at the mask's values would be data-dependent control
    flow (a graph break, or an export error); there the mask is always applied (same result).
    """
    if attention_mask is None:
        return False
    return is_tracing(attention_mask) or not bool(attention_mask.all())


def padding_mask_to_additive(
    attention_mask: torch.Tensor | None, dtype: torch.dtype, num_tokens: int
) -> torch.Tensor | None:
    """``(B, T)`` 1/0 padding mask -> additive ``(B, 1, 1, T)`` mask (0 keep, dtype-min drop).

    Returns None when nothing needs masking (see ``may_mask``), which lets SDPA use its fastest kernels.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[-1] != num_tokens:
        raise ValueError(
            f"attention_mask must have shape (batch, {num_tokens}) with 1 for tokens and 0 for padding, "
            f"got {tuple(attention_mask.shape)}"
        )
    if not may_mask(attention_mask):
        return None
    keep = attention_mask[:, None, None, :].to(dtype)  # (B, 1, 1, T)
    return (1.0 - keep) * torch.finfo(dtype).min


def ensemble_outputs(
    member_logits: torch.Tensor, labels: torch.Tensor | None, config
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ensemble ``logits (B, C)`` and the mean of the members' losses (None without labels).

    The problem type follows transformers' sequence classifiers: ``regression`` (``num_labels == 1``:
    mean of the members' outputs, MSE), ``single_label_classification`` (log-mean-softmax,
    cross-entropy) or ``multi_label_classification`` (mean of sigmoids, BCE).
    """
    num_members, num_labels = member_logits.shape[1], member_logits.shape[-1]
    if config.problem_type is None and labels is not None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    problem = config.problem_type or ("regression" if num_labels == 1 else "single_label_classification")
    if problem == "regression":
        logits = member_logits.mean(dim=1)
    elif problem == "multi_label_classification":
        logits = ensemble_sigmoid_logits(member_logits)
    else:
        logits = ensemble_log_probs(member_logits)
    if labels is None:
        return logits, None
    flat = member_logits.transpose(0, 1)  # (M, B, C)
    if problem == "regression":
        target = labels.to(member_logits.dtype).view(1, -1, num_labels).expand_as(flat)
        loss = F.mse_loss(flat, target)
    elif problem == "multi_label_classification":
        loss = F.binary_cross_entropy_with_logits(flat, labels.to(member_logits.dtype).unsqueeze(0).expand_as(flat))
    else:
        # mean over members of each member's mean cross-entropy
        loss = F.cross_entropy(flat.reshape(-1, num_labels), labels.view(1, -1).expand(num_members, -1).reshape(-1))
    return logits, loss


def init_hydra_weights(module: nn.Module, std: float) -> bool:
    """Initialise one fused Hydra module (``nn.init`` through transformers' ``initialization``, safe
    for loaded weights). Returns False for modules that are not Hydra modules."""
    if isinstance(module, HydraGroupedQueryAttention):
        for weight in (module.q_weight, module.k_weight, module.v_weight, module.o_weight):
            init.normal_(weight, mean=0.0, std=std)
        for bias in (module.q_bias, module.k_bias, module.v_bias, module.o_bias):
            if bias is not None:
                init.zeros_(bias)
        for norm in (module.q_norm, module.k_norm):  # Qwen3's per-head RMSNorms
            if norm is not None:
                init.ones_(norm)
    elif isinstance(module, HydraSelfAttention):
        init.normal_(module.qkv_weight, mean=0.0, std=std)
        init.normal_(module.o_weight, mean=0.0, std=std)
        init.zeros_(module.qkv_bias)
        init.zeros_(module.o_bias)
    elif isinstance(module, HydraMLPBase):
        init.normal_(module.fc1_weight, mean=0.0, std=std)
        init.normal_(module.fc2_weight, mean=0.0, std=std)
        for bias in (module.fc1_bias, module.fc2_bias):
            if bias is not None:
                init.zeros_(bias)
    elif isinstance(module, HydraLayerNorm):
        init.ones_(module.weight)
        init.zeros_(module.bias)
    elif isinstance(module, HydraMemberLinear):
        init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            init.zeros_(module.bias)
    else:
        return False
    return True


class HydraPreTrainedModel(PreTrainedModel):
    """What every fused model shares, so that a new family has it by inheriting this class: SDPA and
    eager attention (``HydraSelfAttention``), gradient checkpointing (every fused layer is a
    ``GradientCheckpointingLayer``: ``model.gradient_checkpointing_enable()`` recomputes each layer in the
    backward pass), the prefix of the fused encoder in a task model (``hydra``), and the base settings
    set on the config written into ``base_config`` before the family's code reads it."""

    base_model_prefix = "hydra"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = False
    # the losses are means over the batch: transformers' Trainer must divide them by the gradient accumulation
    # steps itself (a forward that takes **kwargs is otherwise taken to sum its loss over the
    # ``num_items_in_batch`` it is passed, and every accumulated update would be ``steps`` times too large)
    accepts_loss_kwargs = False

    base_config_class: type  # the base's transformers config class (``BertConfig``), set by the family

    def __init__(self, config, *args, **kwargs) -> None:
        # e.g. from_pretrained(folder, hidden_dropout_prob=0.2): the family reads base_config
        config.sync_base_settings()
        super().__init__(config, *args, **kwargs)

    @classmethod
    def base_config(cls, config):
        """The base configuration stored in ``config.base_config``, as an instance of ``base_config_class``."""
        return cls.base_config_class.from_dict(config.base_config)

    def init_family_weights(self, module: nn.Module, std: float) -> bool:
        """Initialise one of the family's own modules; True when that is all it needs, False for any other module
        (or one the fused modules' initialisation, ``init_hydra_weights``, completes)."""
        return False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The family's own modules (``init_family_weights``), the fused modules (``init_hydra_weights``), then
        transformers' ``Linear``, ``Conv2d``, ``Embedding`` and ``LayerNorm``, with the base's
        ``initializer_range``."""
        std = self.config.base_config.get("initializer_range", 0.02)
        if self.init_family_weights(module, std) or init_hydra_weights(module, std):
            return
        if isinstance(module, (nn.Linear, nn.Conv2d, nn.Embedding, nn.LayerNorm)):  # Conv2d: patch embeddings
            super()._init_weights(module)

    def resize_token_embeddings(self, *args, **kwargs) -> nn.Module:
        """transformers' ``resize_token_embeddings``; the new ``vocab_size`` is written into ``base_config``."""
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        self.config.sync_base_settings()
        return embeddings


# ==================================================================================================
# Post-LN text encoders (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT, ALBERT): the
# post-LN layer and the per-member classification head.
# ==================================================================================================
class HydraPostLNLayer(GradientCheckpointingLayer):
    """A post-LN encoder layer for M members: ``h = LN1_m(h + Attn(h)); h = LN2_m(h + MLP(h))``.

    ``attention_output_dropout`` / ``mlp_output_dropout``: whether the base applies its hidden dropout to
    the attention / MLP output before the residual sum (BERT, RoBERTa, ELECTRA: both; DistilBERT: not
    the attention output; ALBERT: not the MLP output). Dropout is off in eval mode either way.
    """

    def __init__(
        self, config, spec: HydraLayerSpec, *, attention_output_dropout: bool = True, mlp_output_dropout: bool = True
    ) -> None:
        super().__init__()
        self.attention = HydraSelfAttention(config, spec)
        self.norm1 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.mlp = HydraMLP(spec)
        self.norm2 = HydraLayerNorm(spec.num_members, spec.hidden_size, spec.layer_norm_eps)
        self.attention_dropout = nn.Dropout(spec.hidden_dropout if attention_output_dropout else 0.0)
        self.mlp_dropout = nn.Dropout(spec.hidden_dropout if mlp_output_dropout else 0.0)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden (M, B, T, d)`` or shared ``(B, T, d)`` -> ``(M, B, T, d)``. Checkpointed after
        ``model.gradient_checkpointing_enable()``."""
        attn, weights = self.attention(hidden, attention_mask, output_attentions)  # (M, B, T, d)
        hidden = self.norm1(self.attention_dropout(attn) + hidden)  # broadcasts a shared input over M
        hidden = self.norm2(self.mlp_dropout(self.mlp(hidden)) + hidden)
        return hidden, weights


class HydraClassificationHead(nn.Module):
    """Every member's two-layer classification head on its first token: ``out_proj(act(dense(x)))``.

    ``dropout_first=True`` (RoBERTa, ELECTRA): dropout before ``dense`` and before ``out_proj``;
    ``False`` (DistilBERT's ``pre_classifier`` + ``classifier``): only before ``out_proj``.
    Parameters ``dense.weight (M, d, d)``, ``out_proj.weight (M, C, d)`` and their biases.
    """

    def __init__(
        self, num_members: int, hidden_size: int, num_labels: int, activation: str, dropout: float,
        dropout_first: bool = True,
    ) -> None:
        super().__init__()
        self.dense = HydraMemberLinear(num_members, hidden_size, hidden_size)
        self.out_proj = HydraMemberLinear(num_members, hidden_size, num_labels)
        self.act = ACT2FN[activation]
        self.dropout = nn.Dropout(dropout)
        self.dropout_first = dropout_first

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``features (M, B, d)`` (every member's first token) -> ``member logits (M, B, C)``."""
        x = self.dropout(features) if self.dropout_first else features
        x = self.dropout(self.act(self.dense(x)))
        return self.out_proj(x)
